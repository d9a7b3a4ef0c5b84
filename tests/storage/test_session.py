"""Session: append semantics, observers, loaded history, projections, repair."""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any
from unittest.mock import ANY

import msgspec
import pytest

from storage import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    Codec,
    Event,
    EventTooLargeError,
    EventTypes,
    InvalidEventError,
    LogCorruptError,
    MemorySink,
    ReentrantAppendError,
    Session,
    StoreClosedError,
    UnknownEventTypeError,
    assert_invariants,
    derive_messages,
)
from storage.events import (
    Errored,
    Interrupted,
    LlmFailure,
    LlmRetry,
    MessageTrigger,
    RequestConfig,
    RequestHeader,
    SessionEndSeed,
    StepStart,
    SurfaceReplace,
    ToolError,
    ToolResultData,
    ToolSpec,
    TurnEnd,
    TurnStart,
    UserMessageData,
)
from tests.storage import builders
from tests.storage.builders import (
    START_TIME,
    LogBuilder,
    completed_turn,
    followup,
    open_turn_with_pending_call,
    tool_turn,
    user_message,
)

TURN_1 = TurnStart(turn=1, trigger=MessageTrigger())


# --------------------------------------------------------------------------- append


def test_append_assigns_contiguous_seqs_from_zero_and_clock_times() -> None:
    session = new_session()
    first = session.append("turn/start", TURN_1)
    second = session.append("step/start", StepStart(turn=1, step=1))
    assert (first.seq, second.seq) == (0, 1)
    assert (first.time, second.time) == (START_TIME, START_TIME + 1)
    assert session.last_seq == 1
    assert session.events() == [first, second]


def test_append_hands_the_encoded_record_to_the_sink() -> None:
    sink = MemorySink()
    session = new_session(sink=sink, key=7)
    event = session.append("turn/start", TURN_1)
    [record] = sink.records
    assert (record.session_key, record.seq) == (7, 0)
    assert record.payload == session.codec.encode(event)


def test_time_never_goes_backwards_even_if_the_clock_does() -> None:
    times = iter([50, 40, 60])
    session = new_session(clock=lambda: next(times))
    assert [session.append("plugin", {}).time for _ in range(3)] == [50, 50, 60]


def test_an_empty_session_has_last_seq_minus_one() -> None:
    assert new_session().last_seq == -1


def new_session(events: Iterable[Event] = (), **kwargs: Any) -> Session:
    """A test session whose codec also knows a plain-JSON ``plugin`` type."""
    if "codec" not in kwargs:
        types = EventTypes.default()
        types.register("plugin")
        kwargs["codec"] = Codec(types, max_event_bytes=1000)
    return builders.new_session(events, **kwargs)


@pytest.mark.parametrize(
    ("type", "data", "error"),
    [
        ("nope", {}, UnknownEventTypeError),
        ("plugin", {"x": math.nan}, InvalidEventError),
        ("plugin", {"x": {1, 2}}, InvalidEventError),
        ("plugin", {"surfaceOp": {"kind": "append"}}, InvalidEventError),
        ("plugin", {"x": "y" * 2000}, EventTooLargeError),
        ("turn/start", StepStart(turn=1, step=1), InvalidEventError),
        (
            "user/message",
            UserMessageData(message=user_message("x"), surface_op=SurfaceReplace(seq=0)),
            InvalidEventError,
        ),
        (
            "user/message",
            UserMessageData(message=user_message("x"), source_event_seqs=[1]),
            InvalidEventError,
        ),
    ],
)
def test_a_refused_append_writes_nothing(type: str, data: object, error: type[Exception]) -> None:
    sink = MemorySink()
    session = new_session(sink=sink)
    kept = session.append("turn/start", TURN_1)
    seen: list[Event] = []
    session.on_event(seen.append)
    with pytest.raises(error):
        session.append(type, data)
    assert session.events() == [kept]
    assert session.last_seq == 0
    assert len(sink.records) == 1
    assert seen == []
    assert session.state.open_turn == 1
    assert session.messages() == []


def bad_typed_facts() -> list[tuple[str, msgspec.Struct, str]]:
    """Typed facts whose free-form or float parts are not lossless, with the path."""
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle

    def header(parameters: dict[str, Any], temperature: float | None = None) -> RequestHeader:
        config = RequestConfig(provider="p", model="m", temperature=temperature)
        return RequestHeader(
            turn=1, step=1, config=config, tools=[ToolSpec(name="t", parameters=parameters)]
        )

    failure = LlmFailure(message="x", retry_after_s=math.inf)
    return [
        ("request/header", header({}, temperature=math.nan), "$.data.config.temperature"),
        ("request/header", header({"enum": [1, math.nan]}), "parameters.enum[1]"),
        ("request/header", header({"properties": {1: "x"}}), "parameters.properties"),
        ("request/header", header({"default": {1, 2}}), "parameters.default"),
        ("request/header", header(cycle), "parameters.self"),
        ("turn/end", TurnEnd(turn=1, reason=Errored(error=failure)), "reason.error.retryAfterS"),
        ("llm/retry", LlmRetry(turn=1, attempt=1, delay_s=-math.inf, failure=failure), "delayS"),
    ]


@pytest.mark.parametrize("api", ["append", "append_fact"])
@pytest.mark.parametrize(("type", "data", "path"), bad_typed_facts())
def test_the_typed_fast_path_still_refuses_data_that_is_not_lossless(
    api: str, type: str, data: msgspec.Struct, path: str
) -> None:
    sink = MemorySink()
    session = new_session(sink=sink)
    attempt = session.append_fact if api == "append_fact" else partial(session.append, type)
    with pytest.raises(InvalidEventError, match=re.escape(path)):
        attempt(data)
    assert session.events() == []
    assert sink.records == []


def test_an_ignorable_type_is_appended_with_its_marker() -> None:
    types = EventTypes.default()
    types.register("plugin/trace", ignorable=True)
    sink = MemorySink()
    session = new_session(sink=sink, codec=Codec(types))
    event = session.append("plugin/trace", {"x": 1})
    assert sink.records[0].payload == session.codec.encode(event)
    assert b'"ignorable":true' in sink.records[0].payload


def test_a_sink_that_refuses_the_record_leaves_nothing_behind() -> None:
    sink = MemorySink()
    session = new_session(sink=sink)
    sink.close()
    with pytest.raises(StoreClosedError, match="memory sink is closed"):
        session.append("turn/start", TURN_1)
    assert session.events() == []
    assert session.state.last_turn == 0


def test_append_fact_finds_the_type_from_the_struct_class() -> None:
    session = new_session()
    event = session.append_fact(TURN_1)
    assert event.type == "turn/start"
    assert session.state.open_turn == 1


def test_append_fact_of_an_unregistered_struct_is_refused() -> None:
    class Stray(msgspec.Struct):
        x: int

    with pytest.raises(UnknownEventTypeError, match="Stray"):
        new_session().append_fact(Stray(x=1))


def test_append_fact_of_a_struct_registered_twice_asks_for_the_type() -> None:
    types = EventTypes.default()
    types.register("plugin/a", StepStart)
    with pytest.raises(InvalidEventError, match="several event types"):
        new_session(codec=Codec(types)).append_fact(StepStart(turn=1, step=1))


def test_concurrent_appends_get_contiguous_seqs_in_sink_order() -> None:
    sink = MemorySink()
    session = new_session(sink=sink)
    barrier = threading.Barrier(4)

    def writer(index: int) -> None:
        barrier.wait()
        for n in range(200):
            session.append("plugin", {"writer": index, "n": n})

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [e.seq for e in session.events()] == list(range(800))
    assert [r.seq for r in sink.records] == list(range(800))


# --------------------------------------------------------------------------- observers


def test_observers_see_each_committed_event_in_registration_order() -> None:
    session = new_session()
    calls: list[tuple[str, int]] = []
    session.on_event(lambda e: calls.append(("first", e.seq)))
    session.on_event(lambda e: calls.append(("second", e.seq)))
    session.append("turn/start", TURN_1)
    assert calls == [("first", 0), ("second", 0)]


def test_a_failing_observer_is_logged_and_contained(caplog: pytest.LogCaptureFixture) -> None:
    session = new_session()
    later: list[Event] = []

    def boom(event: Event) -> None:
        raise RuntimeError("observer bug")

    session.on_event(boom)
    session.on_event(later.append)
    with caplog.at_level(logging.ERROR, logger="corral.session"):
        event = session.append("turn/start", TURN_1)
    assert later == [event]
    assert session.events() == [event]
    [record] = caplog.records
    assert record.name == "corral.session"
    assert "seq 0" in record.getMessage()
    assert record.exc_info is not None


def test_an_observer_cannot_append(caplog: pytest.LogCaptureFixture) -> None:
    session = new_session()
    refused: list[BaseException] = []

    def reenter(event: Event) -> None:
        try:
            session.append("plugin", {})
        except ReentrantAppendError as err:
            refused.append(err)

    session.on_event(reenter)
    session.append("turn/start", TURN_1)
    assert len(refused) == 1
    assert "observers may not append" in str(refused[0])
    assert session.last_seq == 0


def test_an_observer_may_read_the_session() -> None:
    session = new_session()
    seen: list[tuple[int | None, int]] = []
    session.on_event(lambda e: seen.append((session.state.open_turn, len(session.events()))))
    session.append("turn/start", TURN_1)
    assert seen == [(1, 1)]


def test_an_append_from_another_thread_while_observing_is_not_refused() -> None:
    session = new_session()
    results: list[Event] = []

    def observer(event: Event) -> None:
        if event.seq == 0:
            thread = threading.Thread(target=lambda: results.append(session.append("plugin", {})))
            thread.start()
            observer.thread = thread  # type: ignore[attr-defined]

    session.on_event(observer)
    session.append("turn/start", TURN_1)
    observer.thread.join()  # type: ignore[attr-defined]
    assert [e.seq for e in results] == [1]


def test_the_disposer_removes_the_observer_and_is_idempotent() -> None:
    session = new_session()
    seen: list[Event] = []
    dispose = session.on_event(seen.append)
    session.append("turn/start", TURN_1)
    dispose()
    dispose()
    session.append("plugin", {})
    assert [e.seq for e in seen] == [0]


# --------------------------------------------------------------------------- history


def full_log() -> list[Event]:
    log = LogBuilder()
    completed_turn(log)
    tool_turn(log)
    followup(log, "queued")
    return log.events


def test_loaded_history_rebuilds_projections_without_resubmitting() -> None:
    events = full_log()
    sink = MemorySink()
    session = new_session(events, sink=sink)
    assert sink.records == []
    assert session.last_seq == events[-1].seq
    assert session.messages() == derive_messages(events)
    assert session.state.last_turn == 2
    assert [m.id for m in session.pending_inbox()[0]] == [events[-1].data.inserted[0].id]
    assert session.append("plugin", {}).seq == events[-1].seq + 1


def test_loaded_history_with_seqs_out_of_order_is_corrupt() -> None:
    events = full_log()
    with pytest.raises(LogCorruptError, match="strictly increase"):
        new_session([events[1], events[0]])


def test_loaded_history_that_replaces_a_missing_event_is_corrupt() -> None:
    bad = Event(
        "user/message",
        0,
        1,
        UserMessageData(message=user_message("x"), surface_op=SurfaceReplace(seq=0)),
    )
    with pytest.raises(LogCorruptError, match="session 's-1'"):
        new_session([bad])


def test_last_seq_continues_after_records_a_store_skipped() -> None:
    events = full_log()[:3]
    session = new_session(events, last_seq=9)  # seqs 3..9 were unknown ignorable records
    assert session.last_seq == 9
    assert session.append("plugin", {}).seq == 10


def test_events_takes_an_inclusive_seq_range() -> None:
    session = new_session(full_log())
    assert [e.seq for e in session.events(3, 5)] == [3, 4, 5]
    assert [e.seq for e in session.events(20)] == list(range(20, session.last_seq + 1))
    assert session.events(5, 4) == []


def test_the_incremental_messages_agree_with_the_pure_projection_after_every_append() -> None:
    session = new_session()
    log = LogBuilder(session)
    steps: list[Callable[[], object]] = [
        lambda: completed_turn(log),
        lambda: tool_turn(log, calls=[("a", "echo", "{}"), ("b", "echo", "{}")]),
        log.turn_start,
        log.step_start,
        lambda: log.assistant("draft"),
        lambda: log.assistant("final", replaces=log.events[-1].seq),
        lambda: log.assistant("final 2", replaces=log.events[-2].seq),
        log.step_end,
        log.turn_end,
    ]
    for step in steps:
        step()
        assert session.messages() == derive_messages(session.events())
    assert session.messages()[-1].content[0].text == "final 2"  # type: ignore[union-attr]
    assert session.messages() is not session.messages()
    assert_invariants(session.events())


def test_the_turn_state_follows_turns_steps_calls_and_headers() -> None:
    session = new_session()
    log = LogBuilder(session)
    assert session.state.last_turn == 0
    open_turn_with_pending_call(log)
    state = session.state
    assert (state.last_turn, state.open_turn, state.open_step, state.last_step) == (1, 1, 1, 1)
    assert dict(state.open_calls) == {"b": log.events[-1].seq}
    assert state.last_header is None
    header = RequestHeader(turn=1, step=1, config=RequestConfig(provider="p", model="m"))
    session.append("request/header", header)
    assert session.state.last_header == header
    session.repair()
    state = session.state
    assert (state.open_turn, state.open_step, state.last_step, dict(state.open_calls)) == (
        None,
        None,
        0,
        {},
    )
    assert state.last_turn == 1


def test_pending_inbox_replays_splices() -> None:
    session = new_session()
    log = LogBuilder(session)
    a, b, c = user_message("a"), user_message("b"), user_message("c")
    log.splice("next-turn", inserted=[a, b])
    log.splice("next-step", inserted=[c])
    log.splice("next-turn", start=0, removed=1)  # claim a
    assert session.pending_inbox() == ([b], [c])
    log.splice("next-step", start=0, removed=1, canceled=True)
    assert session.pending_inbox() == ([b], [])


def test_a_fork_child_does_not_inherit_the_parents_pending_inbox() -> None:
    parent = LogBuilder()
    followup(parent, "parent's queued message")
    seed = parent.events
    child = new_session(seed, seed_length=len(seed) + 1)
    child.append_fact(SessionEndSeed(source_session="parent", source_seq=seed[-1].seq))
    assert child.pending_inbox() == ([], [])
    LogBuilder(child).splice("next-turn", inserted=[user_message("own")])
    assert [m.id for m in child.pending_inbox()[0]] == ["m-own"]


# --------------------------------------------------------------------------- repair


def test_repair_closes_an_open_turn_with_a_pending_call() -> None:
    log = LogBuilder()
    completed_turn(log)
    open_turn_with_pending_call(log)
    session = new_session(log.events)
    repaired = session.repair()
    assert [e.type for e in repaired] == [
        "tool/result",
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
    ]
    unknown, call_c, not_started = repaired[0].data, repaired[1], repaired[2].data
    assert isinstance(unknown, ToolResultData)
    assert isinstance(not_started, ToolResultData)
    assert unknown.message.call_id == "b"
    assert unknown.error == ToolError(code=TOOL_OUTCOME_UNKNOWN, message=ANY)
    assert unknown.source_event_seqs == (log.events[-1].seq,)
    assert call_c.data.call_id == "c"
    assert not_started.error == ToolError(code=TOOL_NOT_STARTED, message=ANY)
    assert not_started.source_event_seqs == (call_c.seq,)
    assert repaired[-1].data.reason == Interrupted()
    assert_invariants(session.events())


def test_repair_of_an_open_turn_without_a_step_only_ends_the_turn() -> None:
    session = new_session()
    LogBuilder(session).turn_start()
    assert [e.type for e in session.repair()] == ["turn/end"]
    assert_invariants(session.events())


def test_repair_is_a_no_op_on_a_closed_log() -> None:
    session = new_session(full_log())
    assert session.repair() == []
    assert new_session().repair() == []


def test_repaired_facts_are_durable_through_the_sink() -> None:
    sink = MemorySink()
    log = LogBuilder()
    open_turn_with_pending_call(log)
    session = new_session(log.events, sink=sink)
    repaired = session.repair()
    assert [r.seq for r in sink.records] == [e.seq for e in repaired]


# --------------------------------------------------------------------------- flush


def test_flush_and_flush_async_delegate_to_the_sink() -> None:
    sink = MemorySink()
    session = new_session(sink=sink)
    outcomes: list[BaseException | None] = []
    session.flush()
    session.flush_async(outcomes.append)
    assert outcomes == [None]
    assert sink.flushes == 2
    sink.close()
    session.flush_async(outcomes.append)
    assert isinstance(outcomes[-1], StoreClosedError)
    with pytest.raises(StoreClosedError, match="memory sink is closed"):
        session.flush()
