"""``corral bench --shards N``: the load driver run inside each of N shard processes.

Each shard is a Ray task holding ``shard_cpus`` CPUs: it opens an ordinary ``Runtime``
over ``<store>/shard-<k>/``, waits at a start gate until every shard is ready (Ray starts
worker processes one after the other, ~1 s each here), runs :class:`runtime.load.LoadDriver`
over its share of the agents, closes the runtime and checks its logs. The reports are
merged into one :class:`~runtime.load.LoadReport`: sums of turns and events, the exact
latency percentiles of every turn, and a wall time from the first shard's first
follow-up to the last shard's last settled turn (so shards that did not overlap count
against the result, never for it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from runtime.load import (
    FAST_RETRY,
    LatencySummary,
    LoadDriver,
    LoadReport,
    LoadSamples,
    LoadSpec,
    check_store,
    percentile,
    store_bytes,
)

from .layout import claim_layout, shard_path

__all__ = ["ShardRun", "merge", "run_shard_load", "run_sharded_bench", "sharded_bench_runner"]


class ShardRun(msgspec.Struct, frozen=True):
    """What one shard's load run sends back."""

    index: int
    report: LoadReport
    latencies_ms: list[float]
    ended: float  # epoch seconds of the end of its load window
    cpu_s: float = 0.0  # CPU seconds its process used over the load (spawns included)


class _Gate:
    """A start line: :meth:`arrive` returns once ``parties`` callers arrived."""

    def __init__(self, parties: int) -> None:
        self._parties = parties
        self._arrived = 0
        self._all = threading.Condition()

    def arrive(self, timeout: float) -> bool:
        with self._all:
            self._arrived += 1
            self._all.notify_all()
            return self._all.wait_for(lambda: self._arrived >= self._parties, timeout)


def run_shard_load(
    root: str,
    index: int,
    spec: LoadSpec,
    durability: str,
    threads: int | None,
    model: str | None,
    gate: Any,
) -> ShardRun:
    """One shard's run (in its Ray worker): see the module doc."""
    import ray  # noqa: PLC0415 - the optional extra, present in a shard

    from runtime import Runtime  # noqa: PLC0415
    from storage import Store  # noqa: PLC0415

    path = shard_path(root, index)
    rt = Runtime.open(path, durability=durability, threads=threads, retry_policy=FAST_RETRY)  # type: ignore[arg-type]
    try:
        resolved = None
        if model is not None:
            from runtime.providers import resolve_model  # noqa: PLC0415

            resolved = resolve_model(model)
        driver = LoadDriver(rt, spec, model=resolved)
        ray.get(gate.arrive.remote(600.0))
        cpu = time.process_time()
        report = driver.run()
        ended = time.time()
        cpu_s = time.process_time() - cpu
    finally:
        rt.close()
    with Store.open(path, readonly=True) as store:
        check = check_store(store)
    report = msgspec.structs.replace(
        report,
        log_bytes=store_bytes(path),
        sessions_checked=check.sessions,
        invariants_ok=check.ok and not report.violations,
        violations=[*report.violations, *check.lines(limit=50)],
    )
    return ShardRun(index, report, list(driver.samples.latencies_ms), ended, round(cpu_s, 3))


def merge(runs: list[ShardRun], spec: LoadSpec) -> LoadReport:
    """One report of ``runs`` (see the module doc)."""
    reports = [run.report for run in runs]
    first_start = min(run.ended - run.report.wall_s for run in runs)
    wall_s = max(run.ended for run in runs) - first_start
    settled = sum(r.settled for r in reports)
    events = sum(r.events for r in reports)
    latencies = [ms for run in runs for ms in run.latencies_ms]
    summary = LatencySummary(
        p50=round(percentile(latencies, 50), 3),
        p95=round(percentile(latencies, 95), 3),
        p99=round(percentile(latencies, 99), 3),
        mean=round(sum(latencies) / len(latencies), 3) if latencies else 0.0,
        max=round(max(latencies), 3) if latencies else 0.0,
    )
    return LoadReport(
        agents=spec.agents,
        turns=spec.turns,
        durability=reports[0].durability,
        threads=reports[0].threads,
        standby=reports[0].standby,
        model=reports[0].model,
        wall_s=round(wall_s, 4),
        spawn_s=max(r.spawn_s for r in reports),
        turns_per_s=round(settled / wall_s, 1) if wall_s > 0 else 0.0,
        events=events,
        events_per_s=round(events / wall_s, 1) if wall_s > 0 else 0.0,
        latency_ms=summary,
        settled=settled,
        errored=sum(r.errored for r in reports),
        retried=sum(r.retried for r in reports),
        timed_out=any(r.timed_out for r in reports),
        rss_peak_mb=max(r.rss_peak_mb for r in reports),
        log_bytes=sum(r.log_bytes or 0 for r in reports),
        sessions_checked=sum(r.sessions_checked or 0 for r in reports),
        invariants_ok=all(r.invariants_ok for r in reports),
        violations=[f"shard {run.index}: {v}" for run in runs for v in run.report.violations],
    )


def _share(spec: LoadSpec, shards: int, index: int) -> LoadSpec:
    agents = spec.agents // shards + (1 if index < spec.agents % shards else 0)
    return msgspec.structs.replace(spec, agents=max(agents, 1), seed=spec.seed + index)


def run_sharded_bench(
    path: str | os.PathLike[str],
    spec: LoadSpec,
    *,
    shards: int,
    address: str | None = None,
    durability: str = "write-ahead",
    threads: int | None = None,
    model: str | None = None,
    shard_cpus: float = 1.0,
    on_phase: Callable[[str], None] | None = None,
) -> tuple[LoadReport, LoadSamples, list[ShardRun]]:
    """Run ``spec`` split over ``shards`` shard processes; the merged report, its
    samples (latencies only) and every shard's own run."""
    from .cluster import _ray, start_local_ray  # noqa: PLC0415 - Ray is imported only here

    phase = on_phase or (lambda _what: None)
    if shards > spec.agents:
        raise ValueError(f"{shards} shards for {spec.agents} agents: give each shard one at least")
    ray = _ray()
    root = os.path.abspath(os.fspath(path))
    claim_layout(Path(root), shards)
    owns_ray = not ray.is_initialized()
    if owns_ray:
        phase("starting Ray")
        if address is None:
            start_local_ray(shards, shard_cpus)
        else:
            ray.init(address=address, log_to_driver=False)
    try:
        gate = ray.remote(_Gate).options(num_cpus=0, max_concurrency=shards + 1).remote(shards)
        task = ray.remote(run_shard_load).options(num_cpus=shard_cpus, max_retries=0)
        phase(f"running the load in {shards} shards")
        refs = [
            task.remote(root, k, _share(spec, shards, k), durability, threads, model, gate)
            for k in range(shards)
        ]
        runs: list[ShardRun] = ray.get(refs)
        ray.kill(gate)
    finally:
        if owns_ray:
            ray.shutdown()
    report = merge(runs, spec)
    samples = LoadSamples(latencies_ms=[ms for run in runs for ms in run.latencies_ms])
    return report, samples, runs


def sharded_bench_runner(
    shards: int, address: str | None, model: str | None
) -> Callable[..., tuple[LoadReport, LoadSamples]]:
    """A function called like :func:`runtime.load.run_bench` that runs the load in
    ``shards`` shards (``corral bench --shards``): the model goes to the shards as its
    string, progress is not reported live (each shard's runs in its own process)."""

    def run(
        path: str | os.PathLike[str],
        spec: LoadSpec,
        *,
        durability: str = "write-ahead",
        threads: int | None = None,
        on_phase: Callable[[str], None] | None = None,
        **_live: object,  # model (given as a string instead), on_progress, interval_s
    ) -> tuple[LoadReport, LoadSamples]:
        report, samples, _runs = run_sharded_bench(
            path,
            spec,
            shards=shards,
            address=address,
            durability=durability,
            threads=threads,
            model=model,
            on_phase=on_phase,
        )
        return report, samples

    return run
