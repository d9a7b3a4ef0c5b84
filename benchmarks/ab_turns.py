"""Two versions of corral compared at the same moment: agent turns/s, A against B.

This VM's speed swings by more than most changes gain (1,000-agent turns/s moved from
~6,500 to ~11,800 with the same code, minutes apart), so runs of A and then B compare
the VM as much as the code. Here both versions run *at once*, one process each (one per
core: under the GIL each uses about one), in the same phase of the VM: each spawns N
agents, runs one warm-up turn per agent, says it is ready, and starts its measured turns
only when both are (a barrier on their stdin). A pair's ratio is B's turns/s over A's;
the median over the pairs is the result. Which version starts first alternates, and so
does which is spawned first.

A version is a git revision (``git archive`` into a temporary directory) or a directory
holding ``runtime/``, ``actors/`` and ``storage/``. The children use only the public
surface every version has (``Runtime.open``, ``rt.spawn``, ``rt.on("agent/settled")``,
``agent.followup``; with ``--tool``, ``tool`` and ``ToolCall`` too), with ``ScriptedModel``
answering at once.

    python benchmarks/ab_turns.py HEAD~1 HEAD          # 8 pairs, 1,000 agents x 30 turns
    python benchmarks/ab_turns.py main /path/to/checkout --repeats 12 --mode turn --json ab.json
    python benchmarks/ab_turns.py main HEAD --tool     # one no-op tool call a turn
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import median, parser, print_table, write_json

_CHILD = r"""
import json, sys, tempfile, threading, time
from pathlib import Path
from runtime import Runtime, ScriptedModel

n, turns, mode, with_tool = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"


def drive(agents, rounds):
    left = {a.id: rounds for a in agents}
    remaining = [len(agents) * rounds]
    done = threading.Event()
    lock = threading.Lock()

    def settled(event):
        with lock:
            left[event.agent.id] -= 1
            more = left[event.agent.id] > 0
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()
        if more:
            event.agent.followup("hello")

    dispose = rt.on("agent/settled", settled)
    start, cpu = time.perf_counter(), time.process_time()
    for agent in agents:
        agent.followup("hello")
    if not done.wait(600):
        raise SystemExit(f"{remaining[0]} turns did not settle in 600 s")
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    dispose()
    return wall, cpu


with tempfile.TemporaryDirectory() as tmp:
    rt = Runtime.open(Path(tmp) / "store", durability=mode)
    if with_tool:  # as bench_turns' +tool case: one call of a no-op tool a turn
        from runtime import ToolCall, tool
        from storage.events import UserMessage

        @tool(concurrency_safe=True)
        def noop() -> str:
            return "ok"

        def reply(request):
            if isinstance(request.messages[-1], UserMessage):
                return [ToolCall(name="noop")]
            return "ok"

        model, tools = ScriptedModel(reply), [noop]
    else:
        model, tools = ScriptedModel(lambda request: "ok"), []
    agents = [rt.spawn(model=model, tools=tools) for _ in range(n)]
    drive(agents, 1)
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: both versions start their measured turns together
    wall, cpu = drive(agents, turns)
    rt.close()
print(json.dumps({"turns_per_s": n * turns / wall, "cpu_us_per_turn": cpu * 1e6 / (n * turns)}))
"""


def snapshot(version: str, into: Path) -> Path:
    """A directory holding ``version``: itself if it is one, else its ``git archive``
    extracted into the new directory ``into``."""
    path = Path(version)
    if (path / "runtime").is_dir():
        return path.resolve()
    repo = Path(__file__).resolve().parent.parent
    target = into
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", version], capture_output=True, check=False
    )
    if archive.returncode != 0:
        why = archive.stderr.decode(errors="replace").strip()
        raise SystemExit(f"not a directory or git revision: {version!r} ({why})")
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def start(root: Path, n: int, turns: int, mode: str, tool: bool) -> subprocess.Popen[str]:
    return start_child(root, _CHILD, str(n), str(turns), mode, "1" if tool else "0")


def start_child(root: Path, code: str, *args: str) -> subprocess.Popen[str]:
    """``python -c code args...`` run against the version in ``root``, with pipes (the
    barrier is on its stdin, its result on its stdout)."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ready(child: subprocess.Popen[str], name: str) -> None:
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "ready":
        raise SystemExit(f"{name} failed before its measured turns:\n{child.communicate()[1]}")


def pair(
    roots: dict[str, Path], order: list[str], n: int, turns: int, mode: str, tool: bool
) -> dict[str, Any]:
    children = {name: start(roots[name], n, turns, mode, tool) for name in order}
    return run_together(children, timeout=900)


def run_together(children: dict[str, subprocess.Popen[str]], timeout: float) -> dict[str, Any]:
    """Wait until every child is ready, let them all go at once (the barrier), and
    collect each one's last line of JSON."""
    for name, child in children.items():
        ready(child, name)
    for child in children.values():  # the barrier: both go now
        stdin = child.stdin
        assert stdin is not None
        stdin.write("go\n")
        stdin.flush()
    result: dict[str, Any] = {}
    for name, child in children.items():
        out, err = child.communicate(timeout=timeout)
        if child.returncode != 0:
            raise SystemExit(f"{name} failed:\n{err}")
        result[name] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    p = parser(__doc__.splitlines()[0], repeats=8)  # --repeats: the pairs
    p.add_argument("a", help="version A: a git revision or a checkout directory")
    p.add_argument("b", help="version B")
    p.add_argument("--agents", type=int, default=1000, help="agents per run (default 1000)")
    p.add_argument("--turns", type=int, default=30, help="measured turns per agent (default 30)")
    p.add_argument("--mode", default="write-ahead", help="durability (default write-ahead)")
    p.add_argument(
        "--tool", action="store_true", help="every turn makes one call of a no-op sync tool"
    )
    args = p.parse_args()
    if args.repeats < 1:
        raise SystemExit("--repeats (pairs of simultaneous runs) must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"A": snapshot(args.a, Path(tmp) / "A"), "B": snapshot(args.b, Path(tmp) / "B")}
        pairs = []
        for index in range(args.repeats):
            order = ["A", "B"] if index % 2 == 0 else ["B", "A"]
            pairs.append(pair(roots, order, args.agents, args.turns, args.mode, args.tool))
    rows: list[list[object]] = []
    ratios = []
    for index, result in enumerate(pairs):
        ratio = result["B"]["turns_per_s"] / result["A"]["turns_per_s"]
        ratios.append(ratio)
        rows.append(
            [
                f"pair {index + 1}",
                result["A"]["turns_per_s"],
                result["B"]["turns_per_s"],
                result["A"]["cpu_us_per_turn"],
                result["B"]["cpu_us_per_turn"],
                f"{ratio:.3f}",
            ]
        )
    case = f"{args.mode}{', one tool call a turn' if args.tool else ''}"
    print(f"A = {args.a}, B = {args.b}: {args.agents} agents x {args.turns} turns, {case}")
    print_table(["", "A turns/s", "B turns/s", "A CPU µs/turn", "B CPU µs/turn", "B / A"], rows)
    print(f"median B / A: {median(ratios):.3f} over {len(ratios)} pairs")
    write_json(
        args.json,
        "ab_turns",
        {
            "a": args.a,
            "b": args.b,
            "tool": args.tool,
            "pairs": pairs,
            "ratios": ratios,
            "median": median(ratios),
        },
    )


if __name__ == "__main__":
    main()
