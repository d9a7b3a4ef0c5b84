"""``corral bench --shards N``: the load run inside each of N shard processes.

Each shard is a Ray task holding ``shard_cpus`` CPUs. It gets a :class:`ShardPlan`, the
run as data: the spec and traffic (its share: :meth:`runtime.load.Traffic.share`), the
stack as a factory string (``package.module:factory``, imported in the shard as
``corral bench --agent`` imports it), the model as a model string or the simulated
model's settings, the prompts' texts (read once, by the driver). It runs
:func:`runtime.load.run_bench` over ``<store>/shard-<k>/``: opens an ordinary
``Runtime``, builds the stack, spawns its share of the agents, waits at a start gate
until every shard is ready (Ray starts worker processes one after the other, ~1 s each
here, and a shard spawns its agents at its own speed), runs the load (so the shards'
arrivals come together), closes the runtime and checks its own sessions. The runs are
merged into one :class:`~runtime.load.LoadReport` by :func:`runtime.load.merge_runs`
(sums; the exact percentiles of every turn; a wall time from the first shard's first
follow-up to the last shard's last settled turn, so shards that did not overlap count
against the result, never for it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from runtime.load import (
    LoadReport,
    LoadSamples,
    LoadSpec,
    Part,
    SimulatedSettings,
    Traffic,
    merge_runs,
)

from .layout import claim_layout, shard_path

__all__ = ["ShardPlan", "ShardRun", "run_shard_load", "run_sharded_bench", "sharded_bench_runner"]


class ShardPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What one shard runs: data only (it crosses to the shard's process)."""

    spec: LoadSpec  # the shard's share of the agents, its own seed
    durability: str = "write-ahead"
    threads: int | None = None
    model: str | None = None  # a model string, resolved in the shard
    simulated: SimulatedSettings | None = None  # else the simulated model's settings
    factory: str | None = None  # "package.module:factory", imported in the shard
    factory_name: str = "scripted"
    prompts: tuple[str, ...] = ()
    prompt_order: Literal["cycle", "sample"] = "cycle"
    traffic: Traffic | None = None  # the shard's share of an open loop


class ShardRun(msgspec.Struct, frozen=True):
    """What one shard's load run sends back."""

    index: int
    report: LoadReport
    samples: LoadSamples
    ended: float  # epoch seconds of the end of its load window
    cpu_s: float = 0.0  # CPU seconds its process used to the load's end (spawns included)


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


def run_shard_load(root: str, index: int, plan: ShardPlan, gate: Any) -> ShardRun:
    """One shard's run (in its Ray worker): see the module doc."""
    import ray  # noqa: PLC0415 - the optional extra, present in a shard

    from runtime.load import Prompts, load_factory, run_bench  # noqa: PLC0415
    from runtime.providers import resolve_model  # noqa: PLC0415 - vendor SDKs, loaded late

    factory = load_factory(plan.factory)[0] if plan.factory is not None else None
    model = None
    if plan.model is not None:
        model = resolve_model(plan.model)
    elif plan.simulated is not None:
        model = plan.simulated.build()
    prompts = None
    if plan.prompts:
        prompts = Prompts(plan.prompts, order=plan.prompt_order, seed=plan.spec.seed)
    window: dict[str, float] = {"cpu": time.process_time()}

    def ready() -> None:  # every shard spawned its agents: the load starts together
        ray.get(gate.arrive.remote(600.0))

    def phase(_what: str) -> None:  # the first phase after the load: it ended
        if "ended" not in window:
            window["ended"] = time.time()
            window["cpu_s"] = time.process_time() - window["cpu"]

    report, samples = run_bench(
        shard_path(root, index),
        plan.spec,
        durability=plan.durability,  # type: ignore[arg-type]
        threads=plan.threads,
        model=model,
        factory=factory,
        factory_name=plan.factory_name,
        prompts=prompts,
        traffic=plan.traffic,
        on_phase=phase,
        ready=ready,
    )
    return ShardRun(
        index, report, samples, window.get("ended", time.time()), round(window.get("cpu_s", 0.0), 3)
    )


def merge(runs: Sequence[ShardRun]) -> tuple[LoadReport, LoadSamples]:
    """One report of ``runs`` (see the module doc)."""
    return merge_runs(
        [Part(run.report, run.samples, run.ended) for run in runs],
        labels=[f"shard {run.index}" for run in runs],
    )


def _share(plan: ShardPlan, shards: int, index: int) -> ShardPlan:
    spec = plan.spec
    agents = spec.agents // shards + (1 if index < spec.agents % shards else 0)
    simulated = plan.simulated
    if simulated is not None:
        simulated = msgspec.structs.replace(simulated, seed=simulated.seed + index)
    return msgspec.structs.replace(
        plan,
        spec=msgspec.structs.replace(spec, agents=max(agents, 1), seed=spec.seed + index),
        simulated=simulated,
        traffic=plan.traffic.share(shards, index) if plan.traffic is not None else None,
    )


def run_sharded_bench(
    path: str | os.PathLike[str],
    spec: LoadSpec,
    *,
    shards: int,
    address: str | None = None,
    durability: str = "write-ahead",
    threads: int | None = None,
    model: str | None = None,
    simulated: SimulatedSettings | None = None,
    factory: str | None = None,
    factory_name: str | None = None,
    prompts: Sequence[str] = (),
    prompt_order: Literal["cycle", "sample"] = "cycle",
    traffic: Traffic | None = None,
    shard_cpus: float = 1.0,
    on_phase: Callable[[str], None] | None = None,
) -> tuple[LoadReport, LoadSamples, list[ShardRun]]:
    """Run ``spec`` (and ``traffic``: an open loop) split over ``shards`` shard
    processes; the merged report, its samples and every shard's own run. ``factory``
    is a ``package.module:factory`` string every shard can import (its directory on
    their PYTHONPATH), ``model`` a model string."""
    from .cluster import _ray, start_local_ray  # noqa: PLC0415 - Ray is imported only here

    phase = on_phase or (lambda _what: None)
    if shards > spec.agents:
        raise ValueError(f"{shards} shards for {spec.agents} agents: give each shard one at least")
    plan = ShardPlan(
        spec=spec,
        durability=durability,
        threads=threads,
        model=model,
        simulated=simulated,
        factory=factory,
        factory_name=factory_name or factory or ("simulated" if simulated else "scripted"),
        prompts=tuple(prompts),
        prompt_order=prompt_order,
        traffic=traffic,
    )
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
        refs = [task.remote(root, k, _share(plan, shards, k), gate) for k in range(shards)]
        runs: list[ShardRun] = ray.get(refs)
        ray.kill(gate)
    finally:
        if owns_ray:
            ray.shutdown()
    report, samples = merge(runs)
    return report, samples, runs


def sharded_bench_runner(
    shards: int, address: str | None, **plan: Any
) -> Callable[..., tuple[LoadReport, LoadSamples]]:
    """A function called like :func:`runtime.load.run_bench` (a sweep's ``runner``)
    that runs the load in ``shards`` shards (``corral bench --shards``). ``plan``:
    :func:`run_sharded_bench`'s model, simulated, factory, factory_name, prompts and
    prompt_order, given as data (the live objects of ``run_bench``'s keywords, a Model,
    a factory function, are refused: they cannot cross to a shard); progress is not
    reported live (each shard runs in its own process)."""

    def run(
        path: str | os.PathLike[str],
        spec: LoadSpec,
        *,
        durability: str = "write-ahead",
        threads: int | None = None,
        traffic: Traffic | None = None,
        on_phase: Callable[[str], None] | None = None,
        **_live: object,  # on_progress, interval_s, stop: a shard's own
    ) -> tuple[LoadReport, LoadSamples]:
        report, samples, _runs = run_sharded_bench(
            path,
            spec,
            shards=shards,
            address=address,
            durability=durability,
            threads=threads,
            traffic=traffic,
            on_phase=on_phase,
            **plan,
        )
        return report, samples

    return run
