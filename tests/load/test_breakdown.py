"""Where a turn's time goes, from the log's facts: each interval to one part, the parts
adding up to the logged span; a live run's parts plus its commit wait match the
latency the driver measured on its own clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from actors import ModelRequest
from runtime.load import LoadDriver, LoadSpec, latency_of, run_bench, turn_times
from runtime.runtime import Runtime
from storage import (
    AgentInboxSpliced,
    AssistantChunk,
    AssistantMessage,
    AssistantMessageData,
    Completed,
    Errored,
    Event,
    FinishChunk,
    LlmFailure,
    LlmRetry,
    MessageTrigger,
    RetryTrigger,
    StepEnd,
    StepStart,
    Store,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallData,
    ToolMessage,
    ToolResultData,
    TurnEnd,
    TurnStart,
    UserMessage,
)

from . import stacks

_MSG = UserMessage(id="m1", content=(TextBlock(text="hi"),))
_REPLY = AssistantMessageData(
    turn=1, step=1, message=AssistantMessage(content=(TextBlock(text="ok"),))
)


def _log(*facts: tuple[int, str, object]) -> list[Event]:
    return [Event(kind, seq, t, data) for seq, (t, kind, data) in enumerate(facts)]


def _tool_result(turn: int, step: int, call_id: str) -> ToolResultData:
    message = ToolMessage(call_id=call_id, name="t", content=(TextBlock(text="v"),))
    return ToolResultData(turn=turn, step=step, message=message)


def test_each_interval_of_a_turn_goes_to_one_part_and_they_add_up() -> None:
    splice = AgentInboxSpliced(target="next-turn", start=0, inserted=(_MSG,))
    claim = AgentInboxSpliced(target="next-turn", start=0, removed_count=1)
    chunk = AssistantChunk(turn=1, step=1, chunk=TextDelta(text="o"))
    log = _log(
        (1000, "agent/inbox/spliced", splice),
        (1007, "turn/start", TurnStart(turn=1, trigger=MessageTrigger())),  # queue 7
        (1008, "agent/inbox/spliced", claim),
        (1010, "step/start", StepStart(turn=1, step=1)),  # hooks 3
        (1040, "assistant/chunk", chunk),  # ttft 30
        (1060, "assistant/message", _REPLY),  # stream 20
        (1061, "tool/call", ToolCallData(turn=1, step=1, call_id="a", name="t", arguments="{}")),
        (1062, "tool/call", ToolCallData(turn=1, step=1, call_id="b", name="t", arguments="{}")),
        (1070, "tool/result", _tool_result(1, 1, "a")),
        (1075, "tool/result", _tool_result(1, 1, "b")),  # tool 14 (1061..1075)
        (1077, "step/end", StepEnd(turn=1, step=1)),  # engine 1 + 2
        (1080, "step/start", StepStart(turn=1, step=2)),  # hooks 3
        (1100, "assistant/chunk", chunk),  # ttft 20
        (1101, "assistant/message", _REPLY),  # stream 1
        (1101, "step/end", StepEnd(turn=1, step=2)),
        (1109, "turn/end", TurnEnd(turn=1, reason=Completed())),  # hooks 8 (turn-stopping)
    )
    (t,) = turn_times(log)
    assert (t.turn, t.inserted_ms, t.ended_ms) == (1, 1000, 1109)
    assert (t.queue, t.hooks, t.ttft, t.stream, t.tool, t.engine, t.retry) == (
        7,
        3 + 3 + 8,  # pre-step, pre-step, turn-stopping
        50,
        21,
        14,
        3,
        0,
    )
    assert t.model == 71
    assert t.parts_ms() == t.wall == 109


def test_a_retry_chain_is_one_turn_with_its_back_off_as_retry_time() -> None:
    failure = LlmFailure(message="overloaded", code="SERVER")
    splice = AgentInboxSpliced(target="next-turn", start=0, inserted=(_MSG,))
    log = _log(
        (0, "agent/inbox/spliced", splice),
        (1, "turn/start", TurnStart(turn=1, trigger=MessageTrigger())),
        (2, "step/start", StepStart(turn=1, step=1)),
        (12, "step/end", StepEnd(turn=1, step=1)),  # the failed request: ttft 10
        (13, "llm/retry", LlmRetry(turn=1, attempt=1, delay_s=0.05, failure=failure)),
        (14, "turn/end", TurnEnd(turn=1, reason=Errored(error=failure))),
        (15, "turn/start", TurnStart(turn=2, trigger=RetryTrigger(previous_turn=1))),
        (65, "step/start", StepStart(turn=2, step=1)),  # the back-off inside the retry turn
        (70, "assistant/chunk", AssistantChunk(turn=2, step=1, chunk=TextDelta(text="o"))),
        (71, "assistant/message", _REPLY),
        (71, "step/end", StepEnd(turn=2, step=1)),
        (72, "turn/end", TurnEnd(turn=2, reason=Completed())),
    )
    (t,) = turn_times(log)
    assert t.turn == 2 and t.retries == 1
    assert t.retry == 1 + 1 + 50  # llm/retry..turn/end..turn/start..step/start
    assert t.hooks == 1 + 1 + 1  # pre-step, agent/request-error (to llm/retry), stopping
    assert t.ttft == 10 + 5
    assert t.parts_ms() == t.wall == 72


def test_an_open_tail_turn_is_left_out_and_two_queued_messages_are_two_turns() -> None:
    two = AgentInboxSpliced(target="next-turn", start=0, inserted=(_MSG, _MSG))
    log = _log(
        (0, "agent/inbox/spliced", two),
        (5, "turn/start", TurnStart(turn=1, trigger=MessageTrigger())),
        (6, "turn/end", TurnEnd(turn=1, reason=Completed())),
        (9, "turn/start", TurnStart(turn=2, trigger=MessageTrigger())),
        (10, "turn/end", TurnEnd(turn=2, reason=Completed())),
        (11, "turn/start", TurnStart(turn=3, trigger=MessageTrigger())),
    )
    first, second = turn_times(log)
    assert (first.queue, second.queue) == (5, 9)  # the second waited from the same insertion
    assert second.wall == 10


def test_marks_split_the_durable_waits_and_the_listener_chains_out_of_the_log_parts() -> None:
    splice = AgentInboxSpliced(target="next-turn", start=0, inserted=(_MSG,))
    chunk = AssistantChunk(turn=1, step=1, chunk=TextDelta(text="o"))
    call = ToolCallData(turn=1, step=1, call_id="a", name="t", arguments="{}")
    log = _log(
        (1000, "agent/inbox/spliced", splice),  # seq 0
        (1002, "turn/start", TurnStart(turn=1, trigger=MessageTrigger())),  # 1: queue 2
        (1003, "step/start", StepStart(turn=1, step=1)),  # 2: hooks 1
        (1040, "assistant/chunk", chunk),  # 3
        (1050, "assistant/message", _REPLY),  # 4: stream 10
        (1051, "tool/call", call),  # 5: engine 1
        (1090, "tool/result", _tool_result(1, 1, "a")),  # 6
        (1091, "step/end", StepEnd(turn=1, step=1)),  # 7: engine 1
        (1092, "turn/end", TurnEnd(turn=1, reason=Completed())),  # 8: hooks 1
    )
    marks = [
        (2, 1004, "request"),  # 1003..1004 commit (the step's own facts)
        (2, 1014, "requested"),  # hooks 10 (agent/request listeners)
        (2, 1020, "model"),  # commit 6 (the flush before the request), then ttft 20
        (5, 1060, "hook"),  # commit 9 (the flush before the tool)
        (5, 1065, "hooked"),  # hooks 5 (tools/pre-execute), then tool 25
        (8, 1095, "checkpoint"),  # commit 3 (turn/end made durable)
        (8, 1099, "settled"),  # hooks 4 (session/flush listeners)
    ]
    (t,) = turn_times(log, marks, tool_gate=True)
    assert (t.inserted_ms, t.ended_ms) == (1000, 1099)
    assert t.queue == 2
    assert t.hooks == 1 + 10 + 5 + 1 + 4
    assert t.commit == 1 + 6 + 9 + 3
    assert (t.ttft, t.stream, t.tool, t.engine) == (20, 10, 25, 2)
    assert t.parts_ms() == t.wall == 99
    # without the marks the same log gives the log's parts, to turn/end
    (bare,) = turn_times(log)
    assert (bare.ttft, bare.tool, bare.commit, bare.wall) == (37, 39, 0, 92)


def test_a_mark_out_of_step_with_the_facts_clock_is_kept_between_its_neighbours() -> None:
    splice = AgentInboxSpliced(target="next-turn", start=0, inserted=(_MSG,))
    log = _log(
        (10, "agent/inbox/spliced", splice),
        (12, "turn/start", TurnStart(turn=1, trigger=MessageTrigger())),
        (13, "step/start", StepStart(turn=1, step=1)),
        (20, "assistant/chunk", AssistantChunk(turn=1, step=1, chunk=TextDelta(text="o"))),
        (21, "assistant/message", _REPLY),
        (21, "step/end", StepEnd(turn=1, step=1)),
        (22, "turn/end", TurnEnd(turn=1, reason=Completed())),
    )
    # a model mark stamped after the first chunk's time, a checkpoint before turn/end's
    (t,) = turn_times(log, [(2, 25, "model"), (6, 21, "checkpoint"), (6, 23, "settled")])
    assert (t.commit, t.ttft) == (7, 0)  # step/start..chunk all before the (clamped) call
    assert t.parts_ms() == t.wall == 13


def test_a_live_runs_parts_with_its_durable_waits_add_up_to_the_measured_latency(
    tmp_path: Path,
) -> None:
    spec = LoadSpec(agents=8, turns=4, latency_s=0.01, tool_calls=1, chunks=3)
    with Runtime.open(tmp_path / "store") as rt:
        driver = LoadDriver(rt, spec)
        report = driver.run()
        logs = {aid: rt.get(aid).session.events() for aid in driver.agent_ids}
    assert report.settled == 32 and report.breakdown is not None
    gate = driver.probes.tool_gate
    assert gate  # write-ahead: the flush before the tool is timed
    times = {
        (aid, t.turn): t
        for aid, log in logs.items()
        for t in turn_times(log, driver.probes.marks[aid], tool_gate=gate)
    }
    assert len(times) == 32
    gaps = []
    for aid, turn, latency_ms, _settled_ms in driver.turn_records:
        t = times[(aid, turn)]
        assert t.parts_ms() == t.wall  # to agent/settled: the durable waits included
        assert t.model > 0 and t.commit >= 0
        gaps.append(latency_ms - t.wall)
    # Two clocks (perf_counter for the latency, whole epoch ms for facts and marks): each
    # turn's measured latency and its parts agree to within a few ms of rounding, plus
    # the follow-up call's own time before its splice was appended.
    assert all(
        -3.0 <= gap <= 3.0 + 0.2 * latency
        for gap, (_a, _t, latency, _s) in zip(gaps, driver.turn_records, strict=True)
    ), gaps
    assert report.breakdown.turns == 32 and report.breakdown.commit is not None
    # three durable waits a turn (before the request, before the tool, at its end): the
    # first two come out of the log's time to first chunk and tool time
    bare = {(aid, t.turn): t for aid, log in logs.items() for t in turn_times(log)}
    moved = 0
    for key, t in times.items():
        assert t.ttft <= bare[key].ttft and t.tool <= bare[key].tool
        moved += bare[key].ttft - t.ttft + bare[key].tool - t.tool
    final = sum(t.wall - bare[key].wall for key, t in times.items())  # turn/end..settled
    assert sum(t.commit for t in times.values()) > 0 and moved > 0
    assert sum(t.commit + t.hooks for t in times.values()) >= final


def test_slow_request_and_tool_listeners_show_under_hooks_not_in_the_model_or_tools(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    report, _samples = run_bench(
        path, LoadSpec(agents=4, turns=3), factory=stacks.slow_hooks, factory_name="slow"
    )
    assert report.settled == 12 and report.invariants_ok
    live = report.breakdown
    assert live is not None and live.commit is not None
    with Store.open(path, readonly=True) as store:
        bare = latency_of(store)  # the log alone: the listeners inside ttft and tools
    # two requests a turn (the tool call, then the answer): 2 x 30 ms of agent/request
    # listeners, 10 ms of tools/pre-execute gate and 10 ms of session/flush listener
    listeners = (
        2 * stacks.REQUEST_WAIT_S + stacks.GATE_WAIT_S + stacks.CHECKPOINT_WAIT_S
    ) * 1000
    assert live.hooks.p50 >= listeners
    assert bare.ttft.p50 >= live.ttft.p50 + 2 * stacks.REQUEST_WAIT_S * 1000
    assert bare.tool.p50 >= live.tool.p50 + stacks.GATE_WAIT_S * 1000
    assert live.ttft.p50 >= 2 * 10  # the model's own 10 ms to a first chunk, twice


class _Batches:
    """A model that streams in batches, as the HTTP providers do (``stream_batches``)."""

    provider, name = "batches", "two"

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        raise AssertionError("a batch-streaming model is read by stream_batches")
        yield  # pragma: no cover

    async def stream_batches(self, request: ModelRequest) -> AsyncIterator[list[StreamChunk]]:
        yield [TextDelta(text="a"), TextDelta(text="b")]
        yield [FinishChunk(reason="stop")]


def test_a_batch_streaming_models_calls_are_marked_too(tmp_path: Path) -> None:
    with Runtime.open(tmp_path / "store") as rt:
        driver = LoadDriver(rt, LoadSpec(agents=2, turns=3), model=_Batches())
        report = driver.run()
    assert report.settled == 6 and report.errored == 0
    marks = [kind for aid in driver.agent_ids for _s, _t, kind in driver.probes.marks[aid]]
    assert marks.count("model") == 6 and marks.count("settled") == 6


def test_a_live_retry_chain_ends_at_its_settled_mark_and_a_cancelled_back_off_too() -> None:
    failure = LlmFailure(message="overloaded", code="SERVER")
    splice = AgentInboxSpliced(target="next-turn", start=0, inserted=(_MSG,))
    log = _log(
        (0, "agent/inbox/spliced", splice),
        (1, "turn/start", TurnStart(turn=1, trigger=MessageTrigger())),
        (2, "step/start", StepStart(turn=1, step=1)),
        (12, "step/end", StepEnd(turn=1, step=1)),
        (13, "llm/retry", LlmRetry(turn=1, attempt=1, delay_s=0.05, failure=failure)),
        (14, "turn/end", TurnEnd(turn=1, reason=Errored(error=failure))),  # 5: the chain goes on
        (15, "turn/start", TurnStart(turn=2, trigger=RetryTrigger(previous_turn=1))),
        (40, "turn/end", TurnEnd(turn=2, reason=Errored(error=failure))),  # 7: cancelled back-off
    )
    (t,) = turn_times(log, [(7, 44, "settled")])
    assert (t.turn, t.retries, t.ended_ms) == (2, 1, 44)
    assert t.retry == 1 + 1 + 25 and t.commit == 4  # turn/end..settled: its last durable wait
    assert t.parts_ms() == t.wall == 44
