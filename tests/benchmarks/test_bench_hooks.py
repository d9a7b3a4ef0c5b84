"""``benchmarks/bench_hooks.py``'s cases, small: every turn settles and every hook run
the case configures is logged."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_hooks  # noqa: E402 -- the benchmarks directory is not a package


@pytest.mark.parametrize(("case", "per_turn"), [("baseline", 0), ("Stop", 1), ("Pre+PostToolUse", 2)])
def test_each_case_settles_its_turns_and_logs_its_hook_runs(
    tmp_path: Path, case: str, per_turn: int
) -> None:
    seconds, runs = bench_hooks.run_case(tmp_path / "store", bench_hooks.CASES[case], 3, 2)
    assert seconds > 0
    assert runs == 3 * 2 * per_turn
