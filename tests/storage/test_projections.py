"""Pure projections: turn state, derived messages, inbox, repair plan, fork prefix."""

from __future__ import annotations

from typing import Literal

import msgspec
import pytest

from storage import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    Event,
    ForkBoundaryError,
    InvalidEventError,
    assert_invariants,
    derive_messages,
    fork_prefix,
    pending_inbox,
    repair_plan,
    turn_state,
)
from storage.events import (
    AssistantMessage,
    Interrupted,
    StepEnd,
    SurfaceReplace,
    TextBlock,
    ToolMessage,
    ToolResultData,
    TurnEnd,
    UserMessage,
    UserMessageData,
)
from storage.projections import TurnTracker
from tests.storage.builders import (
    LogBuilder,
    completed_turn,
    followup,
    open_turn_with_pending_call,
    tool_turn,
    user_message,
)


def texts(events: list[Event]) -> list[str]:
    """The text of each derived message ("" for one without text)."""
    return [
        next((b.text for b in message.content if isinstance(b, TextBlock)), "")
        for message in derive_messages(events)
    ]


# --------------------------------------------------------------------------- turn state


def test_an_empty_log_has_no_turn() -> None:
    state = turn_state([])
    assert (state.last_turn, state.open_turn, state.open_step, state.last_step) == (
        0,
        None,
        None,
        0,
    )
    assert not state.is_open


def test_turn_numbers_continue_across_closed_turns() -> None:
    log = LogBuilder()
    completed_turn(log)
    tool_turn(log)
    state = turn_state(log.events)
    assert (state.last_turn, state.open_turn) == (2, None)
    assert state.last_header is not None


def test_an_open_turn_reports_its_step_and_unanswered_calls() -> None:
    log = LogBuilder()
    open_turn_with_pending_call(log)
    state = turn_state(log.events)
    assert (state.open_turn, state.open_step, state.last_step) == (1, 1, 1)
    assert state.open_turn_seq == 0
    assert dict(state.open_calls) == {"b": log.events[-1].seq}


def test_a_builder_over_a_seeded_prefix_continues_the_turn_numbers() -> None:
    log = LogBuilder(start_seq=40, last_turn=6)
    completed_turn(log)
    assert turn_state(log.events).last_turn == 7


# --------------------------------------------------------------------------- messages


def test_only_surface_facts_build_the_history() -> None:
    log = LogBuilder()
    completed_turn(log, "hello", "hi there")
    tool_turn(log, "use it", calls=[("c1", "echo", "{}")], reply="done")
    messages = derive_messages(log.events)
    assert [type(m) for m in messages] == [
        UserMessage,
        AssistantMessage,
        UserMessage,
        AssistantMessage,
        ToolMessage,
        AssistantMessage,
    ]
    assert texts(log.events)[:2] == ["hello", "hi there"]


def test_a_replace_swaps_the_message_in_place_and_can_be_replaced_again() -> None:
    log = LogBuilder()
    log.turn_start()
    log.step_start()
    first = log.user("first")
    log.assistant("draft")
    replacement = log.add(
        "user/message",
        msgspec_replace(first.data, message=user_message("first, edited"), replace=first.seq),
    )
    assert texts(log.events) == ["first, edited", "draft"]
    log.add(
        "user/message",
        msgspec_replace(first.data, message=user_message("edited twice"), replace=replacement.seq),
    )
    assert texts(log.events) == ["edited twice", "draft"]


def test_a_replace_of_a_non_surface_event_is_refused() -> None:
    log = LogBuilder()
    start = log.turn_start()
    log.step_start()
    log.assistant("x", replaces=start.seq)
    with pytest.raises(InvalidEventError, match=r"\$\.data\.surfaceOp\.seq"):
        derive_messages(log.events)


def test_citing_a_later_seq_is_refused() -> None:
    log = LogBuilder()
    log.turn_start()
    log.step_start()
    log.assistant("x", cites=[99])
    with pytest.raises(InvalidEventError, match="sourceEventSeqs"):
        derive_messages(log.events)


def msgspec_replace(data: UserMessageData, *, message: UserMessage, replace: int) -> object:
    return msgspec.structs.replace(data, message=message, surface_op=SurfaceReplace(seq=replace))


# --------------------------------------------------------------------------- inbox


def test_the_inbox_is_the_replay_of_its_splices() -> None:
    log = LogBuilder()
    first = followup(log, "one")
    second = followup(log, "two")
    assert pending_inbox(log.events) == ([first, second], [])
    completed_turn(log, "three")  # queues a third message, claims the first
    next_turn, _ = pending_inbox(log.events)
    assert [m.id for m in next_turn] == [second.id, log.events[2].data.inserted[0].id]
    assert texts(log.events)[0] == "one"


def test_seeded_splices_are_not_replayed() -> None:
    log = LogBuilder()
    followup(log, "from the parent")
    assert pending_inbox(log.events, seed_length=len(log.events)) == ([], [])


# --------------------------------------------------------------------------- repair


def test_nothing_needs_repair_when_no_turn_is_open() -> None:
    log = LogBuilder()
    completed_turn(log)
    assert repair_plan(log.events) == []
    assert repair_plan([]) == []


def test_repair_answers_logged_calls_as_unknown_and_unlogged_ones_as_not_started() -> None:
    log = LogBuilder()
    open_turn_with_pending_call(log)
    plan = repair_plan(log.events)
    assert [kind for kind, _ in plan] == [
        "tool/result",
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
    ]
    codes = [
        data.error.code for kind, data in plan if isinstance(data, ToolResultData) and data.error
    ]
    assert codes == [TOOL_OUTCOME_UNKNOWN, TOOL_NOT_STARTED]
    last = log.events[-1].seq
    assert plan[2][1].source_event_seqs == (last + 2,)  # type: ignore[attr-defined]
    assert plan[-2:] == [
        ("step/end", StepEnd(turn=1, step=1)),
        ("turn/end", TurnEnd(turn=1, reason=Interrupted())),
    ]
    for kind, data in plan:
        log.add(kind, data)
    assert_invariants(log.events)


def repaired_codes(plan: list[tuple[str, msgspec.Struct]]) -> dict[str, str]:
    return {
        data.message.call_id: data.error.code
        for _, data in plan
        if isinstance(data, ToolResultData) and data.error
    }


@pytest.mark.parametrize("durability", ["turn", "none"])
def test_repair_of_a_turn_not_run_write_ahead_never_says_an_unlogged_call_did_not_run(
    durability: Literal["turn", "none"],
) -> None:
    # Under "turn" or "none" a tool body runs without waiting for its tool/call to be
    # durable: a crash can keep the reply's tool-call blocks and lose the tool/call facts
    # of bodies that ran (a payment made). The log cannot prove such a call did not run.
    log = LogBuilder()
    completed_turn(log)
    log.turn_start(durability=durability)
    log.step_start()
    log.user("pay twice")
    log.assistant(calls=[("p1", "pay", '{"k": 1}'), ("p2", "pay", '{"k": 2}')])
    plan = repair_plan(log.events)
    assert [kind for kind, _ in plan] == [
        "tool/call",
        "tool/result",
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
    ]
    assert repaired_codes(plan) == {"p1": TOOL_OUTCOME_UNKNOWN, "p2": TOOL_OUTCOME_UNKNOWN}
    for kind, data in plan:
        log.add(kind, data)
    assert_invariants(log.events)
    # A call logged and unanswered, one never logged: both unknown.
    mixed = LogBuilder()
    open_turn_with_pending_call(mixed, durability=durability)
    assert repaired_codes(repair_plan(mixed.events)) == {
        "b": TOOL_OUTCOME_UNKNOWN,
        "c": TOOL_OUTCOME_UNKNOWN,
    }


def test_the_durability_of_the_open_turn_decides_not_that_of_an_earlier_one() -> None:
    log = LogBuilder()
    log.turn_start(durability="none")  # an earlier run of the session, not write-ahead
    log.turn_end()
    open_turn_with_pending_call(log)  # resumed under write-ahead, crashed again
    assert repaired_codes(repair_plan(log.events)) == {
        "b": TOOL_OUTCOME_UNKNOWN,
        "c": TOOL_NOT_STARTED,
    }


def test_repair_of_a_tail_gives_the_same_plan_as_of_the_whole_log() -> None:
    log = LogBuilder()
    completed_turn(log)
    open_turn_with_pending_call(log)
    start = turn_state(log.events).open_turn_seq
    assert start is not None
    assert repair_plan(log.events[start:]) == repair_plan(log.events)


def test_repair_of_an_open_step_before_the_model_replied_only_closes_it() -> None:
    log = LogBuilder()
    log.turn_start()
    log.step_start()
    log.user("hello")
    log.chunk("half a rep")
    assert [kind for kind, _ in repair_plan(log.events)] == ["step/end", "turn/end"]


# --------------------------------------------------------------------------- fork


def test_a_fork_prefix_ends_at_the_inclusive_boundary() -> None:
    log = LogBuilder()
    completed_turn(log)
    end_of_turn_1 = log.events[-1].seq
    tool_turn(log)
    prefix = fork_prefix(log.events, end_of_turn_1)
    assert [e.seq for e in prefix] == list(range(end_of_turn_1 + 1))
    assert fork_prefix(log.events, log.events[-1].seq) == log.events


def test_a_fork_boundary_inside_an_open_turn_is_refused() -> None:
    log = LogBuilder()
    completed_turn(log)
    start = log.turn_start()
    log.step_start()
    with pytest.raises(ForkBoundaryError, match=f"inside turn 2 \\(started at seq {start.seq}\\)"):
        fork_prefix(log.events, start.seq + 1)


@pytest.mark.parametrize("boundary", [-1, 999])
def test_a_fork_boundary_out_of_range_is_refused(boundary: int) -> None:
    log = LogBuilder()
    completed_turn(log)
    with pytest.raises(ForkBoundaryError, match="out of range"):
        fork_prefix(log.events, boundary)


def test_an_empty_log_cannot_be_forked() -> None:
    with pytest.raises(ForkBoundaryError, match="no events"):
        fork_prefix([], 0)


def test_the_turn_state_snapshot_is_read_only() -> None:
    log = LogBuilder()
    open_turn_with_pending_call(log)
    state = turn_state(log.events)
    with pytest.raises(TypeError):
        state.open_calls["x"] = 1  # type: ignore[index]


def test_the_per_type_handlers_of_the_turn_tracker_agree_with_apply() -> None:
    log = LogBuilder()
    completed_turn(log)
    tool_turn(log)
    open_turn_with_pending_call(log)
    by_apply, by_handler = TurnTracker(), TurnTracker()
    for event in log.events:
        by_apply.apply(event)
        handler = by_handler.handler(event.type)
        if handler is not None:
            before = by_handler.snapshot()
            handler(event)
            assert by_handler.snapshot() is not before  # the cached snapshot is dropped
        assert by_handler.snapshot() == by_apply.snapshot()
    assert by_handler.snapshot() == turn_state(log.events)
    assert TurnTracker().handler("assistant/chunk") is None
