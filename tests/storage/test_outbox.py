"""Sessions hand their records to the log writer through outboxes (``storage.session.Outbox``):
an append puts its record in the session's list, the writer takes the lists' fronts when
it commits. These tests pin what that hand-over promises on a real LMDB store: every
append that returns is written, one that raises leaves nothing, and the writer takes
records nobody flushes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from storage import Codec, EventTypes, Session, StorageError, Store, StoreClosedError
from storage.events import Completed, MessageTrigger, TurnEnd, TurnStart
from storage.lmdb import writer as writer_module
from storage.lmdb.env import LmdbEnv
from storage.lmdb.writer import LogWriter
from storage.records import SessionHeader

WAIT = 10.0


def _fact(n: int) -> tuple[str, TurnStart]:
    return ("turn/start", TurnStart(turn=n + 1, trigger=MessageTrigger()))


def _tracked_session(writer: LogWriter, key: int, session_id: str, *, new: bool = True) -> Session:
    """A session appending through ``writer`` (as a store's would), tracked from seq 0."""
    header = SessionHeader(id=session_id, key=key, created=1_700_000_000_000)
    writer.track(header, next_seq=0, new=new)
    return Session(header, sink=writer, codec=Codec(EventTypes.default()))


def test_records_nobody_flushes_are_written_by_the_writer_on_its_own(tmp_path: Path) -> None:
    env = LmdbEnv(tmp_path / "env", readonly=False, map_size=1 << 20, sync=True)
    writer = LogWriter(env, sync_on_flush=True)  # as durability "none"
    committed = threading.Event()
    commit = writer._commit

    def observed(*args: object, **kwargs: object) -> None:
        commit(*args, **kwargs)  # type: ignore[arg-type]
        if writer.statistics().events_written == 3:
            committed.set()

    writer._commit = observed  # type: ignore[method-assign]
    try:
        session = _tracked_session(writer, 1, "quiet")
        for n in range(3):
            session.append(*_fact(n))
        assert committed.wait(WAIT), "the writer did not take the records without a flush"
    finally:
        writer.close()
        env.close()
    with Store.open(tmp_path / "env", readonly=True) as store:
        assert [e.seq for e in store.read("quiet")] == [0, 1, 2]


@pytest.mark.parametrize("round_", range(12))
def test_a_close_racing_appends_keeps_exactly_the_appends_that_returned(
    tmp_path: Path, round_: int
) -> None:
    """Appends (single and batched, with a flush now and then) from several threads race
    the store's close: each one either returns and is on disk afterwards, or raises
    StoreClosedError and left nothing, never a gap."""
    path = tmp_path / "store"
    threads = 4
    store = Store.open(path)
    sessions = [store.create_session(f"s{i}") for i in range(threads)]
    store.flush()
    accepted = [0] * threads
    errors: list[BaseException] = []
    started = threading.Barrier(threads + 1)
    going = [threading.Event() for _ in range(threads)]

    def produce(index: int) -> None:
        session = sessions[index]
        started.wait(WAIT)
        n = 0
        try:
            while True:
                if n % 3 == 2:  # a batch now and then: all or nothing too
                    session.extend([_fact(n), _fact(n + 1)])
                    n += 2
                else:
                    session.append(*_fact(n))
                    n += 1
                accepted[index] = n
                if n >= 50 + 7 * round_:
                    going[index].set()
                if n % 16 < 2:  # as an agent does, and it paces the threads
                    session.flush()
        except StoreClosedError:
            pass
        except BaseException as err:  # reported below
            errors.append(err)
        finally:
            going[index].set()

    workers = [threading.Thread(target=produce, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    started.wait(WAIT)
    for event in going:
        assert event.wait(WAIT)
    store.close()
    for worker in workers:
        worker.join(WAIT)
    assert not errors, errors
    with Store.open(path, readonly=True) as reopened:
        for index, session in enumerate(sessions):
            assert session.last_seq == accepted[index] - 1
            stored = reopened.read(f"s{index}")
            assert [e.seq for e in stored] == list(range(accepted[index]))
            assert [e.data.turn for e in stored] == [n + 1 for n in range(accepted[index])]


def test_a_failed_writer_refuses_every_later_append_and_keeps_none_of_them(
    tmp_path: Path,
) -> None:
    LmdbEnv(tmp_path / "env", readonly=False, map_size=1 << 20, sync=True).close()
    # A real LMDB failure: the environment refuses write transactions.
    env = LmdbEnv(tmp_path / "env", readonly=True, map_size=1 << 20, sync=True)
    writer = LogWriter(env, sync_on_flush=False)
    try:
        # Not new: no header to write, the writer stays idle.
        first, second = (_tracked_session(writer, i, f"s{i}", new=False) for i in (1, 2))
        first.append(*_fact(0))  # the writer takes it at once, or with the flush: it fails
        with pytest.raises(StorageError, match=r"could not commit|failed earlier"):
            first.flush()
        assert writer.failure is not None
        assert isinstance(writer.failure.__cause__, lmdb.Error)
        for session in (first, first, second):
            with pytest.raises(StorageError, match="failed earlier"):
                session.append(*_fact(1))
            with pytest.raises(StorageError, match="failed earlier"):
                session.extend([_fact(1), _fact(2)])
        assert (first.last_seq, second.last_seq) == (0, -1)
        assert [e.seq for e in first.events()] == [0]
        assert second.events() == []
    finally:
        writer.close()
        env.close()


def test_an_outbox_of_a_reopened_session_refuses_records_even_while_it_holds_some(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale session object's records never interleave with the reopened one's: what
    it appended before the reopen is written first, anything later is refused."""
    monkeypatch.setattr(writer_module, "JOURNAL_IDLE_S", 3600.0)
    with Store.open(tmp_path / "store") as store:
        stale = store.create_session("a")
        stale.append(*_fact(0))
        fresh = store.open_session("a")  # flushes first: seq 0 is durable
        fresh.append(*_fact(1))
        for attempt in (stale.append, lambda *fact: stale.extend([fact])):
            with pytest.raises(StorageError, match="out of order"):
                attempt(*_fact(1))
        fresh.append("turn/end", TurnEnd(turn=2, reason=Completed()))
        store.flush()
        assert [e.seq for e in store.read("a")] == [0, 1, 2]
        assert store.read("a") == fresh.events()
        assert stale.last_seq == 0


def _writer_and_session(tmp_path: Path) -> tuple[LmdbEnv, LogWriter, Session]:
    env = LmdbEnv(tmp_path / "env", readonly=False, map_size=1 << 20, sync=True)
    writer = LogWriter(env, sync_on_flush=False)
    return env, writer, _tracked_session(writer, 1, "s")


def _stored_seqs(path: Path) -> list[int]:
    with Store.open(path, readonly=True) as store:
        return [e.seq for e in store.read("s")]


class _AppendWhileTaken(list[bytes]):
    """An outbox list on which the session appends once more right after the writer
    copied the records it takes and before it removes them: the window in which a real
    append lands once in a while (an append does not take the writer's lock)."""

    late: Callable[[], object] | None = None

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        taken = super().__getitem__(index)
        late, self.late = self.late, None
        if isinstance(index, slice) and late is not None:
            late()
        return taken


def test_a_record_appended_while_the_writer_takes_the_others_is_written_by_the_next_commit(
    tmp_path: Path,
) -> None:
    env, writer, session = _writer_and_session(tmp_path)
    try:
        outbox = session._outbox
        assert outbox is not None
        records = outbox.records = _AppendWhileTaken()
        # Set before the first append: the writer may take seq 0 as soon as it is there.
        records.late = lambda: session.append(*_fact(1))
        session.append(*_fact(0))
        writer.flush(WAIT)  # takes seq 0; seq 1 comes in meanwhile: the outbox stays pending
        assert session.last_seq == 1
        writer.flush(WAIT)
    finally:
        writer.close()
        env.close()
    assert _stored_seqs(tmp_path / "env") == [0, 1]


def test_an_append_the_closing_writer_has_not_taken_is_refused_and_not_written(
    tmp_path: Path,
) -> None:
    env, writer, session = _writer_and_session(tmp_path)
    parked, release, stopped = threading.Event(), threading.Event(), threading.Event()
    route, stop = writer._route, writer._stop_outboxes

    def park(runs):  # type: ignore[no-untyped-def]
        if not parked.is_set():  # the first batch: park outside the lock, records taken
            parked.set()
            assert release.wait(WAIT)
        return route(runs)

    def stop_and_tell() -> None:
        stop()
        stopped.set()

    writer._route = park  # type: ignore[method-assign]
    writer._stop_outboxes = stop_and_tell  # type: ignore[method-assign]
    closer = threading.Thread(target=writer.close)
    try:
        session.append(*_fact(0))
        assert parked.wait(WAIT)  # seq 0 is taken, not committed yet
        session.append(*_fact(1))  # announced: pending, and accepted
        closer.start()
        assert stopped.wait(WAIT)  # closing: the last batch will take seq 1
        with pytest.raises(StoreClosedError, match=r"is closed(:|;) open it again"):
            session.append(*_fact(2))
        with pytest.raises(StoreClosedError, match=r"is closed(:|;) open it again"):
            session.extend([_fact(2), _fact(3)])
    finally:
        release.set()
        if closer.is_alive() or not stopped.is_set():
            closer.join(WAIT)
        writer.close()
        env.close()
    assert session.last_seq == 1
    assert _stored_seqs(tmp_path / "env") == [0, 1]
