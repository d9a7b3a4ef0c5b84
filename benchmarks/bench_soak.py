"""Memory soak: RSS over many turns across many agents (is memory bounded?).

N agents (``ScriptedModel.echo()``, zero latency, a durable store, ``write-ahead``)
run T turns in total, in R rounds: in a round each agent runs T / (N x R) turns back to
back (its next followup is sent when its previous turn settled), then every agent is
idle. Every ``--sample-every`` turns (and at each round's end) the process RSS (psutil),
Python's allocated blocks, the elapsed time and the facts held in memory by the sessions
are recorded (a session keeps only the facts not yet known durable; the rest it reads
back from the store).
At the end, the size of the model-visible histories (each resident session's
``SurfaceProjection``, needed for every model request) is measured too.

Two cases, each in a fresh interpreter (nothing else shares its heap), measured in the
same run: ``resident`` keeps every agent in memory (its session: projections and the
not-yet-durable tail), ``passivated`` evicts the idle agents with ``rt.passivate_idle()``
at each round's end (the next followup rehydrates them from the log). The report is
the curve (a table per case, and ``--json``), the RSS growth per 1,000 turns fitted by
least squares over the first and the second half of the run, and a verdict: *bounded*
when the second half grows by at most 10% of the first half's rate (or under 16 KB per
1,000 turns), *linear* otherwise; then passivated / resident ratios. RSS includes the
pages of the store's LMDB memory map (file-backed, growing with the store), so the same
figures are also given for the *heap*: RSS minus file-backed pages.

    python benchmarks/bench_soak.py --quick                 # 10,000 turns per case
    python benchmarks/bench_soak.py --json soak.json        # 100,000 turns, 1,000 agents
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import parser, print_table, write_json

MB = 1 << 20


@dataclass(frozen=True)
class Sample:
    turns: int
    seconds: float
    rss: int
    heap: int
    """RSS minus its file-backed pages (the LMDB memory map): the process's own memory."""
    blocks: int
    """Python's allocated blocks (live objects): growth here is retention, not fragmentation."""
    facts: int


def slope_per_1000(samples: list[Sample], field: str = "rss") -> float:
    """Least-squares growth of ``field`` (RSS) in bytes per 1,000 turns over ``samples``."""
    if len(samples) < 2:
        return 0.0
    xs = [s.turns for s in samples]
    ys = [getattr(s, field) for s in samples]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return 1000 * cov / var if var else 0.0


def deep_size(value: object) -> int:
    """Bytes of the Python objects reachable from ``value`` (containers, structs, str;
    shared objects counted once)."""
    import msgspec

    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, msgspec.Struct):
            stack.extend(getattr(item, name) for name in item.__struct_fields__)
    return total


def run(
    case: str, agents: int, turns: int, every: int, rounds: int, cohorts: int, store: Path
) -> dict[str, Any]:
    """One case in this process: ``resident`` keeps every agent in memory, ``passivated``
    evicts the idle agents (``rt.passivate_idle()``) at the end of every round. Round
    ``r`` drives cohort ``r % cohorts`` of the agents (all of them with one cohort)."""
    from runtime import Runtime, ScriptedModel

    process = psutil.Process()
    gc.collect()
    rss_start = process.memory_info().rss
    blocks_start = sys.getallocatedblocks()
    active = agents // cohorts
    per_round = max(1, turns // (active * rounds))
    total = per_round * active * rounds
    samples: list[Sample] = []
    lock = threading.Lock()
    round_done = threading.Event()
    left: dict[str, int] = {}
    count = [0]
    outstanding = [0]
    passivated = 0
    round_ends: list[dict[str, int]] = []
    rt = Runtime.open(store)
    try:
        handles = [rt.spawn(model=ScriptedModel.echo()) for _ in range(agents)]
        by_id = {agent.id: agent for agent in handles}
        gc.collect()
        spawned = process.memory_info()
        rss_spawned, heap_spawned = spawned.rss, spawned.rss - spawned.shared
        start = time.perf_counter()

        def facts_held() -> int:
            return sum(a.session.resident_events for a in handles if not a.passive)

        def sample(n: int) -> None:
            memory = process.memory_info()
            heap = memory.rss - memory.shared
            seconds = time.perf_counter() - start
            taken = Sample(n, seconds, memory.rss, heap, sys.getallocatedblocks(), facts_held())
            with lock:
                samples.append(taken)

        def settled(event: Any) -> None:
            agent_id = event.agent.id
            with lock:
                count[0] += 1
                n = count[0]
                left[agent_id] -= 1
                more = left[agent_id] > 0
                if not more:
                    outstanding[0] -= 1
                    if outstanding[0] == 0:
                        round_done.set()
            if n % every == 0:
                sample(n)
            if more:
                by_id[agent_id].followup(f"turn {per_round - left[agent_id]}")

        rt.on("agent/settled", settled)
        for number in range(rounds):
            cohort = handles[number % cohorts :: cohorts][:active]
            round_done.clear()
            with lock:
                left.update((agent.id, per_round) for agent in cohort)
                outstanding[0] = len(cohort)
            for agent in cohort:
                agent.followup("turn 0")
            if not round_done.wait(max(600.0, total / 50)):
                raise TimeoutError(f"only {count[0]} of {total} turns settled")
            if case == "passivated":
                passivated += rt.passivate_idle()
            gc.collect()
            # What the round left behind (after passivation, in that case): Python's
            # allocated blocks and the resident histories, free of in-flight turns.
            memory = process.memory_info()
            round_ends.append(
                {
                    "turns": count[0],
                    "blocks": sys.getallocatedblocks(),
                    "heap": memory.rss - memory.shared,
                    "history_bytes": sum(
                        deep_size(a.session.messages()) for a in handles if not a.passive
                    ),
                }
            )
            if count[0] % every:
                sample(count[0])
        wall = time.perf_counter() - start
        rt.flush()
        stats = rt.store.statistics()
        history = sum(deep_size(a.session.messages()) for a in handles if not a.passive)
    finally:
        rt.close()
    samples.sort(key=lambda s: s.turns)
    half = len(samples) // 2
    first, second = slope_per_1000(samples[: half + 1]), slope_per_1000(samples[half:])
    peak_facts = max((s.facts for s in samples), default=0)
    grown = samples[-1].rss - rss_spawned if samples else 0
    bounded = second <= max(0.1 * first, 16 * 1024)
    heap_first = slope_per_1000(samples[: half + 1], "heap")
    heap_second = slope_per_1000(samples[half:], "heap")
    heap_grown = samples[-1].heap - heap_spawned if samples else 0
    heap_bounded = heap_second <= max(0.1 * heap_first, 16 * 1024)
    disk = sum(p.stat().st_size for p in store.iterdir())
    return {
        "case": case,
        "agents": agents,
        "turns": total,
        "rounds": rounds,
        "cohorts": cohorts,
        "passivated": passivated,
        "wall_s": wall,
        "turns_per_s": total / wall,
        "rss_start": rss_start,
        "rss_spawned": rss_spawned,
        "rss_end": samples[-1].rss if samples else 0,
        "rss_peak": max((s.rss for s in samples), default=0),
        "allocated_blocks_start": blocks_start,
        "growth_per_1000_first_half": first,
        "growth_per_1000_second_half": second,
        "bytes_per_turn": grown / total,
        "heap_spawned": heap_spawned,
        "heap_end": samples[-1].heap if samples else 0,
        "heap_growth_per_1000_first_half": heap_first,
        "heap_growth_per_1000_second_half": heap_second,
        "heap_bytes_per_turn": heap_grown / total,
        "heap_verdict": "bounded" if heap_bounded else "linear (not bounded)",
        "facts_held_peak": peak_facts,
        "history_bytes": history,
        "history_bytes_per_turn": history / total,
        "events_written": stats.events_written,
        "store_bytes": disk,
        "verdict": "bounded" if bounded else "linear (not bounded)",
        "samples": [asdict(s) for s in samples],
        "round_ends": round_ends,
    }


def run_in_child(case: str, args: Any) -> dict[str, Any]:
    """Run one case in a fresh interpreter (its RSS is that process's alone)."""
    command = [
        sys.executable,
        __file__,
        "--child",
        case,
        "--agents",
        str(args.agents),
        "--turns",
        str(args.turns),
        "--sample-every",
        str(args.sample_every),
        "--rounds",
        str(args.rounds),
        "--cohorts",
        str(args.cohorts),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=7200)
    if done.returncode != 0:
        raise RuntimeError(f"case {case} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def report(result: dict[str, Any]) -> None:
    rows = []
    previous = None
    for sample in result["samples"]:
        rate = (
            (sample["turns"] - previous["turns"]) / (sample["seconds"] - previous["seconds"])
            if previous and sample["seconds"] > previous["seconds"]
            else 0.0
        )
        rows.append(
            [
                sample["turns"],
                sample["seconds"],
                rate,
                sample["rss"] / MB,
                (sample["rss"] - result["rss_spawned"]) / MB,
                sample["heap"] / MB,
                sample["blocks"] / 1000,
                sample["facts"],
            ]
        )
        previous = sample
    headers = ["turns", "s", "turns/s", "RSS MB", "+MB since spawn", "heap MB", "k blocks"]
    headers.append("facts held")
    print_table(headers, rows)
    print()
    print(
        f"{result['agents']:,} agents, {result['turns']:,} turns in {result['wall_s']:.1f} s "
        f"({result['turns_per_s']:,.0f} turns/s, write-ahead, {result['rounds']} rounds of "
        f"{result['agents'] // result['cohorts']:,} agents; "
        f"{result['passivated']:,} passivations)"
    )
    print(
        f"RSS: {result['rss_start'] / MB:.1f} MB at start, {result['rss_spawned'] / MB:.1f} MB "
        f"with the agents spawned, {result['rss_end'] / MB:.1f} MB at the end, "
        f"{result['rss_after_close'] / MB:.1f} MB after close (Python's allocated blocks: "
        f"{result['allocated_blocks_start']:,} at start, "
        f"{result['allocated_blocks_after_close']:,} after close)"
    )
    print(
        f"growth per 1,000 turns: {result['growth_per_1000_first_half'] / 1024:,.0f} KB in the "
        f"first half, {result['growth_per_1000_second_half'] / 1024:,.0f} KB in the second half"
    )
    print(
        f"{result['bytes_per_turn']:,.0f} bytes per turn since spawn; at most "
        f"{result['facts_held_peak']:,} facts held in memory; {result['events_written']:,} "
        f"facts written; store on disk {result['store_bytes'] / MB:.1f} MB"
    )
    print(
        f"heap (RSS without the LMDB map's file pages): {result['heap_spawned'] / MB:.1f} MB "
        f"spawned, {result['heap_end'] / MB:.1f} MB at the end, "
        f"{result['heap_bytes_per_turn']:,.0f} bytes per turn; growth per 1,000 turns "
        f"{result['heap_growth_per_1000_first_half'] / 1024:,.0f} KB then "
        f"{result['heap_growth_per_1000_second_half'] / 1024:,.0f} KB: {result['heap_verdict']}"
    )
    print(
        f"model-visible histories of the resident sessions: "
        f"{result['history_bytes'] / MB:.1f} MB, {result['history_bytes_per_turn']:,.0f} "
        "bytes per turn (Python object sizes)"
    )
    print(f"verdict: {result['verdict']}")
    ends = result["round_ends"]
    print("at each round's end (after gc.collect(); after passivate_idle() when passivating):")
    print_table(
        ["turns", "k blocks", "heap MB", "histories MB"],
        [
            [e["turns"], e["blocks"] / 1000, e["heap"] / MB, e["history_bytes"] / MB]
            for e in ends
        ],
    )
    if len(ends) > 1:
        blocks = (ends[-1]["blocks"] - ends[0]["blocks"]) / (ends[-1]["turns"] - ends[0]["turns"])
        print(f"allocated blocks from the first round's end to the last: {blocks:+.2f} per turn")


def main() -> None:
    p = parser("Memory soak: RSS over many turns across many agents.", repeats=1)
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--turns", type=int, default=100_000)
    p.add_argument("--sample-every", type=int, default=2_500)
    p.add_argument("--rounds", type=int, default=10, help="rounds of turns (default 10)")
    p.add_argument(
        "--cohorts",
        type=int,
        default=1,
        help="round r drives only cohort r %% C of the agents (default 1: all of them)",
    )
    p.add_argument("--cases", default="resident,passivated", help="which cases to run")
    p.add_argument("--quick", action="store_true", help="10,000 turns, a sample every 500")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.turns, args.sample_every = 10_000, 500
    if args.child:
        with tempfile.TemporaryDirectory(prefix="corral-soak-") as tmp:
            result = run(
                args.child,
                args.agents,
                args.turns,
                args.sample_every,
                args.rounds,
                args.cohorts,
                Path(tmp) / "s",
            )
        gc.collect()  # the runtime is closed and dropped: what is still allocated?
        result["rss_after_close"] = psutil.Process().memory_info().rss
        result["allocated_blocks_after_close"] = sys.getallocatedblocks()
        print(json.dumps(result))
        return
    results = {case: run_in_child(case, args) for case in args.cases.split(",")}
    for case, result in results.items():
        print(f"== {case}")
        report(result)
        print()
    if {"resident", "passivated"} <= results.keys():
        resident, passive = results["resident"], results["passivated"]
        print(
            f"passivated / resident: end RSS {passive['rss_end'] / resident['rss_end']:.2f}x, "
            f"growth per 1,000 turns in the second half "
            f"{passive['growth_per_1000_second_half'] / 1024:,.0f} KB vs "
            f"{resident['growth_per_1000_second_half'] / 1024:,.0f} KB, turns/s "
            f"{passive['turns_per_s'] / resident['turns_per_s']:.2f}x"
        )
    write_json(args.json, "soak", results)


if __name__ == "__main__":
    main()
