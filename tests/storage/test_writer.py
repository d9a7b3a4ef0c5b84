"""The log writer thread on a real LMDB environment: group commit, ordering, map growth,
failure and shutdown semantics."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from storage.errors import StorageError, StoreClosedError
from storage.lmdb_env import Databases, LmdbEnv, ResizeLock, decode_row, event_key
from storage.session import PendingRecord, SessionHeader
from storage.writer import LogWriter

WAIT = 10.0


def header(key: int, session_id: str | None = None) -> SessionHeader:
    return SessionHeader(id=session_id or f"session-{key}", key=key, created=1_700_000_000_000)


def payload(key: int, seq: int, size: int = 0) -> bytes:
    return f'{{"key":{key},"seq":{seq},"pad":"{"x" * size}"}}'.encode()


def stored(env: lmdb.Environment, dbs: Databases) -> dict[bytes, bytes]:
    with env.begin(db=dbs.events) as txn:
        return dict(txn.cursor())


class Rig:
    def __init__(self, path: Path, *, map_size: int = 1 << 20, sync_on_flush: bool = False):
        self.store = LmdbEnv(path, readonly=False, map_size=map_size, sync=True)
        self.env = self.store.env
        self.dbs = self.store.dbs
        self.writer = LogWriter(self.store, sync_on_flush=sync_on_flush)

    def close(self) -> None:
        self.writer.close()
        self.store.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path / "env")
    yield made
    made.close()


def test_a_flush_returns_once_every_earlier_record_of_every_session_is_committed(
    rig: Rig,
) -> None:
    for key in (1, 2, 3):
        rig.writer.track(header(key), next_seq=0, new=True)
    for seq in range(50):
        for key in (1, 2, 3):
            rig.writer.submit(PendingRecord(key, seq, payload(key, seq)))
    rig.writer.flush(WAIT)

    records = stored(rig.env, rig.dbs)
    assert len(records) == 150
    assert records[event_key(2, 49)] == payload(2, 49)
    with rig.env.begin() as txn:
        row = decode_row(txn.get(b"session-3", db=rig.dbs.sessions))
        order = dict(txn.cursor(db=rig.dbs.order))
    assert row.header == header(3)
    assert row.last_seq == 49
    assert sorted(order.values()) == [b"session-1", b"session-2", b"session-3"]


def test_a_new_header_is_written_even_with_no_records(rig: Rig) -> None:
    rig.writer.track(header(7, "lonely"), next_seq=0, new=True)
    rig.writer.flush(WAIT)
    with rig.env.begin() as txn:
        row = decode_row(txn.get(b"lonely", db=rig.dbs.sessions))
    assert row.last_seq == -1
    assert row.header.key == 7


def test_a_record_out_of_seq_order_is_refused_and_nothing_is_queued(rig: Rig) -> None:
    rig.writer.track(header(1), next_seq=0, new=True)
    rig.writer.submit(PendingRecord(1, 0, payload(1, 0)))
    with pytest.raises(StorageError, match="expects seq 1"):
        rig.writer.submit(PendingRecord(1, 2, payload(1, 2)))
    with pytest.raises(StorageError, match="expects seq 1"):
        rig.writer.submit(PendingRecord(1, 0, payload(1, 0)))
    rig.writer.submit(PendingRecord(1, 1, payload(1, 1)))
    rig.writer.flush(WAIT)
    assert sorted(stored(rig.env, rig.dbs)) == [event_key(1, 0), event_key(1, 1)]


def test_a_record_of_an_untracked_session_is_refused(rig: Rig) -> None:
    with pytest.raises(StorageError, match="unknown session key 9"):
        rig.writer.submit(PendingRecord(9, 0, b"{}"))


def test_a_reopened_session_continues_after_its_durable_last_seq(rig: Rig) -> None:
    rig.writer.track(header(1), next_seq=5, new=False)
    with pytest.raises(StorageError, match="expects seq 5"):
        rig.writer.submit(PendingRecord(1, 0, b"{}"))
    rig.writer.submit(PendingRecord(1, 5, payload(1, 5)))
    rig.writer.flush(WAIT)
    assert list(stored(rig.env, rig.dbs)) == [event_key(1, 5)]


def test_a_full_map_is_grown_and_the_same_batch_retried_without_loss_or_duplicates(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "tiny", map_size=64 << 10)
    try:
        rig.writer.track(header(1), next_seq=0, new=True)
        for seq in range(3000):
            rig.writer.submit(PendingRecord(1, seq, payload(1, seq, size=200)))
            if seq % 1000 == 999:
                rig.writer.flush(WAIT)
        rig.writer.flush(WAIT)
        records = stored(rig.env, rig.dbs)
        stats = rig.writer.statistics()
    finally:
        rig.close()
    assert list(records) == [event_key(1, seq) for seq in range(3000)]
    assert all(records[event_key(1, s)] == payload(1, s, size=200) for s in range(3000))
    assert stats.resizes >= 1
    assert stats.events_written == 3000


def test_a_failing_writer_fails_the_pending_flush_and_every_later_call(tmp_path: Path) -> None:
    LmdbEnv(tmp_path / "env", readonly=False, map_size=1 << 20, sync=True).close()
    # A real LMDB failure: the environment refuses write transactions.
    store = LmdbEnv(tmp_path / "env", readonly=True, map_size=1 << 20, sync=True)
    writer = LogWriter(store, sync_on_flush=False)
    try:
        writer.track(header(1), next_seq=0, new=True)
        writer.submit(PendingRecord(1, 0, b"{}"))
        with pytest.raises(StorageError, match="could not commit") as failed:
            writer.flush(WAIT)
        assert isinstance(failed.value.__cause__, lmdb.Error)
        assert writer.failure is not None
        with pytest.raises(StorageError, match="failed earlier"):
            writer.submit(PendingRecord(1, 1, b"{}"))
        with pytest.raises(StorageError, match="failed earlier"):
            writer.flush(WAIT)
        outcome: list[BaseException | None] = []
        writer.flush_async(outcome.append)
        assert isinstance(outcome[0], StorageError)
    finally:
        writer.close()
        store.close()


def test_a_failing_flush_callback_is_contained_and_the_writer_keeps_going(rig: Rig) -> None:
    def explode(error: BaseException | None) -> None:
        raise RuntimeError("listener bug")

    rig.writer.track(header(1), next_seq=0, new=True)
    rig.writer.flush_async(explode)
    rig.writer.submit(PendingRecord(1, 0, b"{}"))
    rig.writer.flush(WAIT)
    assert rig.writer.failure is None
    assert len(stored(rig.env, rig.dbs)) == 1


def test_a_flush_that_cannot_complete_in_time_raises_timeout_error(rig: Rig) -> None:
    release = threading.Event()
    entered = threading.Event()

    def hold_the_writer(error: BaseException | None) -> None:
        entered.set()
        release.wait(WAIT)

    rig.writer.flush_async(hold_the_writer)  # callbacks run on the writer thread
    assert entered.wait(WAIT)
    try:
        with pytest.raises(TimeoutError, match="did not complete"):
            rig.writer.flush(timeout=0.01)
    finally:
        release.set()
    rig.writer.flush(WAIT)


def test_a_flush_from_a_flush_callback_is_refused_instead_of_deadlocking(rig: Rig) -> None:
    done = threading.Event()
    errors: list[BaseException] = []

    def flush_again(error: BaseException | None) -> None:
        try:
            rig.writer.flush(WAIT)
        except StorageError as err:
            errors.append(err)
        done.set()

    rig.writer.flush_async(flush_again)
    assert done.wait(WAIT)
    assert "flush callback" in str(errors[0])
    rig.writer.flush(WAIT)


def test_close_commits_what_was_queued_then_refuses_new_work(rig: Rig) -> None:
    rig.writer.track(header(1), next_seq=0, new=True)
    outcome: list[BaseException | None] = []
    for seq in range(10):
        rig.writer.submit(PendingRecord(1, seq, payload(1, seq)))
    rig.writer.flush_async(outcome.append)
    rig.writer.close()
    assert outcome == [None]
    assert len(stored(rig.env, rig.dbs)) == 10
    with pytest.raises(StoreClosedError):
        rig.writer.submit(PendingRecord(1, 10, b"{}"))
    with pytest.raises(StoreClosedError):
        rig.writer.flush(WAIT)
    rig.writer.close()  # idempotent


def test_a_durability_none_writer_still_makes_a_flush_durable(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "nosync", sync_on_flush=True)
    try:
        rig.writer.track(header(1), next_seq=0, new=True)
        rig.writer.submit(PendingRecord(1, 0, b"{}"))
        rig.writer.flush(WAIT)  # commits, then env.sync(True)
        assert len(stored(rig.env, rig.dbs)) == 1
    finally:
        rig.close()


def test_a_resize_waits_for_readers_in_progress_and_blocks_new_ones() -> None:
    lock = ResizeLock()
    reader_in = threading.Event()
    reader_may_leave = threading.Event()
    resized = threading.Event()
    order: list[str] = []

    def reader() -> None:
        with lock.reading():
            reader_in.set()
            reader_may_leave.wait(WAIT)
            order.append("reader done")

    def resizer() -> None:
        with lock.resizing():
            order.append("resized")
        resized.set()

    first = threading.Thread(target=reader)
    first.start()
    assert reader_in.wait(WAIT)
    second = threading.Thread(target=resizer)
    second.start()
    assert not resized.is_set()
    reader_may_leave.set()
    assert resized.wait(WAIT)
    first.join(WAIT)
    second.join(WAIT)
    assert order == ["reader done", "resized"]
