"""The live ``agent/*`` and ``tools/*`` vocabulary: payloads, decisions, the turn signal.

A live event always carries the live agent handle (``agent``), which the runtime layer
supplies; ``actors`` only knows it as an opaque :class:`AgentLike`. Durable facts are
never mirrored here: turn and step boundaries, messages and chunks are read off
``session/event``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias

import msgspec

from storage import (
    JSON_BYTES_PER_CHAR,
    MAX_CAUSE_REASON_CHARS,
    CancelCause,
    DisposedCause,
    HookCause,
    LlmFailure,
    ParentCause,
    TurnEndReason,
    UserCause,
    UserMessage,
)

from .errors import InvalidMessageError

__all__ = [
    "AGENT_EVENTS",
    "MAX_CAUSE_REASON_CHARS",
    "MAX_RETRY_DELAY_S",
    "WATERFALL_EVENTS",
    "AgentCreated",
    "AgentDisposed",
    "AgentError",
    "AgentLike",
    "AgentSessionStart",
    "AgentSettled",
    "AgentStatus",
    "AgentStatusChanged",
    "Allow",
    "Deny",
    "Enter",
    "InboxClaimed",
    "InboxDiscarded",
    "InboxInserted",
    "PostExecute",
    "PreExecute",
    "PreStep",
    "PreStepDecision",
    "Reject",
    "RequestError",
    "RequestEvent",
    "Retry",
    "SessionEventLive",
    "ToolExecute",
    "ToolResultEvent",
    "TurnSignal",
    "TurnStopping",
    "checked_cause",
    "loggable_cause",
    "retry_delay_problem",
]

AgentStatus: TypeAlias = Literal["idle", "running"]


class AgentLike(Protocol):
    """What ``actors`` needs of the runtime's agent handle."""

    @property
    def id(self) -> str: ...


class _Live(msgspec.Struct, frozen=True, kw_only=True):
    """Base of live payloads: attributes are the CONTRACT payload fields."""

    agent: AgentLike


class AgentCreated(_Live, frozen=True):
    pass


class AgentSessionStart(_Live, frozen=True):
    source: Literal["startup", "resume"]


class AgentDisposed(_Live, frozen=True):
    pass


class AgentStatusChanged(_Live, frozen=True):
    status: AgentStatus


class InboxInserted(_Live, frozen=True):
    message: UserMessage
    target: Literal["next-turn", "next-step"]


class InboxClaimed(_Live, frozen=True):
    message: UserMessage
    turn: int


class InboxDiscarded(_Live, frozen=True):
    message: UserMessage


class AgentSettled(_Live, frozen=True):
    turn: int
    reason: TurnEndReason


class SessionEventLive(_Live, frozen=True):
    """``session/event``: one committed fact of this agent's session."""

    event: Any


class AgentError(_Live, frozen=True):
    turn: int
    step: int | None
    error: LlmFailure


_CAUSE_TYPES: Final = (UserCause, ParentCause, HookCause, DisposedCause)
_CAUSE_ENCODER: Final = msgspec.json.Encoder()
_CAUSE_DECODER: Final = msgspec.json.Decoder(CancelCause)


def checked_cause(cause: object) -> CancelCause:
    """``cause`` as a well-typed :data:`CancelCause` (a msgspec round trip: msgspec does
    not check at construction, and an ill-typed cause would be logged in ``turn/end``
    and never read back), or :class:`InvalidMessageError` naming what is wrong: not one
    of the four cause structs, a ``reason`` that is not a ``str`` (or not UTF-8: a lone
    surrogate), or one over :data:`MAX_CAUSE_REASON_CHARS` characters."""
    if not isinstance(cause, _CAUSE_TYPES):
        raise InvalidMessageError(
            "a cancel cause is UserCause(), ParentCause(), HookCause(reason=str) or "
            f"DisposedCause(), got {cause!r}"
        )
    if isinstance(cause, HookCause):
        reason: object = cause.reason
        if not isinstance(reason, str):
            raise InvalidMessageError(f"HookCause.reason is a str, got {reason!r}")
        if len(reason) > MAX_CAUSE_REASON_CHARS:
            raise InvalidMessageError(
                f"HookCause.reason holds {len(reason)} characters, over the limit of "
                f"{MAX_CAUSE_REASON_CHARS}; give a short reason (it is logged in turn/end)"
            )
    try:
        return _CAUSE_DECODER.decode(_CAUSE_ENCODER.encode(cause))
    except (UnicodeError, TypeError, ValueError, msgspec.MsgspecError) as err:
        raise InvalidMessageError(f"the cancel cause {cause!r} cannot be logged: {err}") from err


def loggable_cause(cause: object, max_bytes: int) -> CancelCause:
    """Defence in depth for ``turn/end``: ``cause`` if it is a well-typed cause whose
    reason takes at most ``max_bytes`` (JSON), else the nearest one that is: the bare
    kind of a plain cause, a ``HookCause`` whose reason is cut (UTF-8-safe), or one
    naming what the cause held. The verbs check a cause where it enters
    (:func:`checked_cause`); this meets only one changed after that
    (``msgspec.structs.force_setattr``) or one that never went through them."""
    try:
        checked: CancelCause | None = checked_cause(cause)
    except InvalidMessageError:
        checked = None
    if isinstance(checked, HookCause):
        if len(_CAUSE_ENCODER.encode(checked.reason)) <= max_bytes:
            return checked
        text = checked.reason
    elif checked is not None:
        return checked
    else:
        try:
            kind, reason = getattr(cause, "kind", None), getattr(cause, "reason", None)
        except Exception:  # noqa: BLE001 - a hostile object: its kind is unknown
            kind = reason = None
        for plain in (UserCause, ParentCause, DisposedCause):
            if kind == plain.__struct_config__.tag:
                return plain()
        if isinstance(reason, str):
            text = reason
        else:
            try:
                shown = repr(reason if kind == "hook" else cause)
            except Exception:  # noqa: BLE001 - a hostile __repr__
                shown = f"<{type(cause).__name__}>"
            text = f"an unloggable cancel cause: {shown}"
    budget = max(0, max_bytes)
    text = text[:budget].encode("utf-8", "replace").decode("utf-8")  # a lone surrogate: "?"
    if len(_CAUSE_ENCODER.encode(text)) > budget:  # an escape takes up to 6 bytes
        text = text[: budget // JSON_BYTES_PER_CHAR]
    return HookCause(reason=text)


class TurnSignal:
    """The live abort signal of one turn. First cause wins; thread-safe.

    Invariant: once ``aborted`` is true it never becomes false, and ``reason`` never
    changes.
    """

    __slots__ = ("_callbacks", "_reason", "aborted", "chain")

    # One lock for every signal (aborts and abort callbacks are rare): a turn does not
    # allocate one.
    _lock = threading.Lock()

    def __init__(self, retrying: TurnSignal | None = None) -> None:
        self._reason: CancelCause | None = None
        self._callbacks: list[Callable[[CancelCause], object]] = []
        # A plain attribute (read several times per step): set once, with ``_reason``.
        self.aborted = False
        # The signal of the first turn of a retry chain (None: this turn begins one). A
        # retry turn's signal (``retrying`` the failed turn's) is aborted with any
        # earlier signal of its chain: a cancel aimed at the failed turn, which lands
        # once the retry turn opened, aborts the retry turn.
        self.chain: TurnSignal | None = None
        if retrying is not None:
            self.chain = retrying.chain or retrying
            retrying.on_abort(self.abort)

    def in_chain_of(self, other: TurnSignal) -> bool:
        """Whether this signal and ``other`` belong to turns of one retry chain."""
        return (self.chain or self) is (other.chain or other)

    @property
    def reason(self) -> CancelCause | None:
        return self._reason

    def abort(self, cause: CancelCause) -> bool:
        """Abort with ``cause``; returns False if an earlier cause already won. A cause
        that is not a well-typed :data:`CancelCause` (see :func:`checked_cause`) raises
        :class:`InvalidMessageError` and aborts nothing."""
        cause = checked_cause(cause)
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = cause
            self.aborted = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(cause)
        return True

    def on_abort(self, callback: Callable[[CancelCause], object]) -> None:
        """Call ``callback(cause)`` when aborted (at once if it already is)."""
        with self._lock:
            if self._reason is None:
                self._callbacks.append(callback)
                return
            cause = self._reason
        callback(cause)


class PreStep(_Live, frozen=True):
    """``agent/pre-step``: ``messages`` is the claimed batch, a tuple of immutable
    messages; a listener enters a different batch by returning ``Enter``."""

    messages: tuple[UserMessage, ...]
    turn: int
    step: int
    signal: TurnSignal


class Enter(msgspec.Struct, frozen=True, tag="enter", tag_field="kind"):
    """Enter the step with exactly ``messages`` (authoritative: may be rewritten)."""

    messages: Sequence[UserMessage]


class Reject(msgspec.Struct, frozen=True, tag="reject", tag_field="kind"):
    """End the turn ``blocked`` without a step."""

    reason: str | None = None


PreStepDecision: TypeAlias = Enter | Reject


class RequestEvent(_Live, frozen=True):
    turn: int
    step: int
    signal: TurnSignal


class RequestError(_Live, frozen=True):
    turn: int
    step: int
    error: BaseException
    failure: LlmFailure
    prior_failures: Sequence[LlmFailure]
    signal: TurnSignal


MAX_RETRY_DELAY_S: Final = 86_400.0
"""The longest wait before a retry turn a :class:`Retry` may ask for (one day: a longer
one is almost surely a unit mistake, milliseconds given as seconds)."""


def retry_delay_problem(delay: object) -> str | None:
    """What is wrong with ``delay`` as a ``Retry.delay_s`` (None: nothing)."""
    if delay is None:
        return None
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        return f"delay_s is a number of seconds or None, got {delay!r}"
    if not 0 <= delay <= MAX_RETRY_DELAY_S:  # NaN fails both comparisons
        return f"delay_s is a number of seconds from 0 to {MAX_RETRY_DELAY_S:g}, got {delay!r}"
    return None


class Retry(msgspec.Struct, frozen=True, tag="retry", tag_field="kind"):
    """Returned from ``agent/request-error`` by the listener that owns recovery: open a
    retry turn after ``delay_s`` seconds (None: at once). ``delay_s`` is a finite number
    from 0 to :data:`MAX_RETRY_DELAY_S`; anything else raises ``ValueError`` (or
    ``TypeError``) here, in the listener, whose turn then ends ``error`` without a retry."""

    delay_s: float | None = None

    def __post_init__(self) -> None:
        problem = retry_delay_problem(self.delay_s)
        if problem is not None:
            number = isinstance(self.delay_s, int | float) and not isinstance(self.delay_s, bool)
            raise (ValueError if number else TypeError)(f"Retry: {problem}")


class TurnStopping(_Live, frozen=True):
    turn: int
    step: int
    signal: TurnSignal


class PreExecute(_Live, frozen=True):
    turn: int
    step: int
    call_id: str
    name: str
    arguments: Any
    signal: TurnSignal


class Allow(msgspec.Struct, frozen=True, tag="allow", tag_field="kind"):
    """A ``tools/pre-execute`` decision: the call may run (what ``next()`` returns when
    no later listener denies it)."""


class Deny(msgspec.Struct, frozen=True, tag="deny", tag_field="kind"):
    """A ``tools/pre-execute`` decision: the call does not run; its result is the error
    ``TOOL_DENIED`` with ``reason`` as the message the model reads."""

    reason: str


class ToolExecute(_Live, frozen=True):
    turn: int
    step: int
    call_id: str
    name: str
    arguments: Any


class PostExecute(_Live, frozen=True):
    """``tools/post-execute``: return a replacement ``output`` (or this event's)."""

    turn: int
    step: int
    call_id: str
    name: str
    arguments: Any
    output: Any
    error: str | None


class ToolResultEvent(_Live, frozen=True):
    turn: int
    step: int
    call_id: str
    name: str
    seq: int
    is_error: bool


AGENT_EVENTS: Final = frozenset(
    {
        "agent/created",
        "agent/session-start",
        "agent/disposed",
        "agent/status",
        "agent/inbox/inserted",
        "agent/inbox/claimed",
        "agent/inbox/discarded",
        "agent/pre-step",
        "agent/request",
        "agent/request-error",
        "agent/turn-stopping",
        "agent/settled",
        "agent/error",
        "tools/pre-execute",
        "tools/execute",
        "tools/post-execute",
        "tools/result",
        "session/event",
    }
)
"""Every live event name the runtime emits (a typo in ``on()`` is refused)."""

WATERFALL_EVENTS: Final = frozenset(
    {
        "agent/pre-step",
        "agent/request",
        "agent/request-error",
        "tools/pre-execute",
        "tools/execute",
        "tools/post-execute",
    }
)
"""The live events whose listeners are middleware, called ``(event, next)``; those of
every other event are called ``(event)``."""
