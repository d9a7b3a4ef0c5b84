"""The turn signal: one turn's live abort flag, and the cancel causes it takes.

A cancel (a verb, a listener, a disposal) aborts the open turn's :class:`TurnSignal`
with a :data:`CancelCause`; the cause is checked where it enters
(:func:`checked_cause`) because it is logged in the turn's ``turn/end``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

import msgspec

from storage import (
    JSON_BYTES_PER_CHAR,
    MAX_CAUSE_REASON_CHARS,
    CancelCause,
    DisposedCause,
    HookCause,
    ParentCause,
    UserCause,
)

from .errors import InvalidMessageError

__all__ = ["TurnSignal", "checked_cause", "loggable_cause"]

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
