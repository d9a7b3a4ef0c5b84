"""Agents at scale: spawn N, one turn each, passivate; time and RSS per agent.

Each case runs in a fresh subprocess on a durable store (``write-ahead``), with
``ScriptedModel.echo()``:

1. spawn N agents: ``rt.spawn_many(N, ...)`` (the batch spawn), and as the baseline in
   the same run ``rt.spawn(...)`` called N times;
2. one turn each (every followup sent at once, then ``rt.flush()``; ``--wave W``: to W
   agents at a time, each wave settled before the next);
3. ``rt.passivate_idle()``: every agent evicted until its next send.

RSS is the process's resident set (``/proc/self/status``) after each phase, less what
it was before the first spawn, divided by N, split into anonymous memory (``RssAnon``:
the Python heap and malloc, the agents' own memory) and file-backed pages (``RssFile``:
LMDB's map, page cache the kernel may evict); the peak is ``ru_maxrss``. Freed memory
is not always given back to the OS (pymalloc frees an arena only once all of it is
free), so the RSS after passivation bounds what a passivated agent holds from above.
``--holders`` adds a tracemalloc census (in its own subprocess, 2,000 agents): the bytes
an idle agent holds, by the line that allocated them, resident after its turn and once
passivated.

    python benchmarks/bench_scale.py                        # 100,000 agents, baseline 10,000
    python benchmarks/bench_scale.py --agents 1000000 --baseline-agents 10000 --json out.json
    python benchmarks/bench_scale.py --agents 10000 --holders
"""

from __future__ import annotations

import gc
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import median, parser, print_table, write_json

_STATUS_FIELDS = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}


def _rss() -> dict[str, int]:
    """The resident set, and its split: anonymous memory (the Python heap, malloc) and
    file-backed pages (LMDB's map: page cache the kernel may evict), from
    ``/proc/self/status``."""
    found: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in _STATUS_FIELDS:
                found[_STATUS_FIELDS[name]] = int(value.split()[0]) * 1024  # kB
    return found


def _per_agent(result: dict[str, Any], phase: str, base: dict[str, int], n: int) -> None:
    now = _rss()
    for key, value in now.items():
        result[f"{key}_{phase}_b_per_agent"] = (value - base[key]) / n


def _spawn(rt: Any, n: int, model: Any, batch: bool) -> list[Any]:
    if batch:
        return list(rt.spawn_many(n, model=model))
    return [rt.spawn(model=model) for _ in range(n)]


def _one_turn_each(rt: Any, agents: list[Any], wait_s: float) -> None:
    left = [len(agents)]
    done = threading.Event()
    lock = threading.Lock()

    def settled(_event: Any) -> None:
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    dispose = rt.on("agent/settled", settled)
    for agent in agents:
        agent.followup("hello")
    if not done.wait(wait_s):
        raise TimeoutError(f"{left[0]} of {len(agents)} turns did not settle in {wait_s} s")
    dispose()
    rt.flush()


def run_case(n: int, batch: bool, turns: bool, wave: int = 0) -> dict[str, Any]:
    from runtime import Runtime, ScriptedModel

    with tempfile.TemporaryDirectory() as tmp, Runtime.open(Path(tmp) / "store") as rt:
        model = ScriptedModel.echo()
        _spawn(rt, 10, model, batch)  # warm: imports, first-use caches
        gc.collect()
        base = _rss()
        start, cpu = time.perf_counter(), time.process_time()
        agents = _spawn(rt, n, model, batch)
        result: dict[str, Any] = {
            "agents": n,
            "batch": batch,
            "spawn_s": time.perf_counter() - start,
            "spawn_cpu_us_per_agent": (time.process_time() - cpu) * 1e6 / n,
        }
        result["spawns_per_s"] = n / result["spawn_s"]
        _per_agent(result, "spawned", base, n)
        if turns:
            start = time.perf_counter()
            for first in range(0, n, wave or n):  # (wave 0: every followup at once)
                _one_turn_each(rt, agents[first : first + (wave or n)], max(600.0, n / 200))
            result["turns_s"] = time.perf_counter() - start
            time.sleep(1.0)  # the log writer compacts its journal copy once idle (0.5 s)
            gc.collect()
            _per_agent(result, "idle", base, n)
            start = time.perf_counter()
            passivated = rt.passivate_idle(timeout=60)
            result["passivate_s"] = time.perf_counter() - start
            result["passivated"] = passivated
            gc.collect()
            _per_agent(result, "passivated", base, n)
        result["rss_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        start = time.perf_counter()
    result["close_s"] = time.perf_counter() - start
    return result


def holders(n: int, top: int) -> dict[str, Any]:
    """Bytes per idle agent by allocating line (tracemalloc), resident and passivated."""
    from runtime import Runtime, ScriptedModel

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, Runtime.open(Path(tmp) / "store") as rt:
        model = ScriptedModel.echo()
        _one_turn_each(rt, _spawn(rt, 100, model, batch=False), 60)
        gc.collect()
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        _one_turn_each(rt, _spawn(rt, n, model, batch=True), 120)
        for phase in ("resident", "passivated"):
            if phase == "passivated":
                rt.passivate_idle(timeout=60)
            time.sleep(1.0)  # as in run_case
            gc.collect()
            stats = tracemalloc.take_snapshot().compare_to(before, "lineno")
            root = str(Path(__file__).resolve().parent.parent) + "/"
            out[phase] = {
                "bytes_per_agent": sum(s.size_diff for s in stats) / n,
                "blocks_per_agent": sum(s.count_diff for s in stats) / n,
                "top": [
                    [
                        f"{s.traceback[0].filename.replace(root, '')}:{s.traceback[0].lineno}",
                        round(s.size_diff / n),
                        round(s.count_diff / n, 2),
                    ]
                    for s in stats[:top]
                ],
            }
        tracemalloc.stop()
    return out


def _child(argv: list[str]) -> None:
    if argv[0] == "holders":
        print(json.dumps(holders(int(argv[1]), int(argv[2]))))
    else:
        wave = int(argv[4]) if len(argv) > 4 else 0
        print(json.dumps(run_case(int(argv[1]), argv[2] == "batch", argv[3] == "1", wave)))


def _in_child(*args: object) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=7200, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"case {args} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _split(r: dict[str, Any], phase: str) -> str:
    if f"rss_{phase}_b_per_agent" not in r:
        return "-"
    total, anon, file = (r[f"{k}_{phase}_b_per_agent"] for k in ("rss", "anon", "file"))
    return f"{total:,.0f} ({anon:,.0f} + {file:,.0f})"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    p = parser(__doc__.splitlines()[0], repeats=1)
    p.add_argument("--agents", type=int, default=100_000, help="agents (default 100,000)")
    p.add_argument(
        "--baseline-agents",
        type=int,
        default=10_000,
        help="agents for the baseline, rt.spawn one at a time (default 10,000; 0: none)",
    )
    p.add_argument(
        "--wave",
        type=int,
        default=0,
        help="send the followups to this many agents at a time, each wave settled before "
        "the next (default 0: all at once; the turns' peak of live objects is then left "
        "behind as partly used allocator pools)",
    )
    p.add_argument("--holders", action="store_true", help="also a tracemalloc census")
    p.add_argument("--top", type=int, default=25, help="lines in the census (default 25)")
    args = p.parse_args()
    results: dict[str, Any] = {}
    rows: list[list[object]] = []
    cases = [("spawn_many", args.agents, "batch", True)]
    if args.baseline_agents:
        cases += [
            ("spawn_many", args.baseline_agents, "batch", False),
            ("spawn (baseline)", args.baseline_agents, "each", False),
        ]
    for label, n, how, turns in cases:
        reps = [_in_child("case", n, how, int(turns), args.wave) for _ in range(args.repeats)]
        r = {
            k: median([x[k] for x in reps]) if isinstance(v, float) else v
            for k, v in reps[0].items()
        }
        results[f"{label} x {n}{'' if turns else ', spawn only'}"] = r
        rows.append(
            [
                f"{label} x {n:,}",
                r["spawn_s"],
                r["spawn_cpu_us_per_agent"],
                r["rss_spawned_b_per_agent"],
                _split(r, "idle"),
                _split(r, "passivated"),
                r["rss_peak_mb"],
            ]
        )
    if args.baseline_agents:
        each = results[f"spawn (baseline) x {args.baseline_agents}, spawn only"]
        many = results[f"spawn_many x {args.baseline_agents}, spawn only"]
        results["spawn_speedup_batch_vs_each"] = each["spawn_s"] / many["spawn_s"]
        # CPU (every thread of the process): steadier than wall time on a shared machine.
        results["spawn_cpu_ratio_each_vs_batch"] = (
            each["spawn_cpu_us_per_agent"] / many["spawn_cpu_us_per_agent"]
        )
    print_table(
        [
            "case",
            "spawn s",
            "spawn CPU µs/agent",
            "RSS B/agent spawned",
            "idle after a turn (anon + file)",
            "passivated (anon + file)",
            "peak RSS MB",
        ],
        rows,
    )
    if "spawn_speedup_batch_vs_each" in results:
        print(
            f"batch spawn vs one at a time: {results['spawn_speedup_batch_vs_each']:.2f}x "
            f"faster (wall), {results['spawn_cpu_ratio_each_vs_batch']:.2f}x less CPU"
        )
    if args.holders:
        census = results["holders"] = _in_child("holders", 2000, args.top)
        for phase, found in census.items():
            print(
                f"\n{phase}: {found['bytes_per_agent']:,.0f} B/agent in "
                f"{found['blocks_per_agent']:.0f} blocks (tracemalloc), the top lines:"
            )
            for where, size, blocks in found["top"]:
                print(f"  {size:6,} B {blocks:6.2f} blocks  {where}")
    write_json(args.json, "bench_scale", results)


if __name__ == "__main__":
    main()
