"""A session with a durable reader keeps only its not-yet-durable tail in memory."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec
import pytest

from storage import (
    Codec,
    Event,
    EventTypes,
    MemorySink,
    PendingRecord,
    Session,
    SessionHeader,
    StoreClosedError,
    assert_invariants,
    derive_messages,
)
from storage.events import AssistantChunk, TextDelta
from storage.lmdb.store import Store
from storage.session import TAIL_BOUND
from tests.storage.builders import (
    START_TIME,
    LogBuilder,
    completed_turn,
    open_turn_with_pending_call,
    ticking_clock,
    tool_turn,
)

FlushCallback = Callable[[BaseException | None], None]
CODEC = Codec(EventTypes.default())


class DurableSink(MemorySink):
    """A memory sink that is also the store: ``read`` decodes what was submitted.

    With ``manual=True`` its ``flush_async`` callbacks wait in :attr:`pending` until the
    test resolves them (as a writer thread would, later)."""

    def __init__(self, *, manual: bool = False) -> None:
        super().__init__()
        self.manual = manual
        self.pending: list[FlushCallback] = []
        self.reads: list[tuple[int, int]] = []

    def flush_async(self, callback: FlushCallback) -> None:
        if self.manual:
            self.flushes += 1
            self.pending.append(callback)
        else:
            super().flush_async(callback)

    def resolve(self, error: BaseException | None = None) -> None:
        pending, self.pending = self.pending, []
        for callback in pending:
            callback(error)

    def read(self, *, lower: int, upper: int) -> list[Event]:
        self.reads.append((lower, upper))
        events = [CODEC.decode(r.payload, session_id="s") for r in self.records]
        return [e for e in events if e is not None and lower <= e.seq <= upper]

    def preload(self, events: Iterable[Event]) -> None:
        """Make ``events`` durable, as if an earlier process had written them."""
        for event in events:
            self.submit(PendingRecord(1, event.seq, CODEC.encode(event)))


def durable_session(
    sink: DurableSink, events: Iterable[Event] = (), *, tail_bound: int = 8
) -> Session:
    header = SessionHeader(id="s", key=1, created=START_TIME)
    return Session(
        header,
        sink=sink,
        codec=CODEC,
        clock=ticking_clock(),
        events=events,
        reader=sink.read,
        tail_bound=tail_bound,
    )


def two_turns(session: Session) -> list[Event]:
    log = LogBuilder(session)
    completed_turn(log)
    tool_turn(log)
    return log.events


def test_a_flush_drops_what_it_made_durable_and_events_reads_it_back() -> None:
    sink = DurableSink()
    session = durable_session(sink, tail_bound=1000)
    appended = two_turns(session)
    assert session.resident_events == len(appended)
    session.flush()
    assert session.resident_events == 0
    assert session.events() == appended
    assert session.events(3, 7) == appended[3:8]
    assert session.messages() == derive_messages(appended)


def test_events_joins_the_durable_part_and_the_tail() -> None:
    sink = DurableSink()
    session = durable_session(sink, tail_bound=1000)
    first = two_turns(session)
    session.flush()
    second = two_turns(session)
    everything = first + second
    assert session.resident_events == len(second)
    assert session.events() == everything
    boundary = first[-1].seq
    for lower, upper in [(0, None), (boundary - 2, boundary + 2), (boundary + 1, None), (5, 4)]:
        stop = None if upper is None else upper + 1
        assert session.events(lower, upper) == everything[lower:stop]
    sink.reads.clear()
    assert session.events(boundary + 1) == second
    assert sink.reads == []  # the tail alone is served from memory


def test_flush_async_acknowledges_only_on_success() -> None:
    sink = DurableSink(manual=True)
    session = durable_session(sink, tail_bound=1000)
    appended = two_turns(session)
    outcomes: list[BaseException | None] = []
    session.flush_async(outcomes.append)
    sink.resolve(StoreClosedError("gone"))
    assert isinstance(outcomes[0], StoreClosedError)
    assert session.resident_events == len(appended)
    session.flush_async(outcomes.append)
    later = session.append_fact(appended[0].data)  # appended after the flush request
    sink.resolve()
    assert outcomes[1] is None
    assert session.events(later.seq) == [later]
    assert session.resident_events == 1


def test_an_acknowledgement_drops_exactly_through_its_mark_and_refuses_one_past_the_last() -> None:
    sink = DurableSink(manual=True)
    session = durable_session(sink, tail_bound=1000)
    appended = two_turns(session)
    session.acknowledge(appended[4].seq)  # e.g. a flush group's member mark
    assert session.resident_events == len(appended) - 5
    assert session.events() == appended  # the dropped ones are read back
    with pytest.raises(ValueError, match=f"its last event is seq {appended[-1].seq}"):
        session.acknowledge(appended[-1].seq + 1)
    assert session.resident_events == len(appended) - 5


def test_every_range_read_across_the_dropped_part_and_the_tail_equals_what_was_appended() -> None:
    """With a reader the tail holds the records of the events not yet durable and a read
    decodes them: each inclusive range, inside, across and outside both parts, gives
    the appended events of that range."""
    sink = DurableSink(manual=True)
    session = durable_session(sink, tail_bound=1000)
    appended = two_turns(session)
    session.acknowledge(appended[6].seq)
    assert session.resident_events == len(appended) - 7
    last = appended[-1].seq
    for lower in range(last + 3):
        for upper in [None, *range(lower - 1, last + 3)]:
            stop = None if upper is None else upper + 1
            assert session.events(lower, upper) == appended[lower:stop], (lower, upper)


def test_a_session_never_flushed_asks_its_sink_once_its_tail_reaches_the_bound() -> None:
    sink = DurableSink(manual=True)
    session = durable_session(sink, tail_bound=8)
    appended = two_turns(session)  # 25 events, no flush by the caller
    assert len(appended) > 2 * 8
    assert sink.flushes == 1  # one request at a time, however long the tail grows
    sink.resolve()
    assert session.resident_events < len(appended)
    more = two_turns(session)
    assert sink.flushes == 2
    sink.resolve()
    assert session.resident_events < len(more)  # what came after the second request
    assert session.events() == appended + more
    assert_invariants(session.events())


def test_a_failed_probe_keeps_the_tail_and_a_later_one_is_asked() -> None:
    sink = DurableSink(manual=True)
    session = durable_session(sink, tail_bound=4)
    appended = two_turns(session)
    sink.resolve(StoreClosedError("gone"))
    assert session.resident_events == len(appended)
    two_turns(session)
    assert sink.flushes == 2


def test_an_acknowledgement_while_the_lock_is_held_is_applied_by_a_later_append() -> None:
    sink = DurableSink(manual=True)
    session = durable_session(sink, tail_bound=4)
    appended = two_turns(session)
    inside, release = threading.Event(), threading.Event()

    def slow_observer(event: Event) -> None:  # holds the session lock while it runs
        inside.set()
        release.wait(10)

    dispose = session.on_event(slow_observer)
    appender = threading.Thread(target=session.append_fact, args=(appended[0].data,))
    appender.start()
    assert inside.wait(10)
    sink.resolve()  # the writer thread's callback: it must not wait for the lock
    held = session.resident_events
    assert held == len(appended) + 1
    release.set()
    appender.join(10)
    dispose()
    last = session.append_fact(appended[0].data)
    assert session.resident_events < held
    assert session.events()[-1] == last
    assert len(session.events()) == len(appended) + 2


def test_loaded_history_is_streamed_into_the_projections_and_not_kept() -> None:
    log = LogBuilder()
    completed_turn(log)
    tool_turn(log)
    sink = DurableSink()
    sink.preload(log.events)
    session = durable_session(sink, iter(log.events))
    assert session.resident_events == 0
    assert session.last_seq == log.events[-1].seq
    assert session.events() == log.events
    assert session.messages() == derive_messages(log.events)


def test_repair_reads_the_open_turn_back_from_the_store() -> None:
    log = LogBuilder()
    completed_turn(log)
    open_turn_with_pending_call(log)
    sink = DurableSink()
    sink.preload(log.events)
    session = durable_session(sink, log.events)
    repaired = session.repair()
    assert [e.type for e in repaired][-2:] == ["step/end", "turn/end"]
    assert_invariants(session.events())


def test_without_a_reader_every_event_stays_in_memory() -> None:
    sink = MemorySink()
    header = SessionHeader(id="s", key=1, created=START_TIME)
    session = Session(header, sink=sink, codec=CODEC, tail_bound=2)
    appended = two_turns(session)
    session.flush()
    assert session.resident_events == len(appended)
    assert sink.flushes == 1
    assert session.events() == appended


def test_the_tail_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tail_bound"):
        durable_session(DurableSink(), tail_bound=0)


# --------------------------------------------------------------------------- store


def test_a_store_session_drops_flushed_events_and_reads_them_back(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        session = store.create_session("a")
        appended = two_turns(session)
        session.flush()
        assert session.resident_events == 0
        assert session.events() == appended == store.read("a")


@pytest.mark.parametrize("durability", ["none", "write-ahead"])
def test_a_store_session_that_is_never_flushed_stays_bounded(
    tmp_path: Path, durability: str
) -> None:
    with Store.open(tmp_path / "s", durability=durability) as store:  # type: ignore[arg-type]
        session = store.create_session("a")
        appended: list[Event] = []
        for _ in range(12):
            more = two_turns(session)
            appended += more
            store.flush()  # after the session's own request: its callback has run
            assert session.resident_events < TAIL_BOUND + len(more)
        assert session.events() == appended


def test_open_session_keeps_no_event_in_memory(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        appended = two_turns(store.create_session("a"))
        store.flush()
    with Store.open(tmp_path / "s") as store:
        session = store.open_session("a")
        assert session.resident_events == 0
        assert session.events() == appended
        assert session.messages() == derive_messages(appended)
        session.append_fact(appended[0].data)
        assert session.resident_events == 1


def test_forked_and_imported_sessions_keep_no_seeded_event_in_memory(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        appended = two_turns(store.create_session("a"))
        store.flush()
        child = store.fork("a", appended[-1].seq, "child")
        assert child.resident_events == 0  # its session/end-seed commits with the seed
        assert child.events()[:-1] == [
            msgspec.structs.replace(e, seq=i) for i, e in enumerate(appended)
        ]
        buffer = io.BytesIO()
        store.export_jsonl("a", buffer)
        buffer.seek(0)
        copy = store.import_jsonl(buffer, session_id="copy")
        assert copy.resident_events == 0
        assert copy.events() == appended
        assert copy.messages() == derive_messages(appended)


def test_sessions_flushing_after_every_append_from_many_threads_keep_nothing_in_memory(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "s") as store:
        store.register_event_type("plugin")
        sessions = [store.create_session(f"s{i}") for i in range(8)]
        held: list[int] = []
        errors: list[BaseException] = []
        start = threading.Barrier(len(sessions) - 1)

        def produce(session: Session, together: bool) -> None:
            try:
                if together:
                    start.wait(10)
                for n in range(150):
                    session.append("plugin", {"n": n})
                    session.flush(10)
                    held.append(session.resident_events)
            except BaseException as err:  # reported below
                errors.append(err)

        produce(sessions[0], False)  # one thread, flush after flush
        threads = [threading.Thread(target=produce, args=(s, True)) for s in sessions[1:]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert not any(thread.is_alive() for thread in threads)
        assert held == [0] * 150 * len(sessions)
        for session in sessions:
            assert [e.data for e in store.read(session.id)] == [{"n": n} for n in range(150)]
            assert session.events() == store.read(session.id)


def test_acknowledgements_racing_appends_lose_nothing(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s", durability="none") as store:
        store.register_event_type("plugin")
        session = store.create_session("a")
        stop = threading.Event()

        def append(writer: int) -> None:
            for n in range(500):
                session.append("plugin", {"writer": writer, "n": n})

        def flush_often() -> None:
            while not stop.is_set():
                session.flush()

        flusher = threading.Thread(target=flush_often)
        appenders = [threading.Thread(target=append, args=(i,)) for i in range(3)]
        flusher.start()
        for thread in appenders:
            thread.start()
        for thread in appenders:
            thread.join()
        stop.set()
        flusher.join()
        session.flush()
        assert session.resident_events == 0
        events = session.events()
        assert [e.seq for e in events] == list(range(1500))
        assert events == store.read("a")
        for writer in range(3):
            mine = [e.data["n"] for e in events if e.data["writer"] == writer]
            assert mine == list(range(500))


def test_acknowledgements_interleaved_with_appends_and_batches_keep_exactly_the_tail() -> None:
    sink = DurableSink(manual=True)
    session = durable_session(sink, tail_bound=1000)
    appended: list[Event] = []
    marks: list[int] = []
    for n in range(6):
        appended += two_turns(session)
        session.flush_async(lambda error: None)
        marks.append(session.last_seq)
        chunk = AssistantChunk(turn=1, step=1, chunk=TextDelta(text=f"{n}"))
        appended += session.extend([("assistant/chunk", chunk)] * (n + 1))
        if n % 2:
            sink.resolve()  # acknowledges every flush requested so far
            durable = marks[-1]
            held = [e for e in appended if e.seq > durable]
            assert session.resident_events == len(held)
            assert session.events(durable + 1) == held
    assert session.events() == appended


def test_the_default_clock_reads_wall_clock_epoch_milliseconds() -> None:
    sink = MemorySink()
    session = Session(SessionHeader(id="s", key=1, created=START_TIME), sink=sink, codec=CODEC)
    before = time.time_ns() // 1_000_000
    events = two_turns(session)
    after = time.time_ns() // 1_000_000
    times = [e.time for e in events]
    assert before <= times[0] and times[-1] <= after
    assert times == sorted(times)
