"""The invariant checker accepts sound logs and detects every kind of violation."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from storage import Event, Violation, assert_invariants, check_invariants
from storage.events import (
    Completed,
    MessageTrigger,
    SessionEndSeed,
    StepEnd,
    StepStart,
    ToolCallData,
    TurnEnd,
    TurnStart,
    UserMessage,
    UserMessageData,
)
from tests.storage.builders import (
    LogBuilder,
    completed_turn,
    followup,
    open_turn_with_pending_call,
    tool_turn,
    user_message,
)


def sound_log() -> LogBuilder:
    log = LogBuilder()
    completed_turn(log)
    tool_turn(log, calls=[("a", "echo", "{}"), ("b", "grep", "{}")])
    followup(log, "queued")
    return log


def rules(events: list[Event], **kwargs: bool) -> set[str]:
    return {violation.rule for violation in check_invariants(events, **kwargs)}


def resequenced(events: list[Event]) -> list[Event]:
    return [msgspec.structs.replace(e, seq=i) for i, e in enumerate(events)]


def test_sound_logs_have_no_violations() -> None:
    assert check_invariants(sound_log().events) == []
    assert check_invariants([]) == []


def test_an_open_tail_is_a_violation_unless_allowed() -> None:
    log = sound_log()
    open_turn_with_pending_call(log)
    assert rules(log.events) == {"open-tail"}
    assert check_invariants(log.events, allow_open_tail=True) == []


def test_a_window_of_a_log_can_be_checked_on_its_own() -> None:
    log = LogBuilder(start_seq=100, last_turn=4)
    completed_turn(log)
    assert rules(log.events) == {"seq-gap", "turn-number"}
    assert check_invariants(log.events, whole_log=False) == []


# Each case builds a log that breaks the rule it is listed with in CASES.
def _seq_order(log: LogBuilder) -> list[Event]:
    events = sound_log().events
    return [*events[:3], events[4], events[3], *events[5:]]


def _seq_gap(log: LogBuilder) -> list[Event]:
    events = sound_log().events
    return [*events[:3], *events[4:]]


def _turn_number(log: LogBuilder) -> list[Event]:
    log.turn += 1
    completed_turn(log)
    return log.events


def _turn_nested(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.turn_start()
    log.turn_end()
    return log.events


def _turn_end(log: LogBuilder) -> list[Event]:
    completed_turn(log)
    log.add("turn/end", TurnEnd(turn=1, reason=Completed()))
    return log.events


def _step_number(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step += 1  # skip step 1
    log.step_start()
    log.step_end()
    log.turn_end()
    return log.events


def _step_outside_turn(log: LogBuilder) -> list[Event]:
    log.add("step/start", StepStart(turn=1, step=1))
    log.add("step/end", StepEnd(turn=1, step=1))
    return log.events


def _step_nested(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step_start()
    log.add("step/start", StepStart(turn=1, step=2))
    log.step = 2
    log.step_end()
    log.turn_end()
    return log.events


def _step_end(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step_start()
    log.add("step/end", StepEnd(turn=1, step=7))
    log.turn_end()
    return log.events


def _step_unclosed(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step_start()
    log.turn_end()
    return log.events


def _chunk_outside_step(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.chunk("stray")
    log.turn_end()
    return log.events


def _call_in_another_step(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step_start()
    call = log.tool_call("a")
    log.step_end()
    log.step_start()
    log.tool_result(call)
    log.step_end()
    log.turn_end()
    return log.events


def _result_without_call(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step_start()
    ghost_call = ToolCallData(turn=1, step=1, call_id="ghost", name="echo", arguments="{}")
    ghost = Event("tool/call", 999, 0, ghost_call)
    log.tool_result(ghost)
    log.step_end()
    log.turn_end()
    return log.events


def _answered_twice(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step_start()
    call = log.tool_call("a")
    log.tool_result(call)
    log.tool_result(call)
    log.step_end()
    log.turn_end()
    return log.events


def _call_id_reused(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step_start()
    first = log.tool_call("a")
    log.tool_result(first)
    second = log.tool_call("a")
    log.tool_result(second)
    log.step_end()
    log.turn_end()
    return log.events


def _call_unanswered(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step_start()
    log.tool_call("a")
    log.step_end()
    log.turn_end()
    return log.events


def _cites_the_future(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step_start()
    log.assistant("x", cites=[50])
    log.step_end()
    log.turn_end()
    return log.events


def _replaces_a_boundary(log: LogBuilder) -> list[Event]:
    log.turn_start()
    start = log.step_start()
    log.assistant("x", replaces=start.seq)
    log.step_end()
    log.turn_end()
    return log.events


def _user_names_another_turn(log: LogBuilder) -> list[Event]:
    log.turn_start()
    log.step_start()
    log.turn += 1
    log.user("wrong turn")
    log.turn -= 1
    log.step_end()
    log.turn_end()
    return log.events


def _splice_past_the_end(log: LogBuilder) -> list[Event]:
    followup(log, "one")
    log.splice("next-turn", start=0, removed=2, canceled=True)
    return log.events


def _splice_of_nothing(log: LogBuilder) -> list[Event]:
    followup(log, "one")
    log.splice("next-step", start=0)
    return log.events


def _outcome_without_removal(log: LogBuilder) -> list[Event]:
    log.splice("next-turn", inserted=[user_message("x")], canceled=True)
    return log.events


def _id_pending_twice(log: LogBuilder) -> list[Event]:
    log.splice("next-turn", inserted=[user_message("x", "same")])
    log.splice("next-step", inserted=[user_message("y", "same")])
    return log.events


def _claim_outside_turn(log: LogBuilder) -> list[Event]:
    followup(log, "one")
    log.splice("next-turn", removed=1)
    return log.events


def _claim_behind_the_front(log: LogBuilder) -> list[Event]:
    followup(log, "one")
    followup(log, "two")
    log.turn_start()
    log.splice("next-turn", start=1, removed=1)
    log.turn_end()
    return log.events


def _enter_in_a_turn(log: LogBuilder, message: UserMessage, *, claim: bool = False) -> None:
    """A one-step turn whose step appends ``message`` (claimed first if ``claim``)."""
    log.turn_start()
    if claim:
        log.splice("next-turn", removed=1)
    log.step_start()
    log.add("user/message", UserMessageData(message=message, turn=log.turn, step=log.step))
    log.step_end()
    log.turn_end()


def _entered_unclaimed(log: LogBuilder) -> list[Event]:
    _enter_in_a_turn(log, followup(log, "one"))
    return log.events


def _entered_after_its_discard(log: LogBuilder) -> list[Event]:
    message = followup(log, "one")
    log.splice("next-turn", start=0, removed=1, canceled=True)
    _enter_in_a_turn(log, message)
    return log.events


def _entered_twice(log: LogBuilder) -> list[Event]:
    message = followup(log, "one")
    _enter_in_a_turn(log, message, claim=True)
    _enter_in_a_turn(log, message)
    return log.events


def _entered_in_a_later_turn(log: LogBuilder) -> list[Event]:
    message = followup(log, "one")
    log.turn_start()
    log.splice("next-turn", removed=1)
    log.turn_end()
    _enter_in_a_turn(log, message)
    return log.events


CASES: dict[str, tuple[str, Callable[[LogBuilder], list[Event]]]] = {
    "seqs out of order": ("seq-order", _seq_order),
    "a gap in the seqs": ("seq-gap", _seq_gap),
    "a skipped turn number": ("turn-number", _turn_number),
    "a turn inside a turn": ("turn-nested", _turn_nested),
    "a turn/end with no open turn": ("turn-end", _turn_end),
    "a skipped step number": ("step-number", _step_number),
    "a step outside a turn": ("step-outside-turn", _step_outside_turn),
    "a step inside a step": ("step-nested", _step_nested),
    "a step/end of another step": ("step-end", _step_end),
    "a turn ending with its step open": ("step-unclosed", _step_unclosed),
    "a chunk outside a step": ("outside-step", _chunk_outside_step),
    "a user message naming another turn": ("outside-step", _user_names_another_turn),
    "a result in another step than its call": ("tool-result-unmatched", _call_in_another_step),
    "a result without a call": ("tool-result-unmatched", _result_without_call),
    "a call answered twice": ("tool-result-unmatched", _answered_twice),
    "a call id reused in one step": ("tool-call-duplicate", _call_id_reused),
    "a call never answered": ("tool-call-unanswered", _call_unanswered),
    "sourceEventSeqs citing a later seq": ("source-seq", _cites_the_future),
    "a replace of a non-surface event": ("replace-target", _replaces_a_boundary),
    "a splice past its lane's end": ("inbox-splice", _splice_past_the_end),
    "a splice that changes nothing": ("inbox-splice", _splice_of_nothing),
    "an outcome with nothing removed": ("inbox-splice", _outcome_without_removal),
    "a message id pending twice": ("inbox-duplicate", _id_pending_twice),
    "a claim outside a turn": ("inbox-claim", _claim_outside_turn),
    "a claim behind the front of its lane": ("inbox-claim", _claim_behind_the_front),
    "an inbox message entered unclaimed": ("inbox-entry", _entered_unclaimed),
    "a discarded message entered": ("inbox-entry", _entered_after_its_discard),
    "an inbox message entered twice": ("inbox-entry", _entered_twice),
    "a message claimed in one turn, entered in the next": ("inbox-entry", _entered_in_a_later_turn),
}


@pytest.mark.parametrize(("rule", "build"), CASES.values(), ids=CASES.keys())
def test_each_violation_is_detected(rule: str, build: Callable[[LogBuilder], list[Event]]) -> None:
    events = build(LogBuilder())
    found = check_invariants(events, allow_open_tail=True)
    assert rule in {v.rule for v in found}, found


def test_every_violation_is_reported_not_only_the_first() -> None:
    log = LogBuilder()
    log.add("step/start", StepStart(turn=1, step=1))
    log.chunk("x")
    log.add("turn/start", TurnStart(turn=3, trigger=MessageTrigger()))
    assert {"step-outside-turn", "turn-number", "open-tail"} <= rules(log.events)


def test_turn_numbers_continue_from_a_seeded_prefix() -> None:
    log = sound_log()
    log.add("session/end-seed", SessionEndSeed(source_session="p", source_seq=log.next_seq - 1))
    completed_turn(log)
    assert check_invariants(log.events) == []
    assert log.turn == 3


def test_a_claimed_message_need_not_be_entered_and_a_fork_inherits_no_pending_inbox() -> None:
    log = LogBuilder()
    followup(log, "rejected by pre-step")
    log.turn_start()
    log.splice("next-turn", removed=1)  # claimed, then the turn ends without a step
    log.turn_end()
    followup(log, "pending at the fork")
    log.add("session/end-seed", SessionEndSeed(source_session="p", source_seq=log.next_seq - 1))
    completed_turn(log, "the child's own")  # inserted at 0: the parent's is not pending here
    assert check_invariants(log.events) == []
    inserted = [e for e in log.events if e.type == "agent/inbox/spliced" and e.data.inserted]
    assert inserted[-1].data.start == 0


def test_a_replace_may_target_an_earlier_replacement() -> None:
    log = LogBuilder()
    log.turn_start()
    log.step_start()
    first = log.assistant("a")
    second = log.assistant("b", replaces=first.seq)
    log.assistant("c", replaces=second.seq)
    log.step_end()
    log.turn_end()
    assert check_invariants(log.events) == []
    assert check_invariants(resequenced(log.events)) == []


def test_assert_invariants_lists_every_violation() -> None:
    events = _step_unclosed(LogBuilder())
    with pytest.raises(AssertionError, match=r"1 invariant\(s\):\n  seq 2: \[step-unclosed\]"):
        assert_invariants(events)
    assert_invariants(sound_log().events)


def test_a_violation_reads_as_a_sentence() -> None:
    assert str(Violation(4, "seq-gap", "follows seq 2")) == "seq 4: [seq-gap] follows seq 2"
    assert str(Violation(None, "open-tail", "ends inside turn 1")).startswith("log: ")
