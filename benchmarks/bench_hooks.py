"""What command hooks cost a turn: the same load with no hooks, then with hooks that do
nothing (``true``), measured in the same run.

Cases (each N agents x T turns of ``ScriptedModel``, one tool call per turn, write-ahead,
on a fresh store):

- ``baseline``: no hooks;
- ``Stop``: one ``Stop`` hook per turn;
- ``Pre+PostToolUse``: a ``PreToolUse`` and a ``PostToolUse`` hook around each call.

Reported: turns/s (median of the repeats), hook runs/s, the ratio to the baseline, and
the added wall time per hook run (a subprocess start through ``/bin/sh`` is most of it).

    python benchmarks/bench_hooks.py [--agents 20] [--turns 5] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import median, parser, print_table, system_info, timed, write_json

from runtime import Runtime, ScriptedModel, ToolCall, tool
from runtime.hooks import HOOK_RUN, HookRun


@tool(concurrency_safe=True)
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value-of-{key}"


def _model() -> ScriptedModel:
    def reply(request: Any) -> object:
        last = request.messages[-1]
        if getattr(last, "role", None) == "tool":
            return "done"
        return [ToolCall(name="lookup", arguments={"key": "k"})]

    return ScriptedModel(reply)


CASES: dict[str, dict[str, Any] | None] = {
    "baseline": None,
    "Stop": {"hooks": {"Stop": [{"hooks": [{"command": "true"}]}]}},
    "Pre+PostToolUse": {
        "hooks": {
            "PreToolUse": [{"hooks": [{"command": "true"}]}],
            "PostToolUse": [{"hooks": [{"command": "true"}]}],
        }
    },
}


def run_case(
    store: Path, hooks: dict[str, Any] | None, agents: int, turns: int
) -> tuple[float, int]:
    """Seconds to settle every turn, and the hook runs logged."""
    rt = Runtime.open(store, hooks=hooks)
    try:
        done = threading.Semaphore(0)
        rt.on("agent/settled", lambda _e: done.release())
        spawned = [rt.spawn(model=_model(), tools=[lookup]) for _ in range(agents)]

        def load() -> None:
            for _ in range(turns):
                for agent in spawned:
                    agent.followup("look it up")
                for _ in spawned:
                    if not done.acquire(timeout=600):
                        raise TimeoutError("a turn did not settle within 10 minutes")

        seconds = timed(load)
        if hooks is not None:
            rt.store.register_event_type(HOOK_RUN, HookRun, ignorable=True)
        runs = sum(1 for a in spawned for e in a.session.events() if e.type == HOOK_RUN)
    finally:
        rt.close()
    return seconds, runs


def main() -> None:
    p = parser(__doc__.splitlines()[0], repeats=3)
    p.add_argument("--agents", type=int, default=20)
    p.add_argument("--turns", type=int, default=5)
    args = p.parse_args()
    total = args.agents * args.turns
    results: dict[str, Any] = {"agents": args.agents, "turns": args.turns, "cases": {}}
    seconds: dict[str, list[float]] = {name: [] for name in CASES}
    runs: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            for name, hooks in CASES.items():  # interleaved: the VM's phase hits each alike
                store = Path(root) / f"{name}-{repeat}"
                took, logged = run_case(store, hooks, args.agents, args.turns)
                seconds[name].append(took)
                runs[name] = logged
    base = median(seconds["baseline"])
    rows = []
    for name in CASES:
        took = median(seconds[name])
        per_run_ms = (took - base) / runs[name] * 1000 if runs[name] else 0.0
        results["cases"][name] = {
            "seconds": seconds[name],
            "turns_per_s": total / took,
            "hook_runs": runs[name],
            "ratio_to_baseline": base / took,
            "added_ms_per_hook_run": per_run_ms,
        }
        rows.append([name, total / took, runs[name], runs[name] / took, base / took, per_run_ms])
    print(
        f"{args.agents} agents x {args.turns} turns, one tool call per turn, "
        f"median of {args.repeats}"
    )
    print_table(
        ["case", "turns/s", "hook runs", "runs/s", "x baseline", "ms added / run"], rows
    )
    results["system"] = system_info()
    write_json(args.json, "bench_hooks", results)


if __name__ == "__main__":
    main()
