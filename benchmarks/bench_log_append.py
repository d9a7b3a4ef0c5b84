"""Durable log appends: group commit under concurrent producers, and bulk throughput.

Cases (each repeated, median reported):

- ``baseline``: plain ``lmdb`` calls with the store's settings (``sync=True``): one
  write transaction + synchronous commit per event, pre-encoded realistic records.
- ``P producers``: P threads, each appending realistic events to its own session and
  waiting for durability (``session.flush()``) after *every* append. The log writer
  group-commits whatever all producers queued into one transaction (appended to the
  journal) and compacts the journal into the session-major ``events`` database. The
  time runs until the store is closed, so it includes every compaction, the last one
  too; the JSON has the writer's commits and compactions per run.
- ``P producers as asyncio tasks``: the same appends and waits, each producer a task
  on one event loop that awaits ``session.aflush()`` after every append: producers that
  wait for durability without an OS thread each, so without a thread wake-up and GIL
  hand-off per append (the loop is woken once per commit).
- ``P producers as pooled actors``: the same appends and waits, each producer a
  ``PooledActor`` on one dispatcher worker (and a standby one, as the runtime's
  default) that appends in a message handler and joins the dispatcher's
  ``FlushGroup``, whose callback sends it its next message: how corral's agents wait
  for durability (one flush for every actor that waited in one round of the run
  queue, no thread per producer).
- ``bulk``: one session, N ``session.append`` calls then one ``flush()`` (per
  durability mode).
- ``bulk via Session.extend``: the same N facts in one ``session.extend`` call (one
  validation pass, one hand-over to the writer) then one ``flush()``; and in calls of
  1,000 facts, as an importer reading a file would make them.
- ``session.append only`` / ``Session.extend only``: the same N facts into a session
  over the in-memory sink, i.e. the cost of validation, encoding and projections
  alone, to show how much of the bulk figures is the store's.

The repeats are interleaved (every case once, then every case again...), so that a
neighbour's disk load drifting during the run weighs on the baseline and on the cases
alike.

Run: ``python benchmarks/bench_log_append.py [--repeats 3] [--json out.json]``
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
from _common import median, parser, print_table, write_json

from actors import Dispatcher, PooledActor
from actors.flushes import FlushGroup
from storage import (
    Codec,
    Event,
    EventTypes,
    MemorySink,
    Session,
    SessionHeader,
    Store,
    StoreStatistics,
)
from storage.events import (
    AgentInboxSpliced,
    AssistantChunk,
    AssistantMessage,
    AssistantMessageData,
    Completed,
    MessageTrigger,
    StepEnd,
    StepStart,
    TextBlock,
    TextDelta,
    TurnEnd,
    TurnStart,
    Usage,
    UserMessage,
    UserMessageData,
)

Fact = tuple[str, object]


def realistic_facts(count: int) -> list[Fact]:
    """``count`` facts of typical one-step turns, valid for a session starting at seq 0:
    inbox insert and claim, turn/step boundaries, the user message, 8 streamed chunks
    and the assembled reply citing them (13 events per turn)."""
    facts: list[Fact] = []
    turn = 0
    while len(facts) < count:
        turn += 1
        message = UserMessage(
            id=f"m-{turn}",
            content=(TextBlock(text=f"Turn {turn}: summarise the attached report in 3 bullets."),),
        )
        facts.append(
            ("agent/inbox/spliced", AgentInboxSpliced("next-turn", 0, inserted=(message,)))
        )
        facts.append(("turn/start", TurnStart(turn=turn, trigger=MessageTrigger())))
        facts.append(("agent/inbox/spliced", AgentInboxSpliced("next-turn", 0, removed_count=1)))
        facts.append(("step/start", StepStart(turn=turn, step=1)))
        facts.append(("user/message", UserMessageData(message=message, turn=turn, step=1)))
        first_chunk = len(facts)
        for index in range(8):
            text = TextDelta(text=f"streamed piece {index} of the answer, ")
            facts.append(("assistant/chunk", AssistantChunk(turn=turn, step=1, chunk=text)))
        reply = AssistantMessage(content=(TextBlock(text="the whole answer " * 8),))
        data = AssistantMessageData(
            turn=turn,
            step=1,
            message=reply,
            usage=Usage(input_tokens=812, output_tokens=96),
            finish_reason="stop",
            source_event_seqs=tuple(range(first_chunk, first_chunk + 8)),
        )
        facts.append(("assistant/message", data))
        facts.append(("step/end", StepEnd(turn=turn, step=1)))
        facts.append(("turn/end", TurnEnd(turn=turn, reason=Completed())))
    return facts[:count]


def encoded(facts: list[Fact]) -> list[bytes]:
    codec = Codec(EventTypes.default())
    return [
        codec.encode(Event(kind, seq, 1_718_000_000_000, data))
        for seq, (kind, data) in enumerate(facts)
    ]


class Scratch:
    """A fresh temporary directory per measured run."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="corral-bench-", dir="/tmp"))
        self.count = 0

    def next(self) -> Path:
        self.count += 1
        return self.root / f"run-{self.count}"

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def baseline(path: Path, payloads: list[bytes]) -> float:
    """Seconds for one write transaction + synchronous commit per event."""
    env = lmdb.open(str(path), subdir=True, max_dbs=8, map_size=64 << 20, sync=True, metasync=True)
    events = env.open_db(b"events")
    start = time.perf_counter()
    for seq, payload in enumerate(payloads):
        with env.begin(write=True) as txn:
            txn.put((1).to_bytes(8, "big") + seq.to_bytes(8, "big"), payload, db=events)
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed


def _producer_store(
    path: Path, count: int, per_producer: int
) -> tuple[list[Fact], Store, list[Session]]:
    """A producer's facts, and a store at ``path`` with ``count`` durable empty sessions."""
    store = Store.open(path)
    sessions = [store.create_session(f"producer-{i}") for i in range(count)]
    store.flush()
    return realistic_facts(per_producer), store, sessions


def producers(path: Path, count: int, per_producer: int, writes: list[dict[str, float]]) -> float:
    """Seconds for ``count`` threads to each append ``per_producer`` events, each
    followed by a flush that waits for durability, and for the store to close (its
    last journal compaction). Appends the writer's commit counts to ``writes``."""
    facts, store, sessions = _producer_store(path, count, per_producer)
    ready = threading.Barrier(count + 1)

    def produce(session: Session) -> None:
        ready.wait()
        for kind, data in facts:
            session.append(kind, data)
            session.flush()

    threads = [threading.Thread(target=produce, args=(s,)) for s in sessions]
    for thread in threads:
        thread.start()
    before = store.statistics()
    ready.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return _closed(store, before, start, count * per_producer, writes)


def task_producers(
    path: Path, count: int, per_producer: int, writes: list[dict[str, float]]
) -> float:
    """:func:`producers` with ``count`` asyncio tasks on one event loop instead of
    threads, each awaiting its flush."""
    facts, store, sessions = _producer_store(path, count, per_producer)

    async def produce(session: Session) -> None:
        for kind, data in facts:
            session.append(kind, data)
            await session.aflush()

    async def run_all() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(produce(session) for session in sessions))
        return start

    before = store.statistics()
    start = asyncio.run(run_all())
    return _closed(store, before, start, count * per_producer, writes)


def actor_producers(
    path: Path, count: int, per_producer: int, writes: list[dict[str, float]]
) -> float:
    """:func:`producers` with ``count`` pooled actors instead of threads, as corral's
    agents wait for durability: on the runtime's dispatcher (one worker and a standby),
    each appends in a message handler and joins a :class:`FlushGroup`, whose callback
    sends it its next message."""
    facts, store, sessions = _producer_store(path, count, per_producer)
    dispatcher = Dispatcher(1, standby=1, name="bench-producers")
    group = FlushGroup(store, dispatcher)
    finished = threading.Semaphore(0)
    failures: list[BaseException] = []

    class Producer(PooledActor):
        actor_dispatcher = dispatcher

        def __init__(self, session: Session) -> None:
            super().__init__()
            self.session = session
            self.appended = 0

        def on_receive(self, message: Any) -> None:
            if isinstance(message, BaseException):  # a failed flush
                failures.append(message)
                finished.release()
                return
            if self.appended == len(facts):
                finished.release()
                return
            kind, data = facts[self.appended]
            self.appended += 1
            self.session.append(kind, data)
            group.join(self.session, self.actor_ref.tell)  # tell(None): durable, go on

    actors = [Producer.start(session) for session in sessions]
    before = store.statistics()
    start = time.perf_counter()
    for actor in actors:
        actor.tell(None)
    for _ in actors:
        if not finished.acquire(timeout=600):
            raise SystemExit("actor producers did not finish in 600 s")
    if failures:
        raise failures[0]
    for actor in actors:
        actor.stop(block=False)
    dispatcher.shutdown(30)
    return _closed(store, before, start, count * per_producer, writes)


def _closed(
    store: Store,
    before: StoreStatistics,
    start: float,
    events: int,
    writes: list[dict[str, float]],
) -> float:
    """Close ``store``; the seconds since ``start``; the writer's commits to ``writes``."""
    after = store.statistics()  # before close: a closed store answers nothing
    store.close()
    elapsed = time.perf_counter() - start
    commits = after.commits - before.commits
    writes.append(
        {
            "commits": commits,
            "compactions_before_close": after.compactions - before.compactions,
            "events_per_commit": events / commits,
            "ms_per_commit": 1000 * elapsed / commits,
        }
    )
    return elapsed


def write(session: Session, facts: list[Fact], batch: int | None) -> None:
    """``facts`` one ``append`` each (``batch=None``) or ``extend`` calls of ``batch``."""
    if batch is None:
        for kind, data in facts:
            session.append(kind, data)
    else:
        for start in range(0, len(facts), batch):
            session.extend(facts[start : start + batch])


def bulk(path: Path, facts: list[Fact], durability: str, batch: int | None = None) -> float:
    with Store.open(path, durability=durability, map_size=256 << 20) as store:  # type: ignore[arg-type]
        session = store.create_session("bulk")
        store.flush()
        start = time.perf_counter()
        write(session, facts, batch)
        store.flush()
        return time.perf_counter() - start


def append_only(facts: list[Fact], batch: int | None = None) -> float:
    header = SessionHeader(id="memory", key=1, created=0)
    session = Session(header, sink=MemorySink(), codec=Codec(EventTypes.default()))
    start = time.perf_counter()
    write(session, facts, batch)
    return time.perf_counter() - start


def main() -> None:
    args_parser = parser(__doc__.splitlines()[0], repeats=3)
    args_parser.add_argument("--baseline-events", type=int, default=1000)
    args_parser.add_argument("--bulk-events", type=int, default=100_000)
    args = args_parser.parse_args()
    scratch = Scratch()
    cases: list[tuple[str, int, Callable[[], float]]] = []
    payloads = encoded(realistic_facts(args.baseline_events))
    cases.append(
        (
            "baseline: txn + sync commit per event",
            len(payloads),
            lambda: baseline(scratch.next(), payloads),
        )
    )
    writes: dict[str, list[dict[str, float]]] = {}
    producer_cases = (
        ("{} producers, flush after each append", producers, ((1, 1000), (8, 400), (64, 200))),
        (
            "{} producers as asyncio tasks, flush after each append",
            task_producers,
            ((8, 400), (64, 200)),
        ),
        (
            "{} producers as pooled actors, flush after each append",
            actor_producers,
            ((8, 400), (64, 200)),
        ),
    )
    for label, run_producers, sizes in producer_cases:
        for count, per in sizes:
            name = label.format(count)
            writes[name] = []
            cases.append(
                (
                    name,
                    count * per,
                    lambda f=run_producers, c=count, p=per, w=writes[name]: f(
                        scratch.next(), c, p, w
                    ),
                )
            )
    facts = realistic_facts(args.bulk_events)
    for mode in ("write-ahead", "none"):
        cases.append(
            (
                f"bulk appends then one flush ({mode})",
                len(facts),
                lambda m=mode: bulk(scratch.next(), facts, m),
            )
        )
    everything = len(facts)
    for mode, batch in (("write-ahead", everything), ("write-ahead", 1000), ("none", everything)):
        calls = "one call" if batch == everything else f"calls of {batch}"
        cases.append(
            (
                f"bulk via Session.extend, {calls}, then one flush ({mode})",
                len(facts),
                lambda m=mode, b=batch: bulk(scratch.next(), facts, m, b),
            )
        )
    cases.append(("session.append only (in-memory sink)", len(facts), lambda: append_only(facts)))
    cases.append(
        (
            "Session.extend only, one call (in-memory sink)",
            len(facts),
            lambda: append_only(facts, everything),
        )
    )

    results: dict[str, Any] = {}
    rows = []
    base_rate = 0.0
    seconds: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    try:
        for _ in range(args.repeats):
            for name, _, run in cases:
                seconds[name].append(run())
    finally:
        scratch.remove()
    for name, events, _ in cases:
        rate = events / median(seconds[name])
        base_rate = base_rate or rate
        results[name] = {
            "events": events,
            "seconds": seconds[name],
            "events_per_s": rate,
            "vs_baseline": rate / base_rate,
            **({"writes": writes[name]} if name in writes else {}),
        }
        rows.append([name, events, median(seconds[name]), rate, f"{rate / base_rate:.1f}x"])
    print_table(["case", "events", "median s", "events/s", "vs baseline"], rows)
    for name, runs in writes.items():
        per_commit = median([run["events_per_commit"] for run in runs])
        ms = median([run["ms_per_commit"] for run in runs])
        print(f"{name}: {per_commit:.1f} events and {ms:.2f} ms per commit (medians)")
    write_json(args.json, "log_append", results)


if __name__ == "__main__":
    main()
