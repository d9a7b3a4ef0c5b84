"""What a real HTTP provider costs: N agents streaming through OpenAICompatModel.

N concurrent agents (default 1,000) each run T turns; every reply streams C text chunks.
Three cases, each in a fresh subprocess, same runtime settings:

- ``scripted/inline``: ``runtime.ScriptedModel`` with no latency (answers inline, the
  baseline of ``bench_turns``);
- ``scripted/io``: ``ScriptedModel`` with a 1 us latency, so every reply streams through
  the I/O loop like a vendor's does (the same path minus HTTP);
- ``openai/http``: ``OpenAICompatModel`` (official ``openai`` SDK, pooled ``httpx2``
  connections) against the loopback wire server running in its own process.

Reported: turns/s, streamed chunks/s, turn latency p50/p99, and the provider's overhead
per streamed chunk: ``(wall_http - wall_baseline) / chunks`` against each baseline. The
wire server shares the machine (2 cores here), so its CPU is part of the HTTP cost.

    python benchmarks/bench_providers.py                 # 1,000 agents x 3 turns x 20 chunks
    python benchmarks/bench_providers.py --quick --json out.json
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import median, parser, print_table, write_json

CASES = ("scripted/inline", "scripted/io", "openai/http")


def _model(case: str, chunks: int, port: int) -> Any:
    if case == "openai/http":
        from runtime.providers import OpenAICompatModel

        return OpenAICompatModel("bench", base_url=f"http://127.0.0.1:{port}/v1", timeout=120)
    from runtime import ScriptedModel

    text = "".join(f"w{n:03d} " for n in range(chunks))  # the server's reply, same chunks
    latency = 1e-6 if case == "scripted/io" else 0.0
    return ScriptedModel(lambda _request: text, chunks=chunks, latency=latency, name="bench")


def run_child(
    case: str, agents: int, turns: int, chunks: int, durability: str, port: int
) -> dict[str, Any]:
    from runtime import Runtime
    from runtime.load import FAST_RETRY, LoadSpec, run_load

    model = _model(case, chunks, port)
    with tempfile.TemporaryDirectory() as tmp:
        rt = Runtime.open(Path(tmp) / "store", durability=durability, retry_policy=FAST_RETRY)  # type: ignore[arg-type]
        try:
            report = run_load(rt, LoadSpec(agents=agents, turns=turns, timeout_s=900), model=model)
        finally:
            if hasattr(model, "aclose"):
                asyncio.run_coroutine_threadsafe(model.aclose(), rt.io.loop).result(30)
            rt.close()
    streamed = report.settled * chunks
    return {
        "case": case,
        "agents": agents,
        "turns": report.settled,
        "errored": report.errored,
        "retried": report.retried,
        "timed_out": report.timed_out,
        "wall_s": report.wall_s,
        "turns_per_s": report.turns_per_s,
        "chunks": streamed,
        "chunks_per_s": streamed / report.wall_s if report.wall_s else 0.0,
        "p50_ms": report.latency_ms.p50,
        "p99_ms": report.latency_ms.p99,
        "rss_peak_mb": report.rss_peak_mb,
    }


def run_case(
    case: str, agents: int, turns: int, chunks: int, durability: str, port: int
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        case,
        str(agents),
        str(turns),
        str(chunks),
        durability,
        str(port),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"case {case} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def start_server(chunks: int) -> tuple[subprocess.Popen[str], int]:
    root = Path(__file__).resolve().parent.parent
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.providers.wire_server", str(chunks)],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    if not line.strip():
        server.kill()
        raise RuntimeError("the wire server did not start")
    return server, int(line)


def _median_of(reports: list[dict[str, Any]]) -> dict[str, Any]:
    first = reports[0]
    return {
        k: median([r[k] for r in reports]) if isinstance(v, float) else v for k, v in first.items()
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        case, agents, turns, chunks, durability, port = sys.argv[2:]
        print(
            json.dumps(run_child(case, int(agents), int(turns), int(chunks), durability, int(port)))
        )
        return
    p = parser(__doc__.splitlines()[0], repeats=1)
    p.add_argument("--agents", type=int, default=1000, help="concurrent agents (default 1000)")
    p.add_argument("--turns", type=int, default=3, help="turns per agent (default 3)")
    p.add_argument("--chunks", type=int, default=20, help="text chunks per reply (default 20)")
    p.add_argument("--durability", default="write-ahead", help="runtime durability mode")
    p.add_argument("--quick", action="store_true", help="200 agents, 2 turns")
    args = p.parse_args()
    agents, turns = (200, 2) if args.quick else (args.agents, args.turns)
    server, port = start_server(args.chunks)
    try:
        results = {
            case: _median_of(
                [
                    run_case(case, agents, turns, args.chunks, args.durability, port)
                    for _ in range(args.repeats)
                ]
            )
            for case in CASES
        }
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(30)
    http = results["openai/http"]
    rows: list[list[object]] = []
    for case, r in results.items():
        r["overhead_us_per_chunk_vs_inline"] = (
            (http["wall_s"] - results["scripted/inline"]["wall_s"]) / http["chunks"] * 1e6
            if case == "openai/http"
            else None
        )
        r["overhead_us_per_chunk_vs_io"] = (
            (http["wall_s"] - results["scripted/io"]["wall_s"]) / http["chunks"] * 1e6
            if case == "openai/http"
            else None
        )
        ratio = r["turns_per_s"] / results["scripted/inline"]["turns_per_s"]
        r["throughput_vs_inline"] = ratio
        rows.append(
            [
                case,
                r["turns"],
                r["errored"],
                r["turns_per_s"],
                r["chunks_per_s"],
                r["p50_ms"],
                r["p99_ms"],
                f"{ratio:.2f}x",
            ]
        )
    print(f"{agents} agents x {turns} turns x {args.chunks} chunks, durability {args.durability}")
    print_table(
        ["case", "turns", "errored", "turns/s", "chunks/s", "p50 ms", "p99 ms", "vs inline"], rows
    )
    print(
        f"provider overhead per streamed chunk: {http['overhead_us_per_chunk_vs_io']:.1f} us vs "
        f"scripted/io, {http['overhead_us_per_chunk_vs_inline']:.1f} us vs scripted/inline"
    )
    write_json(
        args.json,
        "bench_providers",
        {"agents": agents, "turns": turns, "chunks": args.chunks, "cases": results},
    )


if __name__ == "__main__":
    main()
