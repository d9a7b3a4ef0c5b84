"""One report of load runs that ran side by side (the shards of ``corral bench
--shards``), in the schema of one run's.

Counts are summed; percentiles are the exact ones of every run's samples together
(latencies, breakdown parts, an open loop's queue waits and lags), never averages of
percentiles; the wall time runs from the first run's first follow-up to the last run's
last settled turn, so runs that did not overlap count against the result, never for
it. An open loop's requested and offered rates are the runs' sums (each ran its share
of the traffic, :meth:`runtime.load.Traffic.share`).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .breakdown import breakdown
from .report import FailureCount, LoadReport, LoadSamples, OpenLoop, summary

__all__ = ["Part", "merge_runs"]


class Part(msgspec.Struct, frozen=True):
    """One run to merge: its report, its samples, and when its load ended (epoch s)."""

    report: LoadReport
    samples: LoadSamples
    ended: float


def _failures(reports: Sequence[LoadReport]) -> list[FailureCount]:
    merged: dict[str, FailureCount] = {}
    for report in reports:
        for f in report.failures:
            seen = merged.get(f.code)
            if seen is None:
                merged[f.code] = f
            else:
                merged[f.code] = FailureCount(
                    f.code, seen.requests + f.requests, seen.turns + f.turns, seen.example
                )
    return [merged[code] for code in sorted(merged)]


def _open_loop(parts: Sequence[Part], settled: int, wall_s: float) -> OpenLoop | None:
    loops = [p.report.open_loop for p in parts if p.report.open_loop is not None]
    if not loops:
        return None
    first = loops[0]
    arrivals = sum(loop.arrivals for loop in loops)
    offered = sum(loop.offered_rate * loop.duration_s for loop in loops)  # arrivals that came
    return OpenLoop(
        shape=first.shape,
        rate=round(sum(loop.rate for loop in loops), 6),
        duration_s=first.duration_s,
        arrivals=arrivals,
        offered_rate=round(offered / first.duration_s, 3),
        dispatched=sum(loop.dispatched for loop in loops),
        shed=sum(loop.shed for loop in loops),
        queue_limit=sum(loop.queue_limit for loop in loops),
        achieved_rate=round(settled / wall_s, 3) if wall_s > 0 else 0.0,
        queue_ms=summary([ms for p in parts for ms in p.samples.queue_ms]),
        lag_ms=summary([ms for p in parts for ms in p.samples.lag_ms]),
    )


def merge_runs(
    parts: Sequence[Part], *, labels: Sequence[str] = ()
) -> tuple[LoadReport, LoadSamples]:
    """One report and one set of samples of ``parts`` (see the module doc); each run's
    violations are prefixed with its label (``labels[i]``, e.g. ``shard 0``)."""
    if not parts:
        raise ValueError("nothing to merge: no run")
    reports = [p.report for p in parts]
    starts = [p.ended - p.report.wall_s for p in parts]
    first_start = min(starts)
    wall_s = max(p.ended for p in parts) - first_start
    settled = sum(r.settled for r in reports)
    events = sum(r.events for r in reports)
    errored = sum(r.errored for r in reports)
    samples = LoadSamples(
        latencies_ms=[ms for p in parts for ms in p.samples.latencies_ms],
        settled_s=[
            start - first_start + s
            for p, start in zip(parts, starts, strict=True)
            for s in p.samples.settled_s
        ],
        queue_ms=[ms for p in parts for ms in p.samples.queue_ms],
        lag_ms=[ms for p in parts for ms in p.samples.lag_ms],
        turns=[t for p in parts for t in p.samples.turns],
    )
    names = list(labels) or [f"run {i}" for i in range(len(parts))]
    first = reports[0]
    live = all(r.breakdown is None or r.breakdown.commit is not None for r in reports)
    report = LoadReport(
        agents=sum(r.agents for r in reports),
        turns=first.turns,
        durability=first.durability,
        threads=first.threads,
        standby=first.standby,
        model=first.model,
        wall_s=round(wall_s, 4),
        spawn_s=max(r.spawn_s for r in reports),
        turns_per_s=round(settled / wall_s, 1) if wall_s > 0 else 0.0,
        events=events,
        events_per_s=round(events / wall_s, 1) if wall_s > 0 else 0.0,
        latency_ms=summary(samples.latencies_ms),
        settled=settled,
        errored=errored,
        retried=sum(r.retried for r in reports),
        timed_out=any(r.timed_out for r in reports),
        rss_peak_mb=max(r.rss_peak_mb for r in reports),
        log_bytes=sum(r.log_bytes or 0 for r in reports),
        sessions_checked=sum(r.sessions_checked or 0 for r in reports),
        invariants_ok=all(r.invariants_ok for r in reports),
        violations=[
            f"{name}: {v}" for name, r in zip(names, reports, strict=True) for v in r.violations
        ],
        mode=first.mode,
        stack=first.stack,
        turns_total=sum(r.turns_total for r in reports),
        error_rate=round(errored / settled, 6) if settled else 0.0,
        in_flight=sum(r.in_flight for r in reports),
        interrupted=any(r.interrupted for r in reports),
        earlier_sessions=sum(r.earlier_sessions for r in reports),
        failures=_failures(reports),
        breakdown=breakdown(samples.turns, live=live),
        open_loop=_open_loop(parts, settled, wall_s),
    )
    return report, samples
