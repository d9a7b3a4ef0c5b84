"""Turns per second of one plain Runtime against 1 and 2 corral shards on Ray, the cost a
verb pays through the cluster facade, and (``--scale N``) N agents across shards.

Cases, all measured in the same run:

- ``runtime``: the load (``runtime.load.run_bench``: N agents x T turns, scripted model,
  write-ahead) on one ``Runtime`` in this process: the baseline.
- ``1 shard`` / ``2 shards``: the same load split over that many shard processes
  (``runtime.cluster.bench.run_sharded_bench``: each shard a Ray task with one CPU
  running the same driver over its share, started together behind a gate). Turns/s is
  every settled turn over the time from the first shard's first follow-up to the last
  shard's last settled turn. Scaling efficiency = turns/s(2) / (2 x turns/s(1)).
- ``followup``: the latency of one ``agent.followup(...)`` call, on an agent of a plain
  Runtime and on a ``ClusterAgent`` (one round trip on its shard's direct connection),
  p50/p99 over ``--verbs`` calls, beside a no-op call on a plain Ray actor (what the
  verb cost when it was a Ray call); and per message of ``Cluster.send_many`` batches
  of 1,000.
- ``--scale N``: ``Cluster.open(shards=2)``, ``spawn_many(N)``, one follow-up each
  (``send_many``), every ``agent/settled`` forwarded to the driver and counted.

    python benchmarks/bench_shards.py                       # 2,000 agents x 10 turns
    python benchmarks/bench_shards.py --quick --json out.json
    python benchmarks/bench_shards.py --repeats 1 --scale 100000
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import median, parser, percentile, print_table, write_json

ROOT = Path(__file__).resolve().parent.parent

ECHO = "benchmarks.bench_shards:echo_model"


def echo_model() -> Any:
    """The model factory the shards of the verb and scale cases build (in the shard)."""
    from runtime import ScriptedModel

    return ScriptedModel.echo()


def load_cases(agents: int, turns: int, repeats: int) -> dict[str, Any]:
    import ray

    from runtime.cluster.bench import run_sharded_bench
    from runtime.cluster.cluster import start_local_ray
    from runtime.load import LoadSpec, run_bench

    spec = LoadSpec(agents=agents, turns=turns)
    runs: dict[str, list[float]] = {"runtime": [], "1 shard": [], "2 shards": []}
    cores: dict[str, list[float]] = {"1 shard": [], "2 shards": []}
    checks: dict[str, bool] = {}
    for r in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
            report, _ = run_bench(Path(tmp) / "plain", spec)
            runs["runtime"].append(report.turns_per_s)
            checks[f"runtime/{r}"] = bool(report.invariants_ok) and report.settled == agents * turns
            if not ray.is_initialized():
                start_local_ray(2, 1.0)  # its workers at niceness 0, as this process
            for shards, name in ((1, "1 shard"), (2, "2 shards")):
                merged, _, shard_runs = run_sharded_bench(
                    Path(tmp) / f"s{shards}", spec, shards=shards
                )
                runs[name].append(merged.turns_per_s)
                # the cores the shards got: CPU seconds over wall seconds of their runs
                cores[name].append(
                    sum(r.cpu_s / (r.report.spawn_s + r.report.wall_s) for r in shard_runs)
                )
                checks[f"{name}/{r}"] = (
                    bool(merged.invariants_ok) and merged.settled == agents * turns
                )
        print(
            f"  repeat {r + 1}: "
            + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in runs.items())
            + "; cores the shards got: "
            + ", ".join(f"{k} {v[-1]:.2f}" for k, v in cores.items())
        )
    tps = {name: median(values) for name, values in runs.items()}
    return {
        "agents": agents,
        "turns": turns,
        "turns_per_s": tps,
        "runs": runs,
        "shard_cores_used": cores,
        "all_settled_and_checked": all(checks.values()),
        "two_shards_over_runtime": tps["2 shards"] / tps["runtime"],
        "scaling_efficiency": tps["2 shards"] / (2 * tps["1 shard"]),
        "one_shard_over_runtime": tps["1 shard"] / tps["runtime"],
    }


def _latencies(call: Any, n: int) -> list[float]:
    out = []
    for i in range(n):
        start = time.perf_counter()
        call(i)
        out.append((time.perf_counter() - start) * 1e6)
    return out


def verb_cases(verbs: int) -> dict[str, Any]:
    from runtime import Runtime, ScriptedModel
    from runtime.cluster import Cluster

    with tempfile.TemporaryDirectory(prefix="bench-verbs-") as tmp:
        with Runtime.open(Path(tmp) / "plain") as rt:
            agents = [rt.spawn(model=ScriptedModel.echo()) for _ in range(100)]
            direct = _latencies(lambda i: agents[i % 100].followup(f"m{i}"), verbs)
            for agent in agents:
                agent.wait_idle(60)
        with Cluster.open(Path(tmp) / "cluster", shards=1) as cluster:
            handles = cluster.spawn_many(100, model=ECHO)
            _latencies(lambda i: handles[i % 100].followup(f"w{i}"), 200)  # warm up
            facade = _latencies(lambda i: handles[i % 100].followup(f"m{i}"), verbs)
            unwaited = _latencies(lambda i: handles[i % 100].followup(f"n{i}", wait=False), verbs)
            cluster.flush()  # the unwaited sends' acknowledgement
            batches = max(1, verbs // 1000)
            start = time.perf_counter()
            for b in range(batches):
                cluster.send_many([(handles[i % 100], f"b{b}-{i}") for i in range(1000)])
            batched_us = (time.perf_counter() - start) / (batches * 1000) * 1e6
            cluster.wait_idle(timeout=120)

    noop = ray_floor(verbs)

    def summary(values: list[float]) -> dict[str, float]:
        return {"p50_us": percentile(values, 50), "p99_us": percentile(values, 99)}

    d, f = summary(direct), summary(facade)
    return {
        "calls": verbs,
        "runtime_followup": d,
        "facade_followup": f,
        "facade_followup_unwaited": summary(unwaited),
        "ray_noop_call": summary(noop),
        "added_p50_us": f["p50_us"] - d["p50_us"],
        "added_p99_us": f["p99_us"] - d["p99_us"],
        "send_many_per_message_us": batched_us,
    }


class _Noop:
    def call(self, _i: int) -> None:
        return None


def ray_floor(calls: int) -> list[float]:
    """The latency of a no-op call on a plain threaded Ray actor: what any verb through
    Ray pays here, before corral does anything."""
    import ray

    actor = ray.remote(_Noop).options(num_cpus=0, max_concurrency=32).remote()
    ray.get(actor.call.remote(0))
    try:
        return _latencies(lambda i: ray.get(actor.call.remote(i)), calls)
    finally:
        ray.kill(actor)


def scale_case(agents: int) -> dict[str, Any]:
    from runtime.cluster import Cluster, ClusterEvent

    settled = [0]
    lock = threading.Lock()
    done = threading.Event()

    def on_settled(_event: ClusterEvent) -> None:
        with lock:
            settled[0] += 1
            if settled[0] == agents:
                done.set()

    chunk = 10_000
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        opened = time.perf_counter()
        with Cluster.open(Path(tmp) / "cluster", shards=2) as cluster:
            start = time.perf_counter()
            cluster.on("agent/settled", on_settled)
            handles = []
            for first in range(0, agents, chunk):
                handles += cluster.spawn_many(min(chunk, agents - first), model=ECHO)
            spawned = time.perf_counter()
            for first in range(0, agents, chunk):
                cluster.send_many([(a, "one turn") for a in handles[first : first + chunk]])
            all_settled = done.wait(1800)
            ended = time.perf_counter()
            per_shard = [info.agents for info in cluster.shard_info()]
    return {
        "agents": agents,
        "per_shard": per_shard,
        "open_s": start - opened,
        "spawn_s": spawned - start,
        "turns_s": ended - spawned,
        "settled": settled[0],
        "all_settled": all_settled,
        "spawns_per_s": agents / (spawned - start),
        "turns_per_s": settled[0] / (ended - spawned),
    }


def main() -> None:
    # Ray's workers inherit this: they import this tree and this module's echo_model.
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *paths])
    p = parser(__doc__.splitlines()[0], repeats=3)
    p.add_argument("--agents", type=int, default=2000)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--verbs", type=int, default=2000, help="followup calls timed per case")
    p.add_argument("--scale", type=int, default=0, help="also N agents x 1 turn on 2 shards")
    p.add_argument("--quick", action="store_true", help="200 agents x 5 turns, 1 repeat")
    args = p.parse_args()
    if args.quick:
        args.agents, args.turns, args.repeats, args.verbs = 200, 5, 1, 500
    print(f"load: {args.agents:,} agents x {args.turns} turns, write-ahead, {args.repeats} repeats")
    load = load_cases(args.agents, args.turns, args.repeats)
    print_table(
        ["case", "turns/s (median)", "x runtime"],
        [[k, v, v / load["turns_per_s"]["runtime"]] for k, v in load["turns_per_s"].items()],
    )
    print(f"scaling efficiency 1 -> 2 shards: {load['scaling_efficiency']:.2f}")
    verbs = verb_cases(args.verbs)
    print_table(
        ["followup", "p50 us", "p99 us"],
        [
            [
                "Runtime agent",
                verbs["runtime_followup"]["p50_us"],
                verbs["runtime_followup"]["p99_us"],
            ],
            [
                "ClusterAgent",
                verbs["facade_followup"]["p50_us"],
                verbs["facade_followup"]["p99_us"],
            ],
            [
                "ClusterAgent wait=False",
                verbs["facade_followup_unwaited"]["p50_us"],
                verbs["facade_followup_unwaited"]["p99_us"],
            ],
            ["no-op Ray call", verbs["ray_noop_call"]["p50_us"], verbs["ray_noop_call"]["p99_us"]],
        ],
    )
    print(
        f"added by the facade: p50 {verbs['added_p50_us']:,.0f} us, "
        f"p99 {verbs['added_p99_us']:,.0f} us; "
        f"send_many: {verbs['send_many_per_message_us']:.1f} us a message"
    )
    results: dict[str, Any] = {"load": load, "verbs": verbs}
    if args.scale:
        scale = scale_case(args.scale)
        results["scale"] = scale
        print(
            f"scale: {scale['agents']:,} agents on 2 shards {scale['per_shard']}: spawned in "
            f"{scale['spawn_s']:.1f} s, {scale['settled']:,} turns settled in "
            f"{scale['turns_s']:.1f} s"
        )
    import ray

    ray.shutdown()
    write_json(args.json, "bench_shards", results)


if __name__ == "__main__":
    main()
