"""Every example runs to success with `corral run`, in a subprocess, on a fresh store."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import corral

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# (script, arguments, a line its output must hold): small sizes keep the suite fast.
RUNS = [
    ("fan_out_fan_in.py", ["40"], "fan-in: 40 answers, sum of squares = 22,140 (correct)"),
    ("restart_crashed.py", ["6", "2"], "6/6 tasks completed, 2 restart(s)"),
    ("steer_and_cancel.py", [], "task two   -> discarded"),
    ("tree_of_agents.py", ["3"], "total letters: 23"),
    ("asyncio_supervisor.py", ["5"], "6 settled events (0 dropped)"),
]


def test_every_example_is_run_here() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(r[0] for r in RUNS)


@pytest.mark.parametrize(("script", "args", "expected"), RUNS, ids=[r[0] for r in RUNS])
def test_the_example_runs_to_success(
    tmp_path: Path, script: str, args: list[str], expected: str
) -> None:
    done = corral("run", "--store", tmp_path / "store", EXAMPLES / script, *args, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert expected in done.stdout, done.stdout
