"""PooledActor against pykka's ThreadingActor, measured in the same run.

Metrics per actor count: start time, RSS per actor (in a fresh subprocess), tell
throughput across all actors, fan-out (one ask to every actor, all replies), and
stop time (in start order; see the README for why not ``stop_all``). Also ask
round-trip p50/p99 with one actor, and the bus fast path with no listeners.

    python benchmarks/bench_actors.py --quick
    python benchmarks/bench_actors.py --sizes 1,1000,10000,100000 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import pykka
from pykka import ActorRegistry

from actors import Bus, Dispatcher, IoSide, PooledActor

WAIT = 600.0


class Latch:
    """Counts actors that received their last expected message."""

    def __init__(self, actors: int) -> None:
        self.remaining = actors
        self.lock = threading.Lock()
        self.done = threading.Event()
        if actors == 0:
            self.done.set()

    def count_down(self) -> None:
        with self.lock:
            self.remaining -= 1
            if self.remaining == 0:
                self.done.set()


class Counting:
    """Mixin: counts tells; the ``expected``-th one counts the latch down. Replies to asks."""

    latch: Latch | None = None
    expected = 0

    def __init__(self) -> None:
        super().__init__()
        self.received = 0

    def on_receive(self, message: Any) -> Any:
        if message == "ask":
            return self.received
        self.received += 1
        if self.received == Counting.expected and Counting.latch is not None:
            Counting.latch.count_down()
        return None


class PooledCounter(Counting, PooledActor):
    pass


class ThreadingCounter(Counting, pykka.ThreadingActor):
    use_daemon_thread = True


KINDS: dict[str, type[pykka.Actor]] = {"pooled": PooledCounter, "threading": ThreadingCounter}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_round(cls: type[pykka.Actor], n: int, per_actor: int) -> dict[str, float]:
    """Start n actors, tell per_actor messages to each, fan out one ask, stop them."""
    gc.collect()
    t0 = time.perf_counter()
    refs = [cls.start() for _ in range(n)]
    start_s = time.perf_counter() - t0

    Counting.expected = per_actor
    Counting.latch = latch = Latch(n)
    t0 = time.perf_counter()
    for _ in range(per_actor):
        for ref in refs:
            ref.tell(1)
    if not latch.done.wait(WAIT):
        raise RuntimeError("tell round did not finish")
    tell_s = time.perf_counter() - t0
    total = per_actor * n

    t0 = time.perf_counter()
    futures = [ref.ask("ask", block=False) for ref in refs]
    replies = [f.get(timeout=WAIT) for f in futures]
    fanout_s = time.perf_counter() - t0
    assert all(r == per_actor for r in replies)

    t0 = time.perf_counter()
    stops = [ref.stop(block=False) for ref in refs]  # start order: see README
    for stop in stops:
        stop.get(timeout=WAIT)
    stop_s = time.perf_counter() - t0
    return {
        "start_s": start_s,
        "start_us_per_actor": start_s / n * 1e6,
        "tell_msgs": total,
        "tell_msgs_per_s": total / tell_s,
        "fanout_s": fanout_s,
        "stop_s": stop_s,
    }


def ask_latency(cls: type[pykka.Actor], count: int) -> dict[str, float]:
    ref = cls.start()
    try:
        for _ in range(min(500, count)):
            ref.ask("ask")
        samples = []
        for _ in range(count):
            t0 = time.perf_counter()
            ref.ask("ask")
            samples.append(time.perf_counter() - t0)
    finally:
        ref.stop()
    samples.sort()
    return {
        "p50_us": samples[len(samples) // 2] * 1e6,
        "p99_us": samples[int(len(samples) * 0.99)] * 1e6,
        "asks": count,
    }


def child_rss(kind: str, n: int) -> None:
    """Subprocess mode: RSS growth per actor after starting n actors of one kind."""
    cls = KINDS[kind]
    warm = cls.start()  # dispatcher threads, imports and first-use caches
    warm.ask("ask")
    gc.collect()
    before = psutil.Process().memory_info().rss
    refs = [cls.start() for _ in range(n)]
    for future in [ref.ask("ask", block=False) for ref in refs]:
        future.get(timeout=WAIT)  # every actor has started and handled a message
    gc.collect()
    after = psutil.Process().memory_info().rss
    print(json.dumps({"rss_before": before, "rss_after": after, "per_actor": (after - before) / n}))
    sys.stdout.flush()
    os._exit(0)  # skip stopping n actors: only the measurement matters here


def measure_rss(kind: str, n: int) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--child-rss", kind, str(n)],
        check=True,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["per_actor"])


def stop_all_lifo(n: int) -> float:
    """What ``ActorRegistry.stop_all()`` costs: it stops in reverse start order."""
    refs = [PooledCounter.start() for _ in range(n)]
    assert len(refs) == n
    t0 = time.perf_counter()
    ActorRegistry.stop_all(timeout=WAIT)
    return time.perf_counter() - t0


def registry_unregister_cost(n: int, lifo_sample: int = 1_000) -> dict[str, float]:
    """pykka's ``ActorRegistry.unregister`` on a plain list, as pykka does it (in + remove).

    Start order removes from the front (a memmove per removal); reverse order, what
    ``stop_all`` does, scans the whole list twice per removal: estimated from a sample.
    """

    class Ref:
        pass

    refs = [Ref() for _ in range(n)]
    registry = refs[:]
    t0 = time.perf_counter()
    for ref in refs:
        if ref in registry:
            registry.remove(ref)
    fifo_s = time.perf_counter() - t0
    registry = refs[:]
    sample = refs[-min(lifo_sample, n) :]
    t0 = time.perf_counter()
    for ref in reversed(sample):
        if ref in registry:
            registry.remove(ref)
    per_removal = (time.perf_counter() - t0) / len(sample)
    return {"actors": n, "start_order_s": fifo_s, "reverse_order_estimate_s": per_removal * n / 2}


def bus_fast_path(repeats: int) -> dict[str, float]:
    io = IoSide(blocking_workers=1, name="bench-io")
    bus = Bus(io)
    bus.on("some/other", lambda _e: None)
    loops = 200_000

    def per_call(fn: Callable[[], object]) -> float:
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(loops):
                fn()
            runs.append((time.perf_counter() - t0) / loops * 1e9)
        return median(runs)

    def default() -> None:
        return None

    try:
        return {
            "emit_ns": per_call(lambda: bus.emit("agent/status", None, scope="a")),
            "serial_ns": per_call(lambda: bus.serial("agent/turn-stopping", None, scope="a")),
            "waterfall_ns": per_call(lambda: bus.waterfall("agent/request", None, default)),
        }
    finally:
        io.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,1000,10000,100000")
    parser.add_argument("--quick", action="store_true", help="fewer messages and repeats")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--threading-max", type=int, default=10_000, help="largest ThreadingActor count to run"
    )
    parser.add_argument("--child-rss", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_rss:
        child_rss(args.child_rss[0], int(args.child_rss[1]))
        return

    sizes = [int(s) for s in args.sizes.split(",")]
    repeats = args.repeats or (1 if args.quick else 3)
    total_messages = 50_000 if args.quick else 200_000
    threading_messages = 10_000 if args.quick else 20_000  # ThreadingActor is slow: sample
    ask_count = 2_000 if args.quick else 10_000
    dispatcher = Dispatcher.default()
    results: dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "pykka": importlib.metadata.version("pykka"),
            "dispatcher_workers": dispatcher.statistics().workers,
            "throughput": dispatcher.throughput,
        },
        "repeats": repeats,
        "sizes": {},
    }

    # Latency first, in a quiet process: later phases leave thousands of exiting threads.
    gc.collect()
    results["ask_one_actor"] = {kind: ask_latency(cls, ask_count) for kind, cls in KINDS.items()}
    for kind, lat in results["ask_one_actor"].items():
        print(f"ask round trip, one {kind} actor: p50 {lat['p50_us']:.1f} us, "
              f"p99 {lat['p99_us']:.1f} us ({lat['asks']} asks)")  # fmt: skip

    print(f"{'actors':>8} {'kind':>9} {'start s':>9} {'us/actor':>9} {'RSS B/actor':>12} "
          f"{'tell msg/s':>12} {'fan-out s':>10} {'stop s':>8}")  # fmt: skip
    for n in sizes:
        row: dict[str, Any] = {}
        for kind, cls in KINDS.items():
            if kind == "threading" and n > args.threading_max:
                print(f"{n:>8} {kind:>9}  skipped: one OS thread per actor is impractical here")
                row[kind] = None
                continue
            budget = threading_messages if kind == "threading" else total_messages
            per_actor = max(1, budget // n)
            reps = 1 if kind == "threading" and n >= 10_000 else repeats
            if reps < repeats:
                print(f"{n:>8} {kind:>9}  one repeat only: one OS thread per actor is slow here")
            rounds = [run_round(cls, n, per_actor) for _ in range(reps)]
            metrics = {key: median([r[key] for r in rounds]) for key in rounds[0]}
            metrics["repeats"] = reps
            metrics["tell_msgs_per_actor"] = per_actor
            metrics["rss_bytes_per_actor"] = measure_rss(kind, n) if n >= 1000 else None
            row[kind] = metrics
            rss = metrics["rss_bytes_per_actor"]
            print(
                f"{n:>8} {kind:>9} {metrics['start_s']:>9.3f} {metrics['start_us_per_actor']:>9.1f}"
                f" {'-' if rss is None else f'{rss:,.0f}':>12} {metrics['tell_msgs_per_s']:>12,.0f}"
                f" {metrics['fanout_s']:>10.3f} {metrics['stop_s']:>8.3f}"
            )
        if row.get("threading") and row.get("pooled"):
            p, t = row["pooled"], row["threading"]
            row["ratio_pooled_over_threading"] = {
                key: (p[key] / t[key] if p.get(key) and t.get(key) else None)
                for key in (
                    "start_s",
                    "tell_msgs_per_s",
                    "fanout_s",
                    "stop_s",
                    "rss_bytes_per_actor",
                )
            }
            ratio = row["ratio_pooled_over_threading"]
            rss_ratio = ratio["rss_bytes_per_actor"]
            rss_text = "-" if rss_ratio is None else f"{rss_ratio:.3f}"
            print(
                f"{n:>8} {'ratio P/T':>9} {ratio['start_s']:>9.3f} {'':>9} {rss_text:>12}"
                f" {ratio['tell_msgs_per_s']:>12.1f} {ratio['fanout_s']:>10.3f}"
                f" {ratio['stop_s']:>8.3f}"
            )
        results["sizes"][str(n)] = row

    lifo_n = min(10_000, max(sizes))
    results["stop_all_lifo"] = {"actors": lifo_n, "seconds": stop_all_lifo(lifo_n)}
    print(f"ActorRegistry.stop_all() of {lifo_n} pooled actors (reverse order): "
          f"{results['stop_all_lifo']['seconds']:.3f} s")  # fmt: skip
    reg = results["registry_unregister"] = registry_unregister_cost(max(sizes))
    print(f"pykka registry unregister of {reg['actors']} refs: start order "
          f"{reg['start_order_s']:.2f} s, reverse order ~{reg['reverse_order_estimate_s']:.0f} s"
          " (estimated)")  # fmt: skip
    results["bus_no_listener"] = bus_fast_path(repeats)
    bus = results["bus_no_listener"]
    print(f"bus with no listener: emit {bus['emit_ns']:.0f} ns, serial {bus['serial_ns']:.0f} ns, "
          f"waterfall {bus['waterfall_ns']:.0f} ns")  # fmt: skip
    results["targets"] = evaluate_targets(results)
    for name, ok in results["targets"].items():
        print(f"target {name}: {'met' if ok else 'NOT met' if ok is False else 'not measured'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    dispatcher.shutdown(timeout=10)


def evaluate_targets(results: dict[str, Any]) -> dict[str, bool | None]:
    sizes = results["sizes"]
    at10k = sizes.get("10000") or {}
    ratio = (at10k.get("ratio_pooled_over_threading") or {}).get("tell_msgs_per_s")
    pooled10k = at10k.get("pooled") or {}
    pooled100k = (sizes.get("100000") or {}).get("pooled")
    return {
        "10k tell >= 50x ThreadingActor": None if ratio is None else ratio >= 50,
        "10k start < 0.5 s": None if not pooled10k else pooled10k["start_s"] < 0.5,
        "100k start and fan-out": None if pooled100k is None else True,
        "ask p99 < 200 us (pooled)": results["ask_one_actor"]["pooled"]["p99_us"] < 200,
    }


if __name__ == "__main__":
    main()
