"""``benchmarks/bench_log_append.py``'s producer cases, small: each kind of producer
(threads, asyncio tasks, pooled actors joining a flush group) appends every fact of its
session, durably, and the run reports the writer's commits."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from storage import Store

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_log_append  # noqa: E402 -- the benchmarks directory is not a package

Producers = Callable[[Path, int, int, list[dict[str, float]]], float]


@pytest.mark.parametrize(
    "run",
    [bench_log_append.producers, bench_log_append.task_producers, bench_log_append.actor_producers],
    ids=["threads", "asyncio tasks", "pooled actors"],
)
def test_each_producer_appends_all_its_facts_durably_and_the_run_reports_its_commits(
    tmp_path: Path, run: Producers
) -> None:
    writes: list[dict[str, float]] = []
    seconds = run(tmp_path / "store", 4, 30, writes)
    assert seconds > 0
    facts = bench_log_append.realistic_facts(30)
    with Store.open(tmp_path / "store", readonly=True) as store:
        for index in range(4):
            events = store.read(f"producer-{index}")
            assert [(e.type, e.data) for e in events] == facts
    (commits,) = writes
    assert 1 <= commits["commits"] <= 4 * 30 + 1  # grouped: never more than one per flush
    assert commits["events_per_commit"] == 4 * 30 / commits["commits"]
