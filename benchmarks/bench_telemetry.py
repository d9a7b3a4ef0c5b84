"""Turns per second with OpenTelemetry on (SDK, in-memory exporter) against off, same run.

N agents x T turns (each with one tool call, so every turn has an ``invoke_agent``, two
``chat`` and one ``execute_tool`` span), ``ScriptedModel`` streaming ``--chunks`` chunks
per reply, write-ahead durability. "on" is ``runtime.telemetry.instrument`` with the
SDK's ``TracerProvider`` + ``SimpleSpanProcessor`` (each span exported as it ends, on
the ending thread: the costliest processor) into an ``InMemorySpanExporter``, and a
``MeterProvider`` with an ``InMemoryMetricReader``. Each case runs in a fresh
subprocess; off and on alternate, ``--repeats`` times each; medians are compared.

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


def run(n: int, turns: int, chunks: int, latency: float, telemetry: bool) -> dict[str, Any]:
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
        if telemetry:
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


def case(n: int, turns: int, chunks: int, latency: float, telemetry: bool) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(n),
        str(turns),
        str(chunks),
        str(latency),
        str(int(telemetry)),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"case {cmd[3:]} failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        n, turns, chunks, on = (int(v) for v in (*sys.argv[2:5], sys.argv[6]))
        print(json.dumps(run(n, turns, chunks, float(sys.argv[5]), bool(on))))
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
    args = p.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(args.repeats):  # alternate, so that load drifts hit both alike
        for label in ("off", "on"):
            runs[label].append(
                case(args.agents, args.turns, args.chunks, args.latency, label == "on")
            )
    off = median([r["turns_per_s"] for r in runs["off"]])
    on = median([r["turns_per_s"] for r in runs["on"]])
    expected = args.agents * args.turns * 4  # invoke_agent + 2 chat + execute_tool
    results = {
        "agents": args.agents,
        "turns": args.turns,
        "chunks": args.chunks,
        "latency_s": args.latency,
        "off_turns_per_s": off,
        "on_turns_per_s": on,
        "ratio_on_vs_off": on / off,
        "off_cpu_us_per_turn": median([r["cpu_us_per_turn"] for r in runs["off"]]),
        "on_cpu_us_per_turn": median([r["cpu_us_per_turn"] for r in runs["on"]]),
        "spans_per_run": [r["spans"] for r in runs["on"]],
        "spans_expected": expected,
        "runs": runs,
    }
    print_table(
        ["telemetry", "turns/s", "cpu us/turn"],
        [
            ["off", off, results["off_cpu_us_per_turn"]],
            ["on (SDK, in-memory)", on, results["on_cpu_us_per_turn"]],
        ],
    )
    print(
        f"ratio on/off: {on / off:.3f} (target >= 0.85); spans per run {results['spans_per_run']}"
    )
    if any(s != expected for s in results["spans_per_run"]):
        raise SystemExit(f"expected {expected} spans per run, got {results['spans_per_run']}")
    write_json(args.json, "telemetry", results)


if __name__ == "__main__":
    main()
