"""The log writer thread on a real LMDB environment: group commit, ordering, map growth,
failure and shutdown semantics."""

from __future__ import annotations

import threading
from pathlib import Path

import lmdb
import pytest

from storage.errors import StorageError, StoreClosedError
from storage.lmdb.env import LmdbEnv, ResizeLock
from storage.lmdb.layout import decode_row, event_key
from storage.lmdb.writer import LogWriter
from storage.records import PendingRecord
from tests.storage.writer_rig import (
    WAIT,
    Rig,
    header,
    hold_writer,
    no_idle_compaction,
    payload,
    read_back,
    rig,
    stored,
)

__all__ = ["no_idle_compaction", "rig"]  # fixtures used by name


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
    row = rig.store.row("session-3")
    with rig.env.begin() as txn:
        order = dict(txn.cursor(db=rig.dbs.order))
    assert row is not None
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


GROWTH_WAIT = 60.0  # a hang guard only (a growth takes milliseconds), under the 120 s test timeout


def read_in_threads(rig: Rig, threads: int, done: threading.Event) -> list[threading.Thread]:
    """``threads`` readers, each in a loop of short read transactions until ``done``;
    returns once each has read. Their failures go to the thread's exception hook."""
    started = threading.Barrier(threads + 1)

    def read_until_done() -> None:
        started.wait(WAIT)
        while not done.is_set():
            with rig.store.reading() as txn:
                txn.get(b"session-1", db=rig.dbs.sessions)

    readers = [threading.Thread(target=read_until_done) for _ in range(threads)]
    for reader in readers:
        reader.start()
    started.wait(WAIT)
    return readers


def test_a_full_map_grows_while_reader_threads_keep_reading(tmp_path: Path) -> None:
    """py-lmdb 3.0 aborts a write transaction only at an instant when no other thread of
    the process is inside (or returning from) an LMDB call: three reader threads held
    the abort of the transaction that filled the map, and so the growth, for minutes."""
    rig = Rig(tmp_path / "tiny", map_size=64 << 10)
    done = threading.Event()
    readers: list[threading.Thread] = []
    try:
        rig.writer.track(header(1), next_seq=0, new=True)
        rig.writer.flush(WAIT)
        readers = read_in_threads(rig, 3, done)
        for seq in range(3000):
            rig.writer.submit(PendingRecord(1, seq, payload(1, seq, size=200)))
        rig.writer.flush(GROWTH_WAIT)
        assert all(reader.is_alive() for reader in readers)  # they read all along
        stats = rig.writer.statistics()
        assert read_back(rig, "session-1") == [payload(1, s, size=200) for s in range(3000)]
    finally:
        done.set()
        for reader in readers:
            reader.join(WAIT)
        rig.close()
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
    release = hold_writer(rig)
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
    with pytest.raises(StoreClosedError, match=r"is closed(:|;) open it again"):
        rig.writer.submit(PendingRecord(1, 10, b"{}"))
    with pytest.raises(StoreClosedError, match=r"is closed(:|;) open it again"):
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


# --------------------------------------------------------------------------- journal
