"""Two versions of corral compared at the same moment: ``rt.spawn_many``, A against B.

As in ``ab_turns.py`` (whose ``snapshot`` this uses): both versions run *at once*, one
process each, in the same phase of a shared machine. Each opens a runtime, warms up with
10 agents, says it is ready, and spawns its N agents only when both are (a barrier on
their stdin). Reported per version: wall seconds, CPU µs an agent (every thread of the
process, ``getrusage``) and the anonymous memory an agent adds (``RssAnon``); a pair's
ratio is A's CPU an agent over B's (above 1: B is cheaper), the median over the pairs
is the result. Which version starts first alternates.

    python benchmarks/ab_spawn.py main HEAD                  # 4 pairs, 100,000 agents each
    python benchmarks/ab_spawn.py main HEAD --agents 20000 --repeats 6 --json ab.json
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import median, parser, print_table, write_json
from benchmarks.ab_turns import run_together, snapshot, start_child

_CHILD = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
from runtime import Runtime, ScriptedModel

n = int(sys.argv[1])


def anon():
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no RssAnon in /proc/self/status")


def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


with tempfile.TemporaryDirectory() as tmp:
    rt = Runtime.open(Path(tmp) / "store")
    model = ScriptedModel.echo()
    rt.spawn_many(10, model=model)
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: both versions spawn together
    base, start, used = anon(), time.perf_counter(), cpu()
    agents = rt.spawn_many(n, model=model)
    wall, used = time.perf_counter() - start, cpu() - used
    added = anon() - base
    rt.close(timeout=600)
result = {"spawn_s": wall, "cpu_us_per_agent": used * 1e6 / n, "anon_b_per_agent": added / n}
print(json.dumps(result))
"""


def _start(root: Path, n: int) -> subprocess.Popen[str]:
    return start_child(root, _CHILD, str(n))


def _pair(roots: dict[str, Path], order: list[str], n: int) -> dict[str, Any]:
    return run_together({name: _start(roots[name], n) for name in order}, timeout=1800)


def main() -> None:
    p = parser(__doc__.splitlines()[0], repeats=4)  # --repeats: the pairs
    p.add_argument("a", help="version A: a git revision or a checkout directory")
    p.add_argument("b", help="version B")
    p.add_argument("--agents", type=int, default=100_000, help="agents per run (100,000)")
    args = p.parse_args()
    if args.repeats < 1:
        raise SystemExit("--repeats (pairs of simultaneous runs) must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"A": snapshot(args.a, Path(tmp) / "A"), "B": snapshot(args.b, Path(tmp) / "B")}
        pairs = [
            _pair(roots, ["A", "B"] if index % 2 == 0 else ["B", "A"], args.agents)
            for index in range(args.repeats)
        ]
    rows: list[list[object]] = []
    ratios = []
    for index, result in enumerate(pairs):
        a, b = result["A"], result["B"]
        ratios.append(a["cpu_us_per_agent"] / b["cpu_us_per_agent"])
        rows.append(
            [
                f"pair {index + 1}",
                a["spawn_s"],
                b["spawn_s"],
                a["cpu_us_per_agent"],
                b["cpu_us_per_agent"],
                a["anon_b_per_agent"],
                b["anon_b_per_agent"],
                f"{ratios[-1]:.3f}",
            ]
        )
    print(f"A = {args.a}, B = {args.b}: spawn_many({args.agents:,})")
    print_table(
        [
            "",
            "A s",
            "B s",
            "A CPU µs/agent",
            "B CPU µs/agent",
            "A anon B/agent",
            "B anon B/agent",
            "A / B CPU",
        ],
        rows,
    )
    print(f"median A / B CPU an agent: {median(ratios):.3f} over {len(ratios)} pairs")
    write_json(
        args.json,
        "ab_spawn",
        {
            "a": args.a,
            "b": args.b,
            "agents": args.agents,
            "pairs": pairs,
            "ratios": ratios,
            "median_cpu_ratio_a_over_b": median(ratios),
        },
    )


if __name__ == "__main__":
    main()
