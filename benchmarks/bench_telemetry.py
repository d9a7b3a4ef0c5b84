"""Turns per second with OpenTelemetry on (SDK, in-memory exporter) against off, same run.

N agents x T turns (each with one tool call, so every turn has an ``invoke_agent``, two
``chat`` and one ``execute_tool`` span, and 8 measurements: a duration, a time to first
chunk and two token counts per request), ``ScriptedModel`` streaming ``--chunks`` chunks
per reply, write-ahead durability. Three cases, each in a fresh subprocess, alternating
``--repeats`` times; medians are compared:

- ``off``: no telemetry;
- ``no-op``: ``runtime.telemetry.instrument`` on the API's no-op providers (what corral
  itself does for telemetry: the session tap, the checkpoint, the gauges' events);
- ``on``: ``instrument`` with the SDK's ``TracerProvider`` (its default sampler) +
  ``SimpleSpanProcessor`` (each span exported as it ends, on the ending thread) into an
  ``InMemorySpanExporter``, and a ``MeterProvider`` with an ``InMemoryMetricReader``.

Before them, the floor: what the SDK alone costs for the spans and measurements one such
turn makes (same names, attributes and explicit times, no corral code), CPU per turn,
``--floor-turns`` turns in a fresh subprocess per case: spans and measurements with a
``SimpleSpanProcessor`` and with a ``BatchSpanProcessor`` (its worker thread's CPU
counted: the process's CPU time is), spans alone, measurements alone; and ``export``:
corral's exporter making the same turn's spans and measurements from its records.

    python benchmarks/bench_telemetry.py --json out.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import median, parser, print_table, write_json

CASES = ("off", "no-op", "on")
FLOORS = ("sdk simple", "sdk batch", "sdk spans", "sdk measurements", "export")
SPANS_PER_TURN = 4  # invoke_agent + 2 chat + execute_tool
MEASUREMENTS_PER_TURN = 8  # per request: duration, time to first chunk, input/output tokens


def run(n: int, turns: int, chunks: int, latency: float, case: str) -> dict[str, Any]:
    from runtime import Runtime, ScriptedModel, ToolCall, tool
    from storage.events import UserMessage

    @tool(concurrency_safe=True)
    def noop() -> str:
        return "ok"

    def reply(request: Any) -> Any:
        if isinstance(request.messages[-1], UserMessage):
            return [ToolCall(name="noop")]
        return "ok " * 8

    exporter: Any = None
    with tempfile.TemporaryDirectory() as tmp, Runtime.open(Path(tmp) / "store") as rt:
        if case == "no-op":
            from opentelemetry.metrics import NoOpMeterProvider
            from opentelemetry.trace import NoOpTracerProvider

            from runtime.telemetry import instrument

            instrument(rt, tracer_provider=NoOpTracerProvider(), meter_provider=NoOpMeterProvider())
        elif case == "on":
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
                InMemorySpanExporter,
            )

            from runtime.telemetry import instrument

            exporter = InMemorySpanExporter()
            tracer_provider = TracerProvider()
            tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
            reader = InMemoryMetricReader()
            instrument(
                rt,
                tracer_provider=tracer_provider,
                meter_provider=MeterProvider(metric_readers=[reader]),
            )
        model = ScriptedModel(reply, chunks=chunks, latency=latency)
        agents = [rt.spawn(model=model, tools=[noop]) for _ in range(n)]
        by_id = {a.id: a for a in agents}
        left = dict.fromkeys(by_id, turns)
        remaining = [n * turns]
        lock, done = threading.Lock(), threading.Event()

        def settled(event: Any) -> None:
            agent_id = event.agent.id
            with lock:
                left[agent_id] -= 1
                more = left[agent_id] > 0
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()
            if more:
                by_id[agent_id].followup("hello")

        rt.on("agent/settled", settled)
        start, cpu = time.perf_counter(), time.process_time()
        for agent in agents:
            agent.followup("hello")
        if not done.wait(900):
            raise TimeoutError(f"{remaining[0]} turns did not settle")
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    spans = 0 if exporter is None else len(exporter.get_finished_spans())
    return {
        "turns_per_s": n * turns / wall,
        "cpu_us_per_turn": cpu * 1e6 / (n * turns),
        "spans": spans,
    }


# ---------------------------------------------------------------------- the SDK's floor


def floor(kind: str, turns: int) -> dict[str, Any]:
    """CPU per turn of one kind of floor (see the module's docstring)."""
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    batch = kind == "sdk batch"
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    tracer_provider.add_span_processor(processor)
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    if kind == "export":
        one = _exporter_turn(tracer_provider, meter_provider)
    else:
        one = _sdk_turn(
            trace.get_tracer("corral", tracer_provider=tracer_provider),
            meter_provider,
            spans=kind != "sdk measurements",
            measurements=kind != "sdk spans",
        )
    warm = min(turns, 500)
    for i in range(warm):  # warm: the aggregations exist, the code is hot
        one(i)
    tracer_provider.force_flush()
    exporter.clear()
    cpu = time.process_time()
    for i in range(turns):
        one(i)
    tracer_provider.force_flush()  # (a batch processor's worker exports the rest)
    cpu = time.process_time() - cpu
    spans = len(exporter.get_finished_spans())
    data = reader.get_metrics_data()
    recorded = sum(
        point.count
        for rm in (data.resource_metrics if data is not None else ())
        for scope in rm.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
        if hasattr(point, "count")  # the histograms (corral.turns is not measured a turn)
    )
    tracer_provider.shutdown()
    meter_provider.shutdown()
    return {
        "cpu_us_per_turn": cpu * 1e6 / turns,
        "spans_per_turn": spans / turns,
        "measurements_per_turn": recorded / (warm + turns),
    }


def _sdk_turn(tracer: Any, meter_provider: Any, *, spans: bool, measurements: bool) -> Any:
    """One turn's SDK calls as ``runtime.telemetry`` makes them, written out by hand."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    from runtime.telemetry import semconv as sc

    meter = meter_provider.get_meter("corral")
    tokens = meter.create_histogram(
        sc.METRIC_TOKEN_USAGE, "{token}", explicit_bucket_boundaries_advisory=sc.TOKEN_BUCKETS
    )
    duration = meter.create_histogram(
        sc.METRIC_OPERATION_DURATION, "s", explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS
    )
    first_chunk = meter.create_histogram(
        sc.METRIC_TIME_TO_FIRST_CHUNK, "s", explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS
    )
    agent = "1a2339a8115ce479fb82065"
    base = {
        sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
        sc.GEN_AI_AGENT_ID: agent,
        sc.GEN_AI_CONVERSATION_ID: agent,
    }
    chat = {
        sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
        sc.GEN_AI_PROVIDER_NAME: "scripted",
        sc.GEN_AI_REQUEST_MODEL: "scripted",
    }
    inputs = chat | {sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_INPUT}
    outputs = chat | {sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_OUTPUT}

    def one(i: int) -> None:
        t0 = time.time_ns()
        if measurements:
            for _ in range(2):
                tokens.record(12, inputs)
                tokens.record(9, outputs)
                duration.record(0.0002, chat)
                first_chunk.record(0.0001, chat)
        if not spans:
            return
        span = tracer.start_span(
            sc.OP_INVOKE_AGENT,
            kind=SpanKind.INTERNAL,
            attributes=base
            | {
                sc.CORRAL_TURN: i,
                sc.CORRAL_TURN_TRIGGER: "message",
                sc.CORRAL_TURN_OUTCOME: "completed",
            },
            start_time=t0,
        )
        context = trace.set_span_in_context(span)
        for step, reason in ((1, "tool_calls"), (2, "stop")):
            tracer.start_span(
                "chat scripted",
                context=context,
                kind=SpanKind.CLIENT,
                attributes=chat
                | {
                    sc.CORRAL_STEP: step,
                    sc.GEN_AI_RESPONSE_FINISH_REASONS: (reason,),
                    sc.GEN_AI_USAGE_INPUT_TOKENS: 12,
                    sc.GEN_AI_USAGE_OUTPUT_TOKENS: 9,
                },
                start_time=t0 + step * 1000,
            ).end(end_time=t0 + step * 1000 + 500)
        tracer.start_span(
            "execute_tool noop",
            context=context,
            kind=SpanKind.INTERNAL,
            attributes={
                sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
                sc.GEN_AI_TOOL_NAME: "noop",
                sc.GEN_AI_TOOL_CALL_ID: "call_1",
            },
            start_time=t0 + 1600,
        ).end(end_time=t0 + 1800)
        span.end(end_time=t0 + 3000)

    return one


def _exporter_turn(tracer_provider: Any, meter_provider: Any) -> Any:
    """The same turn made by corral's exporter from the records its tap would keep."""
    from runtime.telemetry.export import TurnExporter
    from runtime.telemetry.records import StepRecord, ToolRecord, TurnRecord
    from storage import (
        AssistantMessage,
        AssistantMessageData,
        RequestConfig,
        RequestHeader,
        TextBlock,
        ToolCallData,
        ToolMessage,
        ToolResultData,
        Usage,
    )

    exporter = TurnExporter(tracer_provider, meter_provider, capture_content=False)
    agent = "1a2339a8115ce479fb82065"
    base = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": agent}
    base["gen_ai.conversation.id"] = agent
    config = RequestConfig(provider="scripted", model="scripted")
    header = RequestHeader(turn=1, step=1, config=config)
    usage = Usage(input_tokens=12, output_tokens=9)

    def reply(step: int, finish: Any) -> AssistantMessageData:
        message = AssistantMessage(content=(TextBlock(text="ok"),))
        return AssistantMessageData(
            turn=1, step=step, message=message, usage=usage, finish_reason=finish
        )

    replies = (reply(1, "tool-calls"), reply(2, "stop"))
    call = ToolCallData(turn=1, step=1, call_id="call_1", name="noop", arguments="{}")
    result = ToolResultData(
        turn=1,
        step=1,
        message=ToolMessage(call_id="call_1", name="noop", content=(TextBlock(text="ok"),)),
    )

    def one(i: int) -> None:
        t0 = time.time_ns()
        turn = TurnRecord(turn=i, trigger="message", start_ns=t0, outcome="completed")
        for step in (1, 2):
            start = t0 + step * 1000
            turn.steps.append(
                StepRecord(
                    step=step,
                    start_ns=start,
                    header=header,
                    first_ns=start + 100,
                    end_ns=start + 500,
                    reply=replies[step - 1],
                )
            )
        turn.tools["call_1"] = ToolRecord(
            start_ns=t0 + 1600, call=call, end_ns=t0 + 1800, result=result
        )
        exporter.export(base, turn, t0 + 3000)

    return one


# ---------------------------------------------------------------------- the driver


def _child(args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"case {args} failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        n, turns, chunks = (int(v) for v in sys.argv[2:5])
        print(json.dumps(run(n, turns, chunks, float(sys.argv[5]), sys.argv[6])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--floor-child":
        print(json.dumps(floor(sys.argv[2], int(sys.argv[3]))))
        return
    p = parser(__doc__.splitlines()[0], repeats=3)
    p.add_argument("--agents", type=int, default=1000, help="agents (default 1000)")
    p.add_argument("--turns", type=int, default=5, help="turns per agent (default 5)")
    p.add_argument("--chunks", type=int, default=8, help="chunks per reply (default 8)")
    p.add_argument(
        "--latency",
        type=float,
        default=0.0,
        help="model latency per request, seconds (default 0: the CPU-bound worst case)",
    )
    p.add_argument(
        "--floor-turns",
        type=int,
        default=5000,
        help="turns per floor case (default 5000; 0 skips the floor)",
    )
    args = p.parse_args()

    floors: dict[str, list[dict[str, Any]]] = {kind: [] for kind in FLOORS}
    if args.floor_turns:
        for _ in range(args.repeats):
            for kind in FLOORS:
                floors[kind].append(_child(["--floor-child", kind, str(args.floor_turns)]))
    floor_cpu = {k: median([r["cpu_us_per_turn"] for r in v]) for k, v in floors.items() if v}

    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    shape = [str(v) for v in (args.agents, args.turns, args.chunks, args.latency)]
    for _ in range(args.repeats):  # alternate, so that load drifts hit every case alike
        for case in CASES:
            runs[case].append(_child(["--child", *shape, case]))
    tps = {case: median([r["turns_per_s"] for r in runs[case]]) for case in CASES}
    cpu = {case: median([r["cpu_us_per_turn"] for r in runs[case]]) for case in CASES}
    expected = args.agents * args.turns * SPANS_PER_TURN
    # At a CPU-bound 0.85x, a turn may cost telemetry 1/0.85 - 1 of what it costs off.
    budget = cpu["off"] * (1 / 0.85 - 1)
    results = {
        "agents": args.agents,
        "turns": args.turns,
        "chunks": args.chunks,
        "latency_s": args.latency,
        "off_turns_per_s": tps["off"],
        "noop_turns_per_s": tps["no-op"],
        "on_turns_per_s": tps["on"],
        "ratio_on_vs_off": tps["on"] / tps["off"],
        "ratio_noop_vs_off": tps["no-op"] / tps["off"],
        "off_cpu_us_per_turn": cpu["off"],
        "noop_cpu_us_per_turn": cpu["no-op"],
        "on_cpu_us_per_turn": cpu["on"],
        "corral_cpu_us_per_turn": cpu["no-op"] - cpu["off"],
        "sdk_cpu_us_per_turn": cpu["on"] - cpu["no-op"],
        "budget_cpu_us_per_turn": budget,
        "floor_cpu_us_per_turn": floor_cpu,
        "spans_per_run": [r["spans"] for r in runs["on"]],
        "spans_expected": expected,
        "runs": runs,
        "floor_runs": floors,
    }
    if floor_cpu:
        print(
            f"the SDK's floor, CPU us a turn ({SPANS_PER_TURN} spans, "
            f"{MEASUREMENTS_PER_TURN} measurements; {args.floor_turns} turns):"
        )
        print_table(["floor", "cpu us/turn"], [[k, v] for k, v in floor_cpu.items()])
        print()
    print_table(
        ["telemetry", "turns/s", "cpu us/turn"],
        [
            ["off", tps["off"], cpu["off"]],
            ["no-op providers", tps["no-op"], cpu["no-op"]],
            ["on (SDK, in-memory)", tps["on"], cpu["on"]],
        ],
    )
    print(
        f"ratio on/off: {tps['on'] / tps['off']:.3f} (target >= 0.85; no-op/off "
        f"{tps['no-op'] / tps['off']:.3f}); telemetry's CPU a turn: corral "
        f"{cpu['no-op'] - cpu['off']:.0f} us + SDK {cpu['on'] - cpu['no-op']:.0f} us against "
        f"a budget of {budget:.0f} us at 0.85x; spans per run {results['spans_per_run']}"
    )
    if any(s != expected for s in results["spans_per_run"]):
        raise SystemExit(f"expected {expected} spans per run, got {results['spans_per_run']}")
    write_json(args.json, "telemetry", results)


if __name__ == "__main__":
    main()
