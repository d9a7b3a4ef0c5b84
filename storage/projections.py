"""Projections over a session log: turn state, model-visible history, inbox, repair, fork.

Each projection exists twice: as an incremental object with ``apply(event)`` (what a
:class:`~storage.session.Session` keeps up to date, O(1) per append) and as a pure
function over a list of events (what tools, tests and the store use). The pure
functions fold the incremental objects, so both always agree.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from types import MappingProxyType, MethodType
from typing import Final, NamedTuple

import msgspec

from storage.errors import ForkBoundaryError, InvalidEventError
from storage.events import (
    SURFACE_TYPES,
    AgentInboxSpliced,
    AssistantMessageData,
    Event,
    Interrupted,
    Message,
    RequestHeader,
    StepEnd,
    StepStart,
    SurfaceReplace,
    TextBlock,
    ToolCallBlock,
    ToolCallData,
    ToolError,
    ToolMessage,
    ToolResultData,
    TurnEnd,
    TurnStart,
    UserMessage,
)

__all__ = [
    "TOOL_NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN",
    "TURN_TYPES",
    "InboxProjection",
    "SurfaceProjection",
    "TurnState",
    "TurnTracker",
    "derive_messages",
    "fork_prefix",
    "pending_inbox",
    "repair_plan",
    "turn_state",
]

TOOL_NOT_STARTED: Final = "TOOL_NOT_STARTED"
TOOL_OUTCOME_UNKNOWN: Final = "TOOL_OUTCOME_UNKNOWN"

_SEQ = attrgetter("seq")


# --------------------------------------------------------------------------- turn state


@dataclass(frozen=True, slots=True)
class TurnState:
    """Where a session stands in its turn/step structure (a frozen snapshot)."""

    last_turn: int = 0
    """Highest turn number started, 0 if none. Turn numbers continue across resume/fork."""
    open_turn: int | None = None
    """The turn started and not yet ended, if any."""
    open_step: int | None = None
    """The step of the open turn started and not yet ended, if any."""
    last_step: int = 0
    """Highest step number started in the open turn (0 when no turn is open)."""
    open_calls: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """``tool/call`` seq by call id, for calls of the open step with no ``tool/result``
    (read-only)."""
    last_header: RequestHeader | None = None
    """The latest ``request/header``: a new request needs a new one only if it differs."""
    open_turn_seq: int | None = None
    """Seq of the open turn's ``turn/start``."""

    @property
    def is_open(self) -> bool:
        return self.open_turn is not None


class TurnTracker:
    """Incremental :class:`TurnState`: feed every event to :meth:`apply`, in seq order.

    Lenient by design: an out-of-order boundary updates the state as best it can (the
    invariant checker, not the projection, reports malformed logs).
    """

    __slots__ = (
        "_snapshot",
        "last_header",
        "last_step",
        "last_turn",
        "open_calls",
        "open_step",
        "open_turn",
        "open_turn_seq",
    )

    def __init__(self) -> None:
        self.last_turn = 0
        self.open_turn: int | None = None
        self.open_turn_seq: int | None = None
        self.open_step: int | None = None
        self.last_step = 0
        self.open_calls: dict[str, int] = {}
        self.last_header: RequestHeader | None = None
        self._snapshot: TurnState | None = None

    def apply(self, event: Event) -> None:
        handler = _TURN_HANDLERS.get(event.type)
        if handler is not None:
            handler(self, event)

    def handler(self, type: str) -> Callable[[Event], None] | None:
        """:meth:`apply` for events of ``type`` only, one call less (``None``: such
        events change nothing)."""
        handler = _TURN_HANDLERS.get(type)
        return None if handler is None else MethodType(handler, self)

    @staticmethod
    def update_for(type: str) -> Callable[[TurnTracker, Event], None] | None:
        """The unbound :meth:`apply` for events of ``type`` only (``None``: such events
        change nothing), for a table shared by many trackers."""
        return _TURN_HANDLERS.get(type)

    def snapshot(self) -> TurnState:
        """The current state; cached until the next state-changing event."""
        if self._snapshot is None:
            self._snapshot = TurnState(
                last_turn=self.last_turn,
                open_turn=self.open_turn,
                open_step=self.open_step,
                last_step=self.last_step,
                open_calls=MappingProxyType(dict(self.open_calls)),
                last_header=self.last_header,
                open_turn_seq=self.open_turn_seq,
            )
        return self._snapshot

    # The handlers: each one changes the state (and drops the cached snapshot).

    def _turn_start(self, event: Event) -> None:
        self._snapshot = None
        data: TurnStart = event.data
        self.last_turn = max(self.last_turn, data.turn)
        self.open_turn = data.turn
        self.open_turn_seq = event.seq
        self.open_step = None
        self.last_step = 0
        self.open_calls = {}

    def _turn_end(self, event: Event) -> None:
        self._snapshot = None
        self.open_turn = self.open_turn_seq = self.open_step = None
        self.last_step = 0
        self.open_calls = {}

    def _step_start(self, event: Event) -> None:
        self._snapshot = None
        data: StepStart = event.data
        self.open_step = data.step
        self.last_step = max(self.last_step, data.step)
        self.open_calls = {}

    def _step_end(self, event: Event) -> None:
        self._snapshot = None
        self.open_step = None
        self.open_calls = {}

    def _tool_call(self, event: Event) -> None:
        self._snapshot = None
        self.open_calls[event.data.call_id] = event.seq

    def _tool_result(self, event: Event) -> None:
        self._snapshot = None
        self.open_calls.pop(event.data.message.call_id, None)

    def _header(self, event: Event) -> None:
        self._snapshot = None
        self.last_header = event.data


_TURN_HANDLERS: Final[dict[str, Callable[[TurnTracker, Event], None]]] = {
    "turn/start": TurnTracker._turn_start,
    "turn/end": TurnTracker._turn_end,
    "step/start": TurnTracker._step_start,
    "step/end": TurnTracker._step_end,
    "tool/call": TurnTracker._tool_call,
    "tool/result": TurnTracker._tool_result,
    "request/header": TurnTracker._header,
}

TURN_TYPES: Final = frozenset(_TURN_HANDLERS)
"""The event types that change a :class:`TurnTracker` (the others may skip ``apply``)."""


def turn_state(events: Iterable[Event]) -> TurnState:
    tracker = TurnTracker()
    for event in events:
        tracker.apply(event)
    return tracker.snapshot()


# --------------------------------------------------------------------------- surface


class SurfaceProjection:
    """Incremental model-visible history, built only from the three surface facts.

    ``surfaceOp: append`` adds the event's message; ``replace(seq)`` swaps the message
    written by the surface event at ``seq`` (which may itself have been a replace: both
    the original and every replacement name the same slot).
    """

    __slots__ = ("_aliases", "_messages", "_origins")

    def __init__(self) -> None:
        self._messages: list[Message] = []
        # The seq that appended each slot, increasing; 8 bytes each (not an int object):
        # the projection lives as long as its agent and grows with every message.
        self._origins = array("q")
        self._aliases: dict[int, int] = {}  # seq of a replacing event -> slot

    def __len__(self) -> int:
        return len(self._messages)

    def slot_of(self, seq: int) -> int | None:
        """The history position written by the surface event at ``seq``, if any."""
        index = bisect_left(self._origins, seq)
        if index < len(self._origins) and self._origins[index] == seq:
            return index
        return self._aliases.get(seq)

    def check(self, event: Event) -> None:
        """Raise :class:`InvalidEventError` if ``event`` cites seqs it may not cite."""
        data = event.data
        for cited in data.source_event_seqs:
            if not 0 <= cited < event.seq:
                raise InvalidEventError(
                    f"{event.type!r} event seq {event.seq} at $.data.sourceEventSeqs: "
                    f"expected earlier seqs of this session, found {cited}"
                )
        op = data.surface_op
        if type(op) is SurfaceReplace and (op.seq >= event.seq or self.slot_of(op.seq) is None):
            raise InvalidEventError(
                f"{event.type!r} event seq {event.seq} at $.data.surfaceOp.seq: expected an "
                "earlier user/message, assistant/message or tool/result of this session, "
                f"found {op.seq}"
            )

    def apply(self, event: Event) -> None:
        """Apply a surface event already accepted by :meth:`check`."""
        data = event.data
        op = data.surface_op
        if type(op) is SurfaceReplace:
            slot = self.slot_of(op.seq)
            if slot is None:
                raise InvalidEventError(f"seq {event.seq}: replace target {op.seq} not found")
            self._messages[slot] = data.message
            self._aliases[event.seq] = slot
        else:
            self._messages.append(data.message)
            self._origins.append(event.seq)

    def messages(self) -> list[Message]:
        """A new list of the current model-visible history."""
        return list(self._messages)


def derive_messages(events: Iterable[Event]) -> list[Message]:
    """The model-visible history of ``events`` (surface facts only, in seq order)."""
    surface = SurfaceProjection()
    for event in events:
        if event.type in SURFACE_TYPES:
            surface.check(event)
            surface.apply(event)
    return surface.messages()


# --------------------------------------------------------------------------- inbox


class InboxProjection:
    """The pending inbox, rebuilt by replaying ``agent/inbox/spliced`` facts.

    Splices with ``seq < seed_length`` belong to a seeded prefix (a fork's parent) and
    are not replayed: a fork child does not inherit its parent's pending inbox.

    It also knows every id that ever went through the inbox (seeded splices included,
    as the invariant checker counts them): such a message is entered into the history
    only as claimed, once per claim (the checker's ``inbox-entry`` rule).
    """

    __slots__ = ("_inboxed", "_next_step", "_next_turn", "_seed_length")

    def __init__(self, *, seed_length: int = 0) -> None:
        self._seed_length = seed_length
        # Two fields, not a dict by lane: the projection lives as long as its agent.
        self._next_turn: list[UserMessage] = []
        self._next_step: list[UserMessage] = []
        self._inboxed: set[str] = set()

    def apply(self, event: Event) -> None:
        if event.type != "agent/inbox/spliced":
            return
        data: AgentInboxSpliced = event.data
        inserted = data.inserted
        if inserted:
            if len(inserted) == 1:
                self._inboxed.add(inserted[0].id)
            else:
                self._inboxed.update(message.id for message in inserted)
        if event.seq < self._seed_length:
            return
        lane = self._next_turn if data.target == "next-turn" else self._next_step
        lane[data.start : data.start + data.removed_count] = inserted

    def was_inboxed(self, message_id: str) -> bool:
        """Whether a message ``message_id`` was ever inserted (pending now, claimed or
        discarded since)."""
        return message_id in self._inboxed

    def pending(self) -> tuple[list[UserMessage], list[UserMessage]]:
        """``(next_turn, next_step)``, as new lists."""
        return list(self._next_turn), list(self._next_step)


def pending_inbox(
    events: Iterable[Event], *, seed_length: int = 0
) -> tuple[list[UserMessage], list[UserMessage]]:
    inbox = InboxProjection(seed_length=seed_length)
    for event in events:
        inbox.apply(event)
    return inbox.pending()


# --------------------------------------------------------------------------- repair


def repair_plan(events: Sequence[Event]) -> list[tuple[str, msgspec.Struct]]:
    """The facts that close an open tail turn after a crash (CONTRACT 7), in order.

    ``events`` is the whole log, or any tail of it that starts at or before the open
    turn's ``turn/start``; the plan's citations assume it is appended right after
    ``events[-1]``. Returns ``[]`` when no turn is open. The rule for the unanswered
    tool calls of the open step, taken in model order (the assistant message's
    tool-call blocks, then any other ``tool/call`` of the step):

    * a call with a durable ``tool/call`` but no ``tool/result`` gets a synthetic error
      result ``TOOL_OUTCOME_UNKNOWN``: ``tool/call`` is appended before the call runs,
      so its body may have started, and had effects, before the crash;
    * a tool-call block of the assistant message with no ``tool/call`` fact gets its
      ``tool/call`` (so every result still follows its call) and then a synthetic error
      result: ``TOOL_NOT_STARTED`` if the turn ran under write-ahead durability (its
      ``turn/start`` names no other mode), where every ``tool/call`` is durable before
      any body runs, so the call cannot have run; else ``TOOL_OUTCOME_UNKNOWN``: under
      ``turn`` or ``none`` a body runs without waiting for its ``tool/call`` to be
      durable, and the log cannot tell whether it did.

    Then ``step/end`` if a step is open, then ``turn/end {kind: "interrupted"}``.
    """
    state = turn_state(events)
    turn = state.open_turn
    if turn is None:
        return []
    plan: list[tuple[str, msgspec.Struct]] = []
    step = state.open_step
    if step is not None:
        start = len(events)
        while start > 0 and events[start - 1].type != "step/start":
            start -= 1
        unlogged = TOOL_NOT_STARTED if _write_ahead(events, start) else TOOL_OUTCOME_UNKNOWN
        next_seq = events[-1].seq + 1
        for call in _unanswered(events[start:]):
            if call.call_seq is None:
                call_seq, code = next_seq + len(plan), unlogged
                plan.append(("tool/call", call.data))
            else:
                call_seq, code = call.call_seq, TOOL_OUTCOME_UNKNOWN
            plan.append(("tool/result", _synthetic_result(call.data, code, call_seq)))
        plan.append(("step/end", StepEnd(turn=turn, step=step)))
    plan.append(("turn/end", TurnEnd(turn=turn, reason=Interrupted())))
    return plan


def _write_ahead(events: Sequence[Event], before: int) -> bool:
    """Whether the open turn, whose ``turn/start`` is the last one in ``events[:before]``,
    ran under write-ahead durability."""
    for index in range(before - 1, -1, -1):
        event = events[index]
        if event.type == "turn/start":
            data: TurnStart = event.data
            return data.durability is None
    return False  # a tail cut after its turn/start (see repair_plan): nothing is proven


class _Unanswered(NamedTuple):
    data: ToolCallData
    call_seq: int | None
    """Seq of the call's ``tool/call``; ``None`` when it was never logged."""


def _unanswered(step_events: Sequence[Event]) -> list[_Unanswered]:
    """Each unanswered call of one step, in model order."""
    calls: dict[str, Event] = {}
    answered: set[str] = set()
    reply: AssistantMessageData | None = None
    for event in step_events:
        if event.type == "tool/call":
            calls[event.data.call_id] = event
        elif event.type == "tool/result":
            answered.add(event.data.message.call_id)
        elif event.type == "assistant/message":
            reply = event.data
    ordered: dict[str, _Unanswered] = {}
    if reply is not None:
        for part in reply.message.content:
            if type(part) is ToolCallBlock and part.call_id not in ordered:
                data = ToolCallData(
                    turn=reply.turn,
                    step=reply.step,
                    call_id=part.call_id,
                    name=part.name,
                    arguments=part.arguments,
                )
                ordered[part.call_id] = _Unanswered(data, None)
    for call_id, call in calls.items():
        ordered[call_id] = _Unanswered(call.data, call.seq)
    return [call for call_id, call in ordered.items() if call_id not in answered]


_REPAIR_TEXT: Final = {
    TOOL_NOT_STARTED: "The session was interrupted before this tool call started; it did not run.",
    TOOL_OUTCOME_UNKNOWN: (
        "The session was interrupted while this tool call may have been running; "
        "its outcome is unknown (it may or may not have taken effect)."
    ),
}


def _synthetic_result(call: ToolCallData, code: str, call_seq: int) -> ToolResultData:
    text = _REPAIR_TEXT[code]
    message = ToolMessage(
        call_id=call.call_id, name=call.name, content=(TextBlock(text=text),), is_error=True
    )
    return ToolResultData(
        turn=call.turn,
        step=call.step,
        message=message,
        error=ToolError(code=code, message=text),
        source_event_seqs=(call_seq,),
    )


# --------------------------------------------------------------------------- fork


def fork_prefix(events: Sequence[Event], boundary: int) -> list[Event]:
    """The events with ``seq <= boundary``, to seed a fork child.

    Raises :class:`ForkBoundaryError` when ``boundary`` is not a seq of the log or the
    prefix would end inside an open turn.
    """
    if not events or not events[0].seq <= boundary <= events[-1].seq:
        held = f"seqs {events[0].seq}..{events[-1].seq}" if events else "no events"
        raise ForkBoundaryError(
            f"fork boundary {boundary} is out of range: the log holds {held}; "
            "choose the inclusive seq of the last event the child should inherit"
        )
    prefix = list(events[: bisect_right(events, boundary, key=_SEQ)])
    state = turn_state(prefix)
    if state.open_turn is not None:
        raise ForkBoundaryError(
            f"fork boundary {boundary} ends inside turn {state.open_turn} (started at seq "
            f"{state.open_turn_seq}); fork at a seq before {state.open_turn_seq} or at or "
            "after that turn's turn/end"
        )
    return prefix
