"""``benchmarks/bench_scale.py``'s case and census, small: every agent spawned, turned once
and passivated; the census finds what an idle agent holds."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_scale  # noqa: E402 -- the benchmarks directory is not a package


def test_a_case_spawns_runs_one_turn_each_and_passivates_every_agent() -> None:
    batch = bench_scale.run_case(30, batch=True, turns=True)
    assert batch["agents"] == 30
    assert batch["passivated"] == 30 + 10  # and the 10 spawned to warm up
    assert batch["spawn_s"] > 0 and batch["turns_s"] > 0
    each = bench_scale.run_case(20, batch=False, turns=False)
    assert "passivated" not in each and each["spawn_cpu_us_per_agent"] > 0


def test_the_census_counts_what_idle_agents_hold_resident_and_passivated() -> None:
    census = bench_scale.holders(40, top=5)
    resident, passive = census["resident"], census["passivated"]
    assert resident["bytes_per_agent"] > passive["bytes_per_agent"] > 0
    assert len(resident["top"]) == 5
    where, size, _blocks = resident["top"][0]
    assert ":" in where and size > 0
