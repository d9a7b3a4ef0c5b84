"""``benchmarks/bench_invariants.py``'s logs, small: both are sound (the checker finds
nothing), and one claim too many or a message inserted twice is found, so the benchmark
times the checker on the path it is meant to (the inbox replay)."""

from __future__ import annotations

import sys
from pathlib import Path

from storage import AgentInboxSpliced, Event, check_invariants

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_invariants  # noqa: E402 -- the benchmarks directory is not a package


def test_the_benchmark_logs_are_sound_and_their_inbox_is_replayed() -> None:
    pending = bench_invariants.pending_log(300)
    drained = bench_invariants.drained_log(300)
    assert check_invariants(pending, allow_open_tail=True) == []
    assert check_invariants(drained) == []
    again = pending[5].data
    twice = Event(
        "agent/inbox/spliced",
        300,
        300,
        AgentInboxSpliced(target="next-turn", start=300, inserted=again.inserted),
    )
    found = check_invariants([*pending, twice], allow_open_tail=True)
    assert [v.rule for v in found] == ["inbox-duplicate"]
    extra = AgentInboxSpliced(target="next-turn", start=0, removed_count=1)
    found = check_invariants([*drained, Event("agent/inbox/spliced", len(drained), 0, extra)])
    assert [v.rule for v in found] == ["inbox-splice"]
