"""Turns per second of N agents x T turns on a durable store, against the obvious design.

corral: PooledActors on a small dispatcher, the model on the I/O side (``ScriptedModel``
with zero latency answers inline), group-committed LMDB writes, write-ahead durability.
Baseline, measured in the same run: ``benchmarks/_naive.py`` (a ThreadingActor per agent,
a blocking model call, one sync write transaction per appended fact).

Each case runs in a fresh subprocess (its RSS peak is that process's). Every agent runs
T turns back to back: the next followup is sent when the previous turn settled.

    python benchmarks/bench_turns.py                 # 1,000 and 10,000 agents
    python benchmarks/bench_turns.py --quick --json out.json
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import median, parser, percentile, print_table, write_json


def _drive(n: int, turns: int, send: Any, wait_s: float) -> tuple[float, float, list[float]]:
    """Send T followups per agent back to back; returns wall seconds, process CPU seconds
    (every thread) and latencies."""
    lock = threading.Lock()
    remaining = [n * turns]
    done = threading.Event()
    sent_at: dict[Any, float] = {}
    count: dict[Any, int] = {}
    latencies: list[float] = []

    def settled(key: Any) -> None:
        now = time.perf_counter()
        with lock:
            latencies.append(now - sent_at[key])
            count[key] += 1
            more = count[key] < turns
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()
            if more:
                sent_at[key] = time.perf_counter()
        if more:
            send(key)

    keys = send.keys()
    for key in keys:
        count[key] = 0
    send.on_settled(settled)
    start, cpu = time.perf_counter(), time.process_time()
    for key in keys:
        sent_at[key] = time.perf_counter()
        send(key)
    if not done.wait(wait_s):
        raise TimeoutError(f"{remaining[0]} of {n * turns} turns did not settle in {wait_s} s")
    return time.perf_counter() - start, time.process_time() - cpu, latencies


class _CorralSender:
    def __init__(self, rt: Any, agents: list[Any]) -> None:
        self.by_id = {a.id: a for a in agents}
        self._settled: Any = None
        rt.on("agent/settled", self._on)

    def keys(self) -> list[str]:
        return list(self.by_id)

    def __call__(self, key: str) -> None:
        self.by_id[key].followup("hello")

    def on_settled(self, fn: Any) -> None:
        self._settled = fn

    def _on(self, event: Any) -> None:
        self._settled(event.agent.id)


def run_corral(
    n: int, turns: int, tool: bool, durability: str, threads: int | None
) -> dict[str, Any]:
    from runtime import Runtime, ScriptedModel, ToolCall
    from runtime import tool as make_tool
    from storage.events import UserMessage

    @make_tool(concurrency_safe=True)
    def noop() -> str:
        return "ok"

    def reply(request: Any) -> Any:
        last = request.messages[-1]
        if tool and isinstance(last, UserMessage):
            return [ToolCall(name="noop")]
        return "ok"

    with (
        tempfile.TemporaryDirectory() as tmp,
        Runtime.open(Path(tmp) / "store", durability=durability, threads=threads) as rt,
    ):
        model = ScriptedModel(reply)
        start = time.perf_counter()
        agents = [rt.spawn(model=model, tools=[noop] if tool else []) for _ in range(n)]
        spawn = time.perf_counter() - start
        sender = _CorralSender(rt, agents)
        wall, cpu, latencies = _drive(n, turns, sender, wait_s=900)
        # "Durable events/s": charge what the writer still has to commit (with durability
        # `turn` or `none` a settled turn's facts may not be committed yet).
        start, cpu_start = time.perf_counter(), time.process_time()
        rt.flush()
        wall += time.perf_counter() - start
        cpu += time.process_time() - cpu_start
        events = sum(a.session.last_seq + 1 for a in agents)
        # Not in turns/s (everything is durable already), reported beside it: the close
        # compacts what the log writer had not compacted yet, housekeeping that a
        # long run does as it goes.
        start = time.perf_counter()
        rt.close()
        close = time.perf_counter() - start
    return _report(wall, cpu, latencies, events, n, turns, close) | {"spawn_s": spawn}


class _NaiveSender:
    def __init__(self, host: Any, n: int) -> None:
        self.host = host
        self.n = n

    def keys(self) -> list[int]:
        return list(range(self.n))

    def __call__(self, key: int) -> None:
        self.host.send(key, "hello")

    def on_settled(self, fn: Any) -> None:
        self.host.set_on_done(fn)


def run_naive(n: int, turns: int, tool: bool) -> dict[str, Any]:
    from benchmarks._naive import NaiveHost

    with tempfile.TemporaryDirectory() as tmp:
        host = NaiveHost(Path(tmp) / "naive", n, tool=tool)
        try:
            wall, cpu, latencies = _drive(n, turns, _NaiveSender(host, n), wait_s=900)
        finally:
            events = host.events
            start = time.perf_counter()
            host.close()
            close = time.perf_counter() - start
    return _report(wall, cpu, latencies, events, n, turns, close)


def _report(
    wall: float, cpu: float, latencies: list[float], events: int, n: int, turns: int, close: float
) -> dict[str, Any]:
    return {
        "agents": n,
        "turns": n * turns,
        "wall_s": wall,
        "turns_per_s": n * turns / wall,
        "close_ms": close * 1000,
        "turns_per_s_close_charged": n * turns / (wall + close),
        "cpu_us_per_turn": cpu * 1e6 / (n * turns),  # every thread: steadier than wall time
        "events": events,
        "events_per_s": events / wall,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def child(argv: list[str]) -> None:
    system, n, turns, tool, durability, threads = argv
    if system == "corral":
        result = run_corral(int(n), int(turns), tool == "1", durability, int(threads) or None)
    else:
        result = run_naive(int(n), int(turns), tool == "1")
    print(json.dumps(result))


def run_case(
    system: str, n: int, turns: int, tool: bool, durability: str, threads: int
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        system,
        str(n),
        str(turns),
        "1" if tool else "0",
        durability,
        str(threads),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"case {cmd[3:]} failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    p = parser(__doc__.splitlines()[0], repeats=1)
    p.add_argument("--sizes", default="1000,10000", help="agent counts (default 1000,10000)")
    p.add_argument("--turns", type=int, default=10, help="turns per agent (default 10)")
    p.add_argument("--baseline-turns", type=int, default=2, help="turns per agent for the baseline")
    p.add_argument("--modes", default="write-ahead", help="corral durability modes to report")
    p.add_argument("--threads", type=int, default=0, help="dispatcher threads (0: default)")
    p.add_argument("--quick", action="store_true", help="100 and 1,000 agents, 3 turns")
    args = p.parse_args()
    if args.baseline_turns < 1 or args.turns < 1:
        p.error("--turns and --baseline-turns must be at least 1 (every ratio needs both)")
    sizes = [100, 1000] if args.quick else [int(s) for s in args.sizes.split(",")]
    turns = 3 if args.quick else args.turns
    rows: list[list[object]] = []
    results: dict[str, Any] = {}
    for n in sizes:
        for tool in (False, True):
            label = f"{n} agents{' +tool' if tool else ''}"
            runs: dict[str, Any] = {}
            for mode in args.modes.split(","):
                reps = [
                    run_case("corral", n, turns, tool, mode, args.threads)
                    for _ in range(args.repeats)
                ]
                runs[f"corral/{mode}"] = _median_of(reps)
            base = [
                run_case("naive", n, args.baseline_turns, tool, "write-ahead", 0)
                for _ in range(args.repeats)
            ]
            runs["baseline"] = _median_of(base)
            for name, r in runs.items():
                ratio = r["turns_per_s"] / runs["baseline"]["turns_per_s"]
                r["ratio_vs_baseline"] = ratio
                rows.append(
                    [
                        label,
                        name,
                        r["turns_per_s"],
                        r["cpu_us_per_turn"],
                        r["events_per_s"],
                        r["p50_ms"],
                        r["p99_ms"],
                        r["rss_peak_mb"],
                        r["close_ms"],
                        f"{ratio:.1f}x",
                    ]
                )
            results[label] = runs
    print_table(
        [
            "case",
            "system",
            "turns/s",
            "CPU µs/turn",
            "events/s",
            "p50 ms",
            "p99 ms",
            "RSS MB",
            "close ms",
            "vs baseline",
        ],
        rows,
    )
    write_json(args.json, "bench_turns", results)


def _median_of(reports: list[dict[str, Any]]) -> dict[str, Any]:
    keys = reports[0].keys()
    return {
        k: median([r[k] for r in reports]) if isinstance(reports[0][k], float) else reports[0][k]
        for k in keys
    }


if __name__ == "__main__":
    main()
