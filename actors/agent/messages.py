"""Every message an agent actor handles: one tagged union, :data:`AgentMessage`.

The runtime's verbs send the public ones (``Insert`` ... ``Kill``); the actor tells
itself the completions of the effects it started (``Resume`` ... ``ToolDone``).
``AgentActor`` handles them all in one ``match`` (its ``_dispatch``). They are
``msgspec.Struct``\\s for their cheap construction and the common tag; they are never
encoded, so a field may hold a callback, an exception or a handle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeAlias

import msgspec

from storage import CancelCause, InboxLane, MessageId, UserMessage

from ..inbox import Inbox
from ..signal import TurnSignal
from ..streams import StreamHandle, ToolHandle

__all__ = [
    "AgentMessage",
    "Announce",
    "AwaitIdle",
    "Barrier",
    "Cancel",
    "Control",
    "Edit",
    "Flushed",
    "Insert",
    "Kill",
    "Quiescent",
    "Resume",
    "StreamReady",
    "ToolDone",
    "apply_edit",
]


class Control(msgspec.Struct, frozen=True, tag=True):
    """Base of every agent actor message (tagged by class name): what the actor
    handles itself rather than passing on to pykka (proxy calls, stop)."""


class Insert(Control, frozen=True):
    """Put a reserved message into a lane; ``wake`` starts a turn when idle.

    ``unwinding``: the sender saw an aborted turn still open when it sent this wake; if
    that turn is still unwinding, the wake is forced to ``next-turn`` and latched.
    ``inserted``: the sender (one of the agent's own listeners, on its actor) put the
    message into the inbox itself; only the wake is left to handle.
    """

    lane: InboxLane
    message: UserMessage
    wake: bool
    unwinding: bool = False
    inserted: bool = False


class Edit(Control, frozen=True):
    """A supervisor's inbox edit; answered through ``ask``. ``splice`` is the general
    form: in ``lane``, remove ``removed_count`` messages from ``start`` and insert
    ``messages`` (reserved) there. ``reused``: the ids of inserted messages that were
    pending, among those the edit removes, when it was sent (not reserved again: see
    ``Inbox.reserve_all``)."""

    op: Literal["remove", "replace", "clear", "splice"]
    message_id: MessageId | None = None
    message: UserMessage | None = None
    lane: InboxLane = "next-turn"
    start: int = 0
    removed_count: int = 0
    messages: tuple[UserMessage, ...] = ()
    reused: frozenset[MessageId] = frozenset()


class Cancel(Control, frozen=True):
    """``target``: the turn that was active when cancel was called (already aborted in
    the caller's thread), or None if none was: then the turn active now is aborted."""

    cause: CancelCause
    keep_inbox: bool = False
    target: TurnSignal | None = None


class Announce(Control, frozen=True):
    """Ask: call ``callback`` on the actor. The runtime sends it as a new agent's first
    message, to announce it there (``agent/created``, then ``agent/session-start``):
    whatever the listeners of those send waits in the mailbox behind it, so no work
    starts before both are announced (CONTRACT 2)."""

    callback: Callable[[], None]


class Quiescent(Control, frozen=True):
    """Tell: call ``callback`` (on the actor) with True when the agent is idle with
    nothing queued (it may be passivated), else False."""

    callback: Callable[[bool], None]


class AwaitIdle(Control, frozen=True):
    """Call ``callback`` once every envelope sent before this one ran and the agent is idle."""

    callback: Callable[[], None]


class Barrier(Control, frozen=True):
    """Ask: answered once every envelope sent before it ran, so the facts of every
    message told before it (a send's splice, a cancel's discards) are appended
    (``Runtime.flush`` waits for it)."""


class Kill(Control, frozen=True):
    """Crash the actor on purpose (fault injection for supervisors and their tests)."""

    reason: str = "killed"


class Resume(Control, frozen=True):
    """An awaited effect's outcome (an admission, a checkpoint, async work, a sleep),
    for the wait that took ``token``."""

    token: int
    error: BaseException | None = None
    value: Any = None


class Flushed(Control, frozen=True):
    """A Flush effect's completion. Flush is not abortable and the turn awaits one
    effect at a time, so a completion always answers the Flush being waited for."""

    error: BaseException | None = None


class StreamReady(Control, frozen=True):
    """A model stream announced its items up to ``upto``."""

    stream: StreamHandle
    upto: int


class ToolDone(Control, frozen=True):
    """A started tool finished."""

    handle: ToolHandle


AgentMessage: TypeAlias = (
    Resume
    | Flushed
    | StreamReady
    | ToolDone
    | Insert
    | Cancel
    | AwaitIdle
    | Edit
    | Quiescent
    | Barrier
    | Announce
    | Kill
)
"""Every message of an agent actor, the hottest first (the order ``_dispatch`` tries)."""


def apply_edit(inbox: Inbox, edit: Edit) -> Any:
    """Apply a supervisor's inbox edit (on the actor, or inline from one of its own
    listeners); ids the edit reserved are released if it fails."""
    if edit.op == "remove":
        assert edit.message_id is not None
        return inbox.remove(edit.message_id)
    if edit.op == "replace":
        assert edit.message_id is not None
        assert edit.message is not None
        try:
            inbox.replace(edit.message_id, edit.message, reused=edit.reused)
        except Exception:
            if edit.message.id not in edit.reused:  # a reused id is not the edit's to free
                inbox.release(edit.message.id)
            raise
        return None
    if edit.op == "splice":
        try:
            return inbox.splice(
                edit.lane, edit.start, edit.removed_count, edit.messages, reused=edit.reused
            )
        except Exception:
            for message in edit.messages:
                if message.id not in edit.reused:
                    inbox.release(message.id)
            raise
    return inbox.clear()
