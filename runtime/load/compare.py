"""Compare two load reports metric by metric: the ratio B/A and whether B regressed.

Each compared metric has a direction: higher is better (throughput) or lower is better
(latencies, errors, memory). B regressed on a metric when it is worse than A by more
than ``threshold`` (a fraction: 0.1 is 10%) and by more than the metric's noise floor
(1 ms for latencies; 2 ms for the breakdown, read from whole-millisecond fact times).
A metric that is 0 in A regresses by any worsening past its floor (0 errored turns
before, 3 now).
A sweep report is compared point by point (the points with the same swept value).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec

from .report import LoadReport, SweepReport

__all__ = ["METRICS", "Comparison", "compare_reports", "compare_sweeps", "read_report"]

Getter = Callable[[LoadReport], float | None]


def _breakdown(part: str, pct: str) -> Getter:
    def get(r: LoadReport) -> float | None:
        if r.breakdown is None:
            return None
        summary = getattr(r.breakdown, part)
        return None if summary is None else float(getattr(summary, pct))

    return get


METRICS: Final[tuple[tuple[str, bool, float, Getter], ...]] = (
    # (name, higher is better, noise floor: a smaller difference never regresses, getter)
    ("turns/s", True, 0.0, lambda r: r.turns_per_s),
    ("events/s", True, 0.0, lambda r: r.events_per_s),
    ("latency p50 ms", False, 1.0, lambda r: r.latency_ms.p50),
    ("latency p95 ms", False, 1.0, lambda r: r.latency_ms.p95),
    ("latency p99 ms", False, 1.0, lambda r: r.latency_ms.p99),
    ("error rate", False, 0.0, lambda r: r.errored / r.settled if r.settled else 0.0),
    ("errored", False, 0.0, lambda r: float(r.errored)),
    ("shed", False, 0.0, lambda r: None if r.open_loop is None else float(r.open_loop.shed)),
    (
        "queue p99 ms",
        False,
        1.0,
        lambda r: None if r.open_loop is None else r.open_loop.queue_ms.p99,
    ),
    # the log's times are whole milliseconds: a 1 ms step is its resolution, not a change
    ("ttft p50 ms", False, 2.0, _breakdown("ttft", "p50")),
    ("model p50 ms", False, 2.0, _breakdown("model", "p50")),
    ("tool p50 ms", False, 2.0, _breakdown("tool", "p50")),
    ("hooks p50 ms", False, 2.0, _breakdown("hooks", "p50")),
    ("commit p99 ms", False, 2.0, _breakdown("commit", "p99")),
    ("RSS peak MB", False, 1.0, lambda r: r.rss_peak_mb),
)


class Comparison(msgspec.Struct, frozen=True):
    """One metric of A and B."""

    metric: str
    a: float
    b: float
    ratio: float | None  # b / a; None when a is 0
    higher_is_better: bool
    regressed: bool
    point: float | None = None  # the swept value, comparing sweeps


def _worse(a: float, b: float, higher_is_better: bool, threshold: float, floor: float) -> bool:
    if abs(b - a) <= floor:
        return False
    if a == 0:
        return b < 0 if higher_is_better else b > 0
    change = (b - a) / abs(a)
    return change < -threshold if higher_is_better else change > threshold


def compare_reports(
    a: LoadReport, b: LoadReport, *, threshold: float = 0.1, point: float | None = None
) -> list[Comparison]:
    """Every metric both reports hold, side by side."""
    out: list[Comparison] = []
    for name, higher, floor, get in METRICS:
        va, vb = get(a), get(b)
        if va is None or vb is None:
            continue
        ratio = round(vb / va, 4) if va else None
        regressed = _worse(va, vb, higher, threshold, floor)
        out.append(Comparison(name, va, vb, ratio, higher, regressed, point))
    return out


def compare_sweeps(a: SweepReport, b: SweepReport, *, threshold: float = 0.1) -> list[Comparison]:
    """The points of the same swept value, compared as :func:`compare_reports` does."""
    theirs = {p.value: p.report for p in b.points}
    out: list[Comparison] = []
    for p in a.points:
        if p.value in theirs:
            out += compare_reports(p.report, theirs[p.value], threshold=threshold, point=p.value)
    return out


_REPORT: Final = msgspec.json.Decoder(LoadReport)
_SWEEP: Final = msgspec.json.Decoder(SweepReport)


def read_report(data: bytes) -> LoadReport | SweepReport:
    """A ``--json`` record of ``corral bench``: a run's or a sweep's."""
    if b'"points"' in data:
        try:
            return _SWEEP.decode(data)
        except msgspec.ValidationError:
            pass
    return _REPORT.decode(data)
