"""The session invariants (CONTRACT 7), checkable over any log by any test.

:func:`check_invariants` returns every :class:`Violation` it finds (it never stops at
the first); :func:`assert_invariants` raises an ``AssertionError`` listing them. Rules
(the ``rule`` code of a violation in brackets):

* seqs strictly increase [``seq-order``], contiguous from 0 for a whole log [``seq-gap``];
* turns number 1, 2, 3… continuing from a seeded prefix [``turn-number``], never nest
  [``turn-nested``], and each ``turn/end`` closes the open turn [``turn-end``];
* steps number 1..n per turn [``step-number``], never outside a turn
  [``step-outside-turn``], never nest [``step-nested``], each ``step/end`` closes the
  open step [``step-end``], and every step ends before its turn does [``step-unclosed``];
* chunks, assistant messages, tool calls/results and request facts happen inside the
  open step they name, and a ``user/message`` naming a turn/step inside that one
  [``outside-step``];
* every ``tool/result`` follows its ``tool/call`` (same callId) in the same step
  [``tool-result-unmatched``], call ids are unique per step [``tool-call-duplicate``],
  and every call is answered before its step ends [``tool-call-unanswered``];
* ``sourceEventSeqs`` cite earlier seqs [``source-seq``]; a ``replace`` surfaceOp
  targets an earlier surface event [``replace-target``];
* the inbox (CONTRACT 3), replayed from ``agent/inbox/spliced`` facts (a seeded prefix's
  pending inbox is dropped at ``session/end-seed``, as a resume does): a splice's
  coordinates lie inside its lane, it changes something, and only a removal carries an
  ``outcome`` [``inbox-splice``]; a message id is pending at most once across both lanes
  [``inbox-duplicate``]; a claim (a pure deletion: no ``outcome``) takes messages from
  the front of its lane inside an open turn [``inbox-claim``]; a ``user/message`` of a
  message that went through the inbox appends it only after it was claimed in the same
  turn, once per claim [``inbox-entry``] (checked for a whole log only; an id may be
  inserted again once it left the inbox);
* the log ends outside any turn [``open-tail``], unless ``allow_open_tail=True``.

A placeholder for a record of an ignorable type the reader did not know (data an
:class:`~storage.events.IgnoredRecord`, from ``Store.read(..., include_ignored=True)``)
is taken for its seq alone: it fills its place in the seq order and may be cited, and
nothing else of it is checked. Read a log to check with ``include_ignored=True``: a
store that skips such records leaves gaps where they were, which a whole-log check
reports as ``seq-gap``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Final, NamedTuple

from storage.events import (
    SURFACE_TYPES,
    AgentInboxSpliced,
    Event,
    IgnoredRecord,
    SurfaceAppend,
    SurfaceReplace,
)

__all__ = ["Violation", "assert_invariants", "check_invariants"]

_IN_STEP: Final = frozenset(
    {
        "assistant/chunk",
        "assistant/message",
        "tool/call",
        "tool/result",
        "request/header",
        "request/context",
    }
)


class Violation(NamedTuple):
    """One broken invariant: where (``seq``, ``None`` for the log as a whole), which rule,
    and what was found."""

    seq: int | None
    rule: str
    message: str

    def __str__(self) -> str:
        where = "log" if self.seq is None else f"seq {self.seq}"
        return f"{where}: [{self.rule}] {self.message}"


class _Lane:
    """A lane's pending ids in order. The usual splices (an insert at the end, a claim
    or removal at the front) cost what they insert or remove, not the lane's length: a
    removal at the front moves ``head`` on (the list is cut once half of it is gone)."""

    __slots__ = ("head", "ids")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.head = 0  # Invariant: ids[:head] were removed

    def __len__(self) -> int:
        return len(self.ids) - self.head

    def window(self, start: int, count: int) -> list[str]:
        at = self.head + start
        return self.ids[at : at + count] if count else []

    def splice(self, start: int, removed: int, inserted: list[str]) -> None:
        ids = self.ids
        if start == len(self) and not removed:
            ids.extend(inserted)
        elif start == 0 and not inserted:
            self.head += removed
            if self.head > len(ids) // 2:
                del ids[: self.head]
                self.head = 0
        else:
            at = self.head + start
            ids[at : at + removed] = inserted


class _Checker:
    def __init__(self, *, whole_log: bool) -> None:
        self.whole_log = whole_log
        self.found: list[Violation] = []
        self.prev_seq: int | None = None
        self.last_turn: int | None = 0 if whole_log else None
        self.turn: int | None = None
        self.step: int | None = None
        self.last_step = 0
        self.calls: dict[str, int] = {}  # open step: call id -> seq of tool/call
        self.answered: set[str] = set()
        self.seqs: set[int] = set()
        self.surface: set[int] = set()
        self.lanes: dict[str, _Lane] = {"next-turn": _Lane(), "next-step": _Lane()}
        # Invariant: how many times each id is in the two lanes together (kept with the
        # lanes, not rebuilt per splice: that made a log of n pending messages n^2).
        self.pending: Counter[str] = Counter()
        self.inboxed: set[str] = set()  # ids that ever went through the inbox
        # Claimed in the open turn and not entered yet, with how many times: an id may come
        # back into the inbox once it left it, and be claimed again.
        self.claimed: Counter[str] = Counter()
        self.entered: set[str] = set()  # inbox messages appended by a user/message

    def bad(self, event: Event | None, rule: str, message: str) -> None:
        self.found.append(Violation(None if event is None else event.seq, rule, message))

    def visit(self, event: Event) -> None:
        self.check_seq(event)
        kind, data = event.type, event.data
        if type(data) is IgnoredRecord:  # opaque: its seq only
            self.seqs.add(event.seq)
            return
        if kind == "turn/start":
            self.turn_start(event)
        elif kind == "turn/end":
            self.turn_end(event)
        elif kind == "step/start":
            self.step_start(event)
        elif kind == "step/end":
            self.step_end(event)
        elif kind in _IN_STEP:
            self.in_step(event, data.turn, data.step)
        elif kind == "user/message" and (data.turn is not None or data.step is not None):
            if data.turn is not None and data.turn != self.turn:
                self.bad(event, "outside-step", f"names turn {data.turn}, open: {self.turn}")
            elif data.step is not None and data.step != self.step:
                self.bad(event, "outside-step", f"names step {data.step}, open: {self.step}")
        if kind == "tool/call":
            self.tool_call(event)
        elif kind == "tool/result":
            self.tool_result(event)
        elif kind == "agent/inbox/spliced":
            self.splice(event, data)
        elif kind == "user/message" and self.whole_log:
            self.entry(event)
        elif kind == "session/end-seed":  # a seeded prefix's pending inbox is not inherited
            self.lanes = {"next-turn": _Lane(), "next-step": _Lane()}
            self.pending = Counter()
        if kind in SURFACE_TYPES:
            self.surface_refs(event)
        self.seqs.add(event.seq)

    def check_seq(self, event: Event) -> None:
        prev = self.prev_seq
        if prev is None:
            if self.whole_log and event.seq != 0:
                self.bad(event, "seq-gap", "a whole log starts at seq 0")
        elif event.seq <= prev:
            self.bad(event, "seq-order", f"follows seq {prev}; seqs must strictly increase")
        elif self.whole_log and event.seq != prev + 1:
            self.bad(event, "seq-gap", f"follows seq {prev}; seqs are contiguous")
        self.prev_seq = event.seq if prev is None else max(prev, event.seq)

    def turn_start(self, event: Event) -> None:
        number = event.data.turn
        if self.turn is not None:
            self.bad(event, "turn-nested", f"turn {number} starts while turn {self.turn} is open")
        if self.last_turn is not None and number != self.last_turn + 1:
            self.bad(event, "turn-number", f"turn {number} follows turn {self.last_turn}")
        self.last_turn = number if self.last_turn is None else max(self.last_turn, number)
        self.turn, self.step, self.last_step = number, None, 0
        self.calls, self.answered = {}, set()
        self.claimed = Counter()

    def turn_end(self, event: Event) -> None:
        number = event.data.turn
        if self.turn is None:
            self.bad(event, "turn-end", f"turn/end {number} with no open turn")
        elif number != self.turn:
            self.bad(event, "turn-end", f"turn/end {number} while turn {self.turn} is open")
        if self.step is not None:
            self.bad(event, "step-unclosed", f"turn ends while step {self.step} is open")
            self.close_step(event)
        self.turn = None

    def step_start(self, event: Event) -> None:
        turn, number = event.data.turn, event.data.step
        if self.turn is None:
            self.bad(event, "step-outside-turn", f"step {number} starts outside any turn")
        elif turn != self.turn:
            self.bad(event, "step-outside-turn", f"names turn {turn}, open: {self.turn}")
        if self.step is not None:
            self.bad(event, "step-nested", f"step {number} starts while step {self.step} is open")
        if number != self.last_step + 1:
            self.bad(event, "step-number", f"step {number} follows step {self.last_step}")
        self.step, self.last_step = number, max(self.last_step, number)
        self.calls, self.answered = {}, set()

    def step_end(self, event: Event) -> None:
        turn, number = event.data.turn, event.data.step
        if self.step is None or (turn, number) != (self.turn, self.step):
            self.bad(event, "step-end", f"step/end {turn}.{number}, open: {self.turn}.{self.step}")
        if self.step is not None:
            self.close_step(event)

    def close_step(self, event: Event) -> None:
        for call_id, seq in self.calls.items():
            if call_id not in self.answered:
                self.bad(event, "tool-call-unanswered", f"call {call_id!r} (seq {seq}) unanswered")
        self.step = None
        self.calls, self.answered = {}, set()

    def in_step(self, event: Event, turn: int, step: int) -> None:
        if self.step is None:
            self.bad(event, "outside-step", f"{event.type} outside any step")
        elif (turn, step) != (self.turn, self.step):
            self.bad(event, "outside-step", f"names {turn}.{step}, open: {self.turn}.{self.step}")

    def tool_call(self, event: Event) -> None:
        call_id = event.data.call_id
        if call_id in self.calls:
            self.bad(event, "tool-call-duplicate", f"call id {call_id!r} reused in one step")
        self.calls[call_id] = event.seq

    def tool_result(self, event: Event) -> None:
        call_id = event.data.message.call_id
        if call_id not in self.calls:
            self.bad(event, "tool-result-unmatched", f"no tool/call {call_id!r} in this step")
        elif call_id in self.answered:
            self.bad(event, "tool-result-unmatched", f"call {call_id!r} answered twice")
        self.answered.add(call_id)

    def splice(self, event: Event, data: AgentInboxSpliced) -> None:
        lane = self.lanes.get(data.target)
        if lane is None:  # the codec refuses an unknown lane: only a hand-built event
            self.bad(event, "inbox-splice", f"unknown lane {data.target!r}")
            return
        start, removed = data.start, data.removed_count
        where = f"{data.target} [{start}:{start + removed}] of {len(lane)} pending"
        if not (0 <= start <= len(lane) and 0 <= removed <= len(lane) - start):
            self.bad(event, "inbox-splice", f"removes {where}")
            return
        if not removed and not data.inserted:
            self.bad(event, "inbox-splice", f"changes nothing ({where})")
        if data.outcome is not None and not removed:
            self.bad(event, "inbox-splice", f"outcome {data.outcome!r} with nothing removed")
        if data.outcome is None and removed:  # a claim
            if self.turn is None:
                self.bad(event, "inbox-claim", f"claims {where} outside any turn")
            if start != 0 or data.inserted:
                self.bad(event, "inbox-claim", f"a claim takes the front of a lane: {where}")
        taken = lane.window(start, removed)
        if data.outcome is None and removed:
            self.claimed.update(taken)  # a Counter: counts them
        pending = self.pending
        for message_id in taken:
            pending[message_id] -= 1
            if not pending[message_id]:
                del pending[message_id]
        ids = [message.id for message in data.inserted]
        seen: set[str] = set()
        for message_id in ids:
            if pending[message_id] or message_id in seen:
                self.bad(event, "inbox-duplicate", f"inserts {message_id!r}, already pending")
            seen.add(message_id)
        pending.update(ids)
        self.inboxed.update(ids)
        lane.splice(start, removed, ids)

    def entry(self, event: Event) -> None:
        data = event.data
        message_id = data.message.id
        if type(data.surface_op) is not SurfaceAppend or message_id not in self.inboxed:
            return  # not an inbox message (a seed, a plugin's or a replaced one)
        if self.claimed[message_id] > 0:
            self.claimed[message_id] -= 1
        elif message_id in self.entered:
            self.bad(event, "inbox-entry", f"message {message_id!r} entered twice")
        else:
            self.bad(event, "inbox-entry", f"message {message_id!r} entered unclaimed")
        self.entered.add(message_id)

    def surface_refs(self, event: Event) -> None:
        data = event.data
        for cited in data.source_event_seqs:
            if cited >= event.seq or (self.whole_log and cited not in self.seqs):
                self.bad(event, "source-seq", f"sourceEventSeqs cites {cited}, not an earlier seq")
        op = data.surface_op
        if type(op) is SurfaceReplace:
            known = op.seq in self.surface or (not self.whole_log and op.seq not in self.seqs)
            if op.seq >= event.seq or not known:
                self.bad(event, "replace-target", f"replace targets {op.seq}, not a surface event")
        self.surface.add(event.seq)


def check_invariants(
    events: Sequence[Event], *, allow_open_tail: bool = False, whole_log: bool = True
) -> list[Violation]:
    """Every invariant violation in ``events`` (``[]`` for a sound log).

    ``whole_log=False`` checks a window of a log instead (it must start outside a turn):
    seqs need not start at 0 or be contiguous, the first turn may have any number, and
    references to seqs before the window are not checked.
    """
    checker = _Checker(whole_log=whole_log)
    for event in events:
        checker.visit(event)
    if not allow_open_tail and checker.turn is not None:
        checker.bad(None, "open-tail", f"the log ends inside turn {checker.turn}")
    return checker.found


def assert_invariants(
    events: Sequence[Event], *, allow_open_tail: bool = False, whole_log: bool = True
) -> None:
    """Raise ``AssertionError`` listing every violation; return quietly for a sound log."""
    found = check_invariants(events, allow_open_tail=allow_open_tail, whole_log=whole_log)
    if found:
        listing = "\n  ".join(str(violation) for violation in found)
        raise AssertionError(f"the session log breaks {len(found)} invariant(s):\n  {listing}")
