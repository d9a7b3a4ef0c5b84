"""Store-level load runs: open a runtime over a store path, drive it, close it, reopen
the store and check this run's session logs (:func:`run_bench`); a sweep of such runs
(:func:`run_sweep`); and the checks themselves (:func:`check_store`, :func:`store_bytes`).

A run reports its own sessions only: a store that holds earlier sessions keeps them,
and they are neither counted nor checked (``LoadReport.log_bytes`` is what the store
grew by).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Final, Literal

import msgspec

from actors import Model
from storage import Durability, IgnoredRecord, StorageError, Store, check_invariants

from ..policy import RetryPolicy
from ..runtime import Runtime
from .driver import LoadDriver
from .report import LoadProgress, LoadReport, LoadSamples, SweepPoint, SweepReport
from .spec import LoadSpec
from .stack import Factory, Prompts
from .traffic import Traffic

__all__ = [
    "FAST_RETRY",
    "SessionViolations",
    "StoreCheck",
    "check_store",
    "knee",
    "run_bench",
    "run_sweep",
    "store_bytes",
]

FAST_RETRY: Final = RetryPolicy(base_s=0.01, cap_s=0.1)
"""The retry policy load runs use: the default schedule, 50x faster."""


class SessionViolations(msgspec.Struct, frozen=True):
    session_id: str
    violations: list[str]


class StoreCheck(msgspec.Struct, frozen=True):
    """The result of :func:`check_store`: how many sessions, which broke invariants."""

    sessions: int
    failed: list[SessionViolations]
    ignored: dict[str, int] = msgspec.field(default_factory=dict)
    """How many records of each ignorable type the checking store did not know (checked
    for their seq only: see :class:`storage.events.IgnoredRecord`)."""

    @property
    def ok(self) -> bool:
        return not self.failed

    def lines(self, limit: int | None = None) -> list[str]:
        out = [f"{s.session_id}: {v}" for s in self.failed for v in s.violations]
        return out if limit is None else out[:limit]


def store_bytes(path: str | Path) -> int:
    """Bytes the store directory occupies on disk (allocated blocks, as ``du`` counts)."""
    total = 0
    directory = Path(path)
    if not directory.is_dir():
        return 0
    for entry in directory.iterdir():
        if entry.is_file():
            stat = entry.stat()
            total += min(stat.st_size, stat.st_blocks * 512)
    return total


def check_store(
    store: Store, *, allow_open_tail: bool = False, only: Collection[str] | None = None
) -> StoreCheck:
    """Check every session log of ``store`` (or those of ``only``) against the session
    invariants. A session that cannot be read back counts as failed, with the storage
    error as its violation. Records of ignorable types that ``store`` does not know (a
    plugin's, registered in the process that wrote them) are accounted for by their seq
    and counted by type."""
    headers = store.sessions()
    if only is not None:
        headers = [h for h in headers if h.id in only]
    failed: list[SessionViolations] = []
    ignored: Counter[str] = Counter()
    for header in headers:
        try:
            events = store.read(header.id, include_ignored=True)
        except StorageError as err:
            failed.append(SessionViolations(header.id, [f"[unreadable] {err}"]))
            continue
        ignored.update(e.type for e in events if type(e.data) is IgnoredRecord)
        found = check_invariants(events, allow_open_tail=allow_open_tail)
        if found:
            failed.append(SessionViolations(header.id, [str(v) for v in found]))
    return StoreCheck(len(headers), failed, dict(sorted(ignored.items())))


def run_bench(
    path: str | Path,
    spec: LoadSpec,
    *,
    durability: Durability = "write-ahead",
    threads: int | None = None,
    model: Model | None = None,
    factory: Factory | None = None,
    factory_name: str = "scripted",
    prompts: Prompts | None = None,
    traffic: Traffic | None = None,
    retry_policy: RetryPolicy | None = FAST_RETRY,
    on_progress: Callable[[LoadProgress], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    interval_s: float = 0.5,
    stop: threading.Event | None = None,
    hooks: str | Path | None = None,
    ready: Callable[[], None] | None = None,
) -> tuple[LoadReport, LoadSamples]:
    """Open a runtime over the store at ``path``, build the stack (``factory(rt)``),
    run the load, close the runtime, then reopen the store read-only and check this
    run's session logs. Returns the report and raw samples. ``on_phase`` hears what
    happens after the load ("closing the runtime", ...); ``hooks`` is a hook settings
    file every agent runs (``Runtime.open(hooks=...)``); ``ready`` is called once the
    agents are spawned, right before the load (a shard waits there for the others). A
    Ctrl-C during the load ends it (``report.interrupted``); one while closing or
    checking propagates."""
    phase = on_phase or (lambda _what: None)
    before = store_bytes(path)
    rt = Runtime.open(
        path, durability=durability, threads=threads, retry_policy=retry_policy, hooks=hooks
    )
    try:
        earlier = len(rt.store.sessions())
        driver = LoadDriver(
            rt,
            spec,
            model=model,
            factory=factory,
            stack_name=factory_name,
            prompts=prompts,
            traffic=traffic,
            on_progress=on_progress,
            interval_s=interval_s,
            stop=stop,
        )
        report = driver.run(ready=ready)
        phase("closing the runtime")
    finally:
        rt.close()
    ours = {record[0] for record in driver.turn_records} | set(driver.agent_ids)
    with Store.open(path, readonly=True) as store:
        phase(f"checking {len(ours):,} session logs")
        check = check_store(store, only=ours, allow_open_tail=report.interrupted)
    violations = [*report.violations, *check.lines(limit=50)]
    report = msgspec.structs.replace(
        report,
        log_bytes=max(0, store_bytes(path) - before),
        sessions_checked=check.sessions,
        earlier_sessions=earlier,
        invariants_ok=check.ok and not report.violations,
        violations=violations,
    )
    return report, driver.samples


def knee(
    values: Sequence[float], throughputs: Sequence[float], p99s: Sequence[float]
) -> float | None:
    """The last swept value that still scaled: the point before the first step whose
    throughput grew by less than half as much as the swept value did (or fell), or
    whose p99 more than doubled. None if every step scaled (or one point only)."""
    for i in range(1, len(values)):
        grew = values[i] / values[i - 1] if values[i - 1] > 0 else 1.0
        gained = throughputs[i] / throughputs[i - 1] if throughputs[i - 1] > 0 else 0.0
        scaled = grew <= 1.0 or (gained - 1.0) >= 0.5 * (grew - 1.0)
        p99_jump = p99s[i - 1] > 0 and p99s[i] > 2.0 * p99s[i - 1]
        if not scaled or p99_jump:
            return values[i - 1]
    return None


def run_sweep(
    path: str | Path,
    swept: Literal["agents", "rate"],
    values: Sequence[float],
    spec: LoadSpec,
    *,
    traffic: Traffic | None = None,
    on_point: Callable[[float], None] | None = None,
    stop: threading.Event | None = None,
    runner: Callable[..., tuple[LoadReport, LoadSamples]] = run_bench,
    **bench: object,
) -> SweepReport:
    """One :func:`run_bench` per value of ``swept`` (agents, or an open loop's rate),
    on the same store, each reporting its own sessions; stops after an interrupted
    point. ``bench``: :func:`run_bench`'s other keywords; ``runner``: what runs a
    point, called as :func:`run_bench` is (``corral bench --shards``: the sharded
    run)."""
    points: list[SweepPoint] = []
    for value in values:
        if on_point is not None:
            on_point(value)
        point_spec, point_traffic = spec, traffic
        if swept == "agents":
            point_spec = msgspec.structs.replace(spec, agents=int(value))
        else:
            if traffic is None:
                raise ValueError("a rate sweep needs an open loop's traffic (its duration)")
            point_traffic = msgspec.structs.replace(traffic, rate=float(value))
        report, _samples = runner(
            path,
            point_spec,
            traffic=point_traffic,
            stop=stop,
            **bench,
        )
        points.append(SweepPoint(float(value), report))
        if report.interrupted:
            break
    return SweepReport(
        swept=swept,
        points=points,
        knee=knee(
            [p.value for p in points],
            [p.report.turns_per_s for p in points],
            [p.report.latency_ms.p99 for p in points],
        ),
    )
