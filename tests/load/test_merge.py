"""Runs side by side merge into one report of the same schema: an open loop split into
shares offers the whole traffic; counts add up; percentiles are those of every run's
samples together, not averages of the runs' percentiles."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from runtime.load import (
    LoadReport,
    LoadSpec,
    Part,
    Traffic,
    arrival_times,
    merge_runs,
    percentile,
    run_bench,
)


def test_shares_of_an_open_loop_offer_the_whole_traffic_between_them() -> None:
    whole = Traffic(rate=30, duration_s=2, shape="constant", queue_limit=7)
    shares = [whole.share(3, k) for k in range(3)]
    assert [s.rate for s in shares] == [10, 10, 10]
    assert sum(s.queue_limit or 0 for s in shares) == 7
    merged = sorted(t for s in shares for t in arrival_times(s))  # interleaved, not bunched
    assert all(abs(a - b) < 1e-9 for a, b in zip(merged, arrival_times(whole), strict=True))
    poisson = Traffic(rate=200, duration_s=5).share(2, 1)
    assert poisson.rate == 100 and poisson.phase_s == 0


def test_two_runs_merge_into_one_report_with_exact_percentiles_of_both(tmp_path: Path) -> None:
    whole = Traffic(rate=40, duration_s=0.5, shape="constant")
    parts = []
    for k in range(2):
        spec = LoadSpec(agents=3, seed=k, latency_s=0.005 * (k + 1))  # one run slower
        report, samples = run_bench(tmp_path / f"s{k}", spec, traffic=whole.share(2, k))
        parts.append(Part(report, samples, time.time()))
    merged, samples = merge_runs(parts, labels=["a", "b"])
    reports: list[LoadReport] = [p.report for p in parts]
    assert merged.schema == reports[0].schema and merged.mode == "open"
    assert merged.settled == sum(r.settled for r in reports) == 20
    assert merged.agents == 6 and merged.sessions_checked == 6 and merged.invariants_ok
    assert merged.events == sum(r.events for r in reports)
    loop = merged.open_loop
    assert loop is not None and (loop.rate, loop.arrivals, loop.offered_rate) == (40, 20, 40)
    latencies = [ms for p in parts for ms in p.samples.latencies_ms]
    assert merged.latency_ms.p99 == round(percentile(latencies, 99), 3)
    assert merged.breakdown is not None and merged.breakdown.turns == 20
    walls = sorted(float(t.wall) for t in samples.turns)
    assert merged.breakdown.wall.p50 == round(percentile(walls, 50), 3)
    assert merged.wall_s >= max(r.wall_s for r in reports)
    # the same schema: it encodes and decodes as one run's report does
    assert msgspec.json.decode(msgspec.json.encode(merged), type=LoadReport) == merged
