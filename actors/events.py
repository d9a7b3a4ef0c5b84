"""The live ``agent/*`` and ``tools/*`` vocabulary: event payloads and listener decisions.

A live event always carries the live agent handle (``agent``), which the runtime layer
supplies; ``actors`` only knows it as an opaque :class:`AgentLike`. Durable facts are
never mirrored here: turn and step boundaries, messages and chunks are read off
``session/event``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias

import msgspec

from storage import (
    LlmFailure,
    TurnEndReason,
    UserMessage,
)

from .signal import TurnSignal

__all__ = [
    "AGENT_EVENTS",
    "MAX_RETRY_DELAY_S",
    "WATERFALL_EVENTS",
    "AgentCreated",
    "AgentDisposed",
    "AgentError",
    "AgentLike",
    "AgentRestart",
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
    "SessionFlush",
    "ToolExecute",
    "ToolResultEvent",
    "TurnStopping",
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


class AgentRestart(_Live, frozen=True):
    """``agent/restart``: what the supervision of a crashed agent (``spawn(restart=...)``)
    did. ``kind``: ``restarted`` (``agent`` is the new handle, resumed from the log),
    ``restart-failed`` (the resume raised: ``error``), ``gave-up`` (past the policy's
    limit: the agent stays down; ``agent`` is the crashed handle). ``restarts`` counts
    the restarts so far; ``error`` is why it crashed (or why the restart failed);
    ``interrupted_turn`` the turn the crash cut short, closed ``interrupted`` by the
    resume (None if it was idle)."""

    kind: Literal["restarted", "restart-failed", "gave-up"]
    restarts: int
    error: str = ""
    interrupted_turn: int | None = None


class SessionEventLive(_Live, frozen=True):
    """``session/event``: one committed fact of this agent's session."""

    event: Any


class SessionFlush(_Live, frozen=True):
    """``session/flush``: a durability checkpoint of this agent's session passed. Every
    fact from ``first_seq`` to ``last_seq`` (inclusive; those appended since the previous
    checkpoint) is durable on disk."""

    first_seq: int
    last_seq: int


class AgentError(_Live, frozen=True):
    turn: int
    step: int | None
    error: LlmFailure


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
        "agent/restart",
        "tools/pre-execute",
        "tools/execute",
        "tools/post-execute",
        "tools/result",
        "session/event",
        "session/flush",
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
