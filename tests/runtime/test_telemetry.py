"""runtime.telemetry: spans and metrics from a real runtime on a real store, read back
through the OpenTelemetry SDK's in-memory span exporter and metric reader."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")  # the test extra installs it

from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from runtime import LlmFailure, RetryPolicy, Runtime, ScriptedModel, ToolCall, tool
from runtime.telemetry import Instrumentation, instrument
from runtime.telemetry import semconv as sc
from tests.scenarios.models import FailingThenOk

WAIT = 10.0


class Otel:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = list(self.exporter.get_finished_spans())
        return [s for s in found if name is None or s.name == name]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for rm in data.resource_metrics
            for scope in rm.scope_metrics
            for m in scope.metrics
            if m.name == metric
            for point in m.data.data_points
        ]


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    yield o
    o.tracer_provider.shutdown()
    o.meter_provider.shutdown()


def open_rt(tmp_path: Path, **options: Any) -> Runtime:
    return Runtime.open(tmp_path / "store", **options)


def settled_waiter(rt: Runtime, count: int) -> threading.Event:
    done, seen = threading.Event(), [0]
    lock = threading.Lock()

    def on_settled(_: Any) -> None:
        with lock:
            seen[0] += 1
            if seen[0] >= count:
                done.set()

    rt.on("agent/settled", on_settled)
    return done


def wire(rt: Runtime, otel: Otel, **options: Any) -> Instrumentation:
    return instrument(
        rt, tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider, **options
    )


@tool(concurrency_safe=True)
def lookup(key: str) -> str:
    return f"value of {key}"


def test_a_turn_with_a_tool_call_gives_invoke_agent_chat_and_execute_tool_spans(
    tmp_path: Path, otel: Otel
) -> None:
    model = ScriptedModel([[ToolCall(name="lookup", arguments={"key": "k"})], "done"], name="m1")
    with open_rt(tmp_path) as rt:
        wire(rt, otel)
        done = settled_waiter(rt, 1)
        agent = rt.spawn(model=model, tools=[lookup])
        agent.followup("secret question")
        assert done.wait(WAIT)
        assert agent.wait_idle(WAIT)
    (turn,) = otel.spans("invoke_agent")
    chats = otel.spans("chat m1")
    (call,) = otel.spans("execute_tool lookup")
    assert len(chats) == 2
    attrs = dict(turn.attributes or {})
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert attrs[sc.GEN_AI_AGENT_ID] == agent.id == attrs[sc.GEN_AI_CONVERSATION_ID]
    assert attrs[sc.CORRAL_TURN_OUTCOME] == "completed"
    assert turn.status.status_code is StatusCode.UNSET
    for span in [*chats, call]:
        assert span.parent is not None and span.parent.span_id == turn.context.span_id
        assert span.context.trace_id == turn.context.trace_id
    first, second = sorted(chats, key=lambda s: s.start_time or 0)
    assert first.kind is SpanKind.CLIENT
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes[sc.GEN_AI_PROVIDER_NAME] == "scripted"
    assert first.attributes[sc.GEN_AI_REQUEST_MODEL] == "m1"
    assert first.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("tool_calls",)
    assert second.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert first.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] > 0
    assert first.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] > 0
    assert call.attributes is not None
    assert call.attributes[sc.GEN_AI_TOOL_NAME] == "lookup"
    assert call.attributes[sc.GEN_AI_TOOL_CALL_ID]
    assert (first.end_time or 0) <= (call.start_time or 0) <= (call.end_time or 0)
    assert (call.end_time or 0) <= (second.start_time or 0)
    assert (turn.start_time or 0) <= (first.start_time or 0)
    assert (second.end_time or 0) <= (turn.end_time or 0)
    # Contents only when opted in: nothing of the question or the tool's value is there.
    everything = json.dumps([dict(s.attributes or {}) for s in otel.spans()], default=str)
    assert "secret question" not in everything and "value of k" not in everything


def test_contents_are_recorded_only_when_opted_in(tmp_path: Path, otel: Otel) -> None:
    model = ScriptedModel([[ToolCall(name="lookup", arguments={"key": "k"})], "the answer"])
    with open_rt(tmp_path) as rt:
        wire(rt, otel, capture_content=True)
        done = settled_waiter(rt, 1)
        rt.spawn(model=model, tools=[lookup], system="be brief").followup("secret question")
        assert done.wait(WAIT)
    (turn,) = otel.spans("invoke_agent")
    assert turn.attributes is not None
    assert "secret question" in str(turn.attributes[sc.GEN_AI_INPUT_MESSAGES])
    (call,) = otel.spans("execute_tool lookup")
    assert call.attributes is not None
    assert json.loads(str(call.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS])) == {"key": "k"}
    assert "value of k" in str(call.attributes[sc.GEN_AI_TOOL_CALL_RESULT])
    outputs = [str((s.attributes or {}).get(sc.GEN_AI_OUTPUT_MESSAGES)) for s in otel.spans()]
    assert any("the answer" in o for o in outputs)
    assert all(
        (s.attributes or {}).get(sc.GEN_AI_SYSTEM_INSTRUCTIONS) == "be brief"
        for s in otel.spans()
        if s.name.startswith("chat")
    )


def test_a_failed_request_that_is_retried_gives_an_errored_chat_and_two_turn_spans(
    tmp_path: Path, otel: Otel
) -> None:
    failure = LlmFailure(message="boom", code="SERVER", status=500)
    policy = RetryPolicy(base_s=0.001, cap_s=0.002)
    with open_rt(tmp_path, retry_policy=policy) as rt:
        wire(rt, otel)
        done = settled_waiter(rt, 1)
        rt.spawn(model=FailingThenOk([failure])).followup("hi")
        assert done.wait(WAIT)
    turns = sorted(otel.spans("invoke_agent"), key=lambda s: s.start_time or 0)
    assert [dict(t.attributes or {})[sc.CORRAL_TURN_OUTCOME] for t in turns] == [
        "error",
        "completed",
    ]
    assert turns[0].status.status_code is StatusCode.ERROR
    assert dict(turns[0].attributes or {})[sc.ERROR_TYPE] == "SERVER"
    assert dict(turns[1].attributes or {})[sc.CORRAL_RETRY_OF] == 1
    failed, ok = sorted(otel.spans("chat flaky"), key=lambda s: s.start_time or 0)
    assert dict(failed.attributes or {})[sc.ERROR_TYPE] == "SERVER"
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.parent is not None and failed.parent.span_id == turns[0].context.span_id
    assert sc.ERROR_TYPE not in dict(ok.attributes or {})
    outcomes = {p.attributes[sc.CORRAL_TURN_OUTCOME]: p.value for p in otel.points(sc.METRIC_TURNS)}
    assert outcomes == {"error": 1, "completed": 1}
    errored = [
        p for p in otel.points(sc.METRIC_OPERATION_DURATION) if sc.ERROR_TYPE in p.attributes
    ]
    assert [p.attributes[sc.ERROR_TYPE] for p in errored] == ["SERVER"]


def test_metrics_count_tokens_durations_first_chunks_and_gauges_settle_at_zero(
    tmp_path: Path, otel: Otel
) -> None:
    with open_rt(tmp_path) as rt:
        wire(rt, otel)
        done = settled_waiter(rt, 6)
        agents = [rt.spawn(model=ScriptedModel.echo(chunks=3)) for _ in range(3)]
        for agent in agents:
            agent.followup("one two three")
            agent.followup("four")
        assert done.wait(WAIT)
        for agent in agents:
            assert agent.wait_idle(WAIT)
        tokens = otel.points(sc.METRIC_TOKEN_USAGE)
        by_type = {p.attributes[sc.GEN_AI_TOKEN_TYPE]: p for p in tokens}
        assert set(by_type) == {"input", "output"}
        assert by_type["input"].count == 6 and by_type["output"].count == 6
        assert by_type["input"].attributes[sc.GEN_AI_REQUEST_MODEL] == "scripted"
        usage_in = sum(
            e.data.usage.input_tokens
            for a in agents
            for e in a.session.events()
            if e.type == "assistant/message"
        )
        assert by_type["input"].sum == usage_in
        (duration,) = otel.points(sc.METRIC_OPERATION_DURATION)
        assert duration.count == 6
        (first,) = otel.points(sc.METRIC_TIME_TO_FIRST_CHUNK)
        assert first.count == 6  # one per request, not one per chunk (3 each)
        assert first.sum <= duration.sum
        (outcome,) = otel.points(sc.METRIC_TURNS)
        assert outcome.attributes == {sc.CORRAL_TURN_OUTCOME: "completed"} and outcome.value == 6
        (running,) = otel.points(sc.METRIC_RUNNING_AGENTS)
        (depth,) = otel.points(sc.METRIC_INBOX_DEPTH)
        assert running.value == 0 and depth.value == 0


def test_the_gauges_show_a_running_agent_and_its_waiting_message(
    tmp_path: Path, otel: Otel
) -> None:
    from tests.scenarios.models import GateModel

    model = GateModel()
    with open_rt(tmp_path) as rt:
        wire(rt, otel)
        agent = rt.spawn(model=model)
        agent.followup("first")
        agent.followup("second")
        assert model.wait_reached(1)
        (running,) = otel.points(sc.METRIC_RUNNING_AGENTS)
        (depth,) = otel.points(sc.METRIC_INBOX_DEPTH)
        assert running.value == 1 and depth.value == 1
        agent.cancel()
        assert agent.wait_idle(WAIT)
        (running,) = otel.points(sc.METRIC_RUNNING_AGENTS)
        (depth,) = otel.points(sc.METRIC_INBOX_DEPTH)
        assert running.value == 0 and depth.value == 0
    (turn,) = otel.spans("invoke_agent")
    assert dict(turn.attributes or {})[sc.CORRAL_TURN_OUTCOME] == "aborted"
    assert dict(turn.attributes or {})[sc.ERROR_TYPE] == "aborted"


@pytest.mark.parametrize("durability", ["write-ahead", "turn", "none"])
def test_a_turn_span_is_exported_once_its_turn_end_is_durable(
    tmp_path: Path, otel: Otel, durability: str
) -> None:
    at_turn_end: list[int] = []  # turn spans exported when each turn/end is appended
    at_settled: list[int] = []  # ... when each agent/settled is emitted

    with open_rt(tmp_path, durability=durability) as rt:
        wire(rt, otel)  # its listeners first: they have seen each event before ours

        def on_event(event: Any) -> None:
            if event.event.type == "turn/end":
                at_turn_end.append(len(otel.spans("invoke_agent")))

        rt.on("session/event", on_event)
        rt.on("agent/settled", lambda e: at_settled.append(len(otel.spans("invoke_agent"))))
        done = settled_waiter(rt, 2)
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("a")
        agent.followup("b")
        assert done.wait(WAIT)
        assert agent.wait_idle(WAIT)
    if durability == "none":  # no checkpoint comes: a turn's span ends with it
        assert at_turn_end == [1, 2]
    else:  # exported at the session/flush checkpoint, before agent/settled
        assert at_turn_end == [0, 1]
    assert at_settled == [1, 2]
    assert len(otel.spans("invoke_agent")) == 2


def test_a_resumed_agent_names_its_model_from_its_log(tmp_path: Path, otel: Otel) -> None:
    with open_rt(tmp_path) as rt:
        agent = rt.spawn(model=ScriptedModel(["one"], name="m2"), session_id="again")
        agent.followup("first")
        assert agent.wait_idle(WAIT)
    with open_rt(tmp_path) as rt:
        wire(rt, otel)
        done = settled_waiter(rt, 1)
        resumed = rt.resume("again", model=ScriptedModel(["two"], name="m2"))
        resumed.followup("second")
        assert done.wait(WAIT)
        headers = [e for e in resumed.session.events() if e.type == "request/header"]
    assert len(headers) == 1  # the unchanged configuration was not logged again
    (chat,) = otel.spans("chat m2")
    assert dict(chat.attributes or {})[sc.GEN_AI_REQUEST_MODEL] == "m2"


def test_close_stops_the_instrumentation(tmp_path: Path, otel: Otel) -> None:
    with open_rt(tmp_path) as rt:
        wired = wire(rt, otel)
        wired.close()
        wired.close()  # idempotent
        done = settled_waiter(rt, 1)
        rt.spawn(model=ScriptedModel.echo()).followup("hi")
        assert done.wait(WAIT)
    assert otel.spans() == []


def test_without_an_sdk_instrument_is_a_no_op_on_the_global_providers(tmp_path: Path) -> None:
    with open_rt(tmp_path) as rt:
        wired = instrument(rt)
        done = settled_waiter(rt, 1)
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("hi")
        assert done.wait(WAIT)
        wired.close()
        assert [e.type for e in agent.session.events()][-1] == "turn/end"


class StartAttributes(SpanProcessor):
    """What each span carried when it started (a processor's or sampler's view)."""

    def __init__(self) -> None:
        self.at_start: dict[int, dict[str, Any]] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.at_start[span.context.span_id] = dict(span.attributes or {})


def test_a_turns_spans_are_made_in_one_go_at_its_checkpoint_each_whole_at_its_start(
    tmp_path: Path, otel: Otel
) -> None:
    started = StartAttributes()
    otel.tracer_provider.add_span_processor(started)
    model = ScriptedModel([[ToolCall(name="lookup", arguments={"key": "k"})], "done"], name="m1")
    at_turn_end: list[int] = []
    with open_rt(tmp_path) as rt:
        wire(rt, otel)
        rt.on(
            "session/event",
            lambda e: e.event.type == "turn/end" and at_turn_end.append(len(otel.spans())),
        )
        done = settled_waiter(rt, 1)
        rt.spawn(model=model, tools=[lookup]).followup("question")
        assert done.wait(WAIT)
    assert at_turn_end == [0]  # not the chat and tool spans either: none before the checkpoint
    spans = otel.spans()
    assert sorted(s.name for s in spans) == [
        "chat m1",
        "chat m1",
        "execute_tool lookup",
        "invoke_agent",
    ]
    for span in spans:  # every attribute given at creation: nothing was set afterwards
        assert started.at_start[span.context.span_id] == dict(span.attributes or {})
    (turn,) = otel.spans("invoke_agent")
    assert dict(turn.attributes or {})[sc.CORRAL_TURN_OUTCOME] == "completed"


def test_turns_by_outcome_is_a_monotonic_cumulative_counter_across_collections(
    tmp_path: Path, otel: Otel
) -> None:
    with open_rt(tmp_path) as rt:
        wire(rt, otel)
        agent = rt.spawn(model=ScriptedModel.echo())
        for expected in (1, 2):
            done = settled_waiter(rt, 1)
            agent.followup("hi")
            assert done.wait(WAIT)
            data = otel.reader.get_metrics_data()
            assert data is not None
            (metric,) = [
                m
                for rm in data.resource_metrics
                for scope in rm.scope_metrics
                for m in scope.metrics
                if m.name == sc.METRIC_TURNS
            ]
            assert metric.data.is_monotonic
            assert metric.data.aggregation_temporality is AggregationTemporality.CUMULATIVE
            (point,) = metric.data.data_points
            assert point.attributes == {sc.CORRAL_TURN_OUTCOME: "completed"}
            assert point.value == expected


def test_a_killed_agents_open_turn_is_exported_as_abandoned(tmp_path: Path, otel: Otel) -> None:
    from tests.scenarios.models import GateModel

    model = GateModel()
    with open_rt(tmp_path) as rt:
        wire(rt, otel)
        disposed = threading.Event()
        rt.on("agent/disposed", lambda e: disposed.set())
        agent = rt.spawn(model=model)
        agent.followup("first")
        assert model.wait_reached(1)
        agent.kill()
        assert disposed.wait(WAIT)
        (turn,) = otel.spans("invoke_agent")
        (chat,) = otel.spans("chat gate")
    attrs = dict(turn.attributes or {})
    assert attrs[sc.ERROR_TYPE] == "agent_disposed"
    assert sc.CORRAL_TURN_OUTCOME not in attrs  # it never ended
    assert turn.status.status_code is StatusCode.ERROR
    assert dict(chat.attributes or {})[sc.ERROR_TYPE] == "agent_disposed"
    assert chat.parent is not None and chat.parent.span_id == turn.context.span_id
