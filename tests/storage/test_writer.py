"""The log writer thread on a real LMDB environment: group commit, ordering, map growth,
failure and shutdown semantics."""

from __future__ import annotations

import _thread
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest

from storage.errors import StorageError, StoreClosedError
from storage.lmdb import compaction as compaction_module
from storage.lmdb import waiters as waiters_module
from storage.lmdb import writer as writer_module
from storage.lmdb.compaction import compact
from storage.lmdb.env import LmdbEnv, ResizeLock
from storage.lmdb.layout import Databases, Tail, decode_row, encode_u64, event_key
from storage.lmdb.reads import event_records, scan_journal
from storage.lmdb.waiters import Waiter, resolve
from storage.lmdb.writer import LogWriter
from storage.records import FlushCallback, PendingRecord, SessionHeader

WAIT = 10.0


def header(key: int, session_id: str | None = None) -> SessionHeader:
    return SessionHeader(id=session_id or f"session-{key}", key=key, created=1_700_000_000_000)


def payload(key: int, seq: int, size: int = 0) -> bytes:
    return f'{{"key":{key},"seq":{seq},"pad":"{"x" * size}"}}'.encode()


def stored(env: lmdb.Environment, dbs: Databases) -> dict[bytes, bytes]:
    """Every committed record by its ``events`` key, compacted or still in the journal
    (a journaled record that a compaction round moved to ``events`` is the same bytes)."""
    with env.begin() as txn:
        records = dict(event_records(txn, dbs.events))
        for key, tail in scan_journal(txn, dbs.journal, None).items():
            for seq, value in enumerate(tail.records, tail.first):
                assert records.setdefault(event_key(key, seq), value) == value, "two versions"
    return dict(sorted(records.items()))


class Rig:
    def __init__(self, path: Path, *, map_size: int = 1 << 20, sync_on_flush: bool = False):
        self.store = LmdbEnv(path, readonly=False, map_size=map_size, sync=True)
        self.env = self.store.env
        self.dbs = self.store.dbs
        self.writer = LogWriter(self.store, sync_on_flush=sync_on_flush)

    def close(self) -> None:
        self.writer.close()
        self.store.close()


@pytest.fixture(autouse=True)
def no_idle_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that look at the journal must not race the writer's idle compaction."""
    monkeypatch.setattr(writer_module, "JOURNAL_IDLE_S", 3600.0)


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


def hold_writer(rig: Rig) -> threading.Event:
    """Hold the writer thread in a flush callback until the returned event is set (held
    when this returns): flushes queued meanwhile wait for the next commit."""
    release, entered = threading.Event(), threading.Event()

    def hold(error: BaseException | None) -> None:
        entered.set()
        release.wait(WAIT)

    rig.writer.flush_async(hold)  # callbacks run on the writer thread
    assert entered.wait(WAIT)
    return release


def once() -> Callable[[], bool]:
    """True on the first call only, also when a signal handler's call nests in another."""
    first = threading.Lock()
    return lambda: first.acquire(blocking=False)


def signal_main_until(ran: threading.Event) -> None:
    """Send SIGUSR1 to the main thread until its handler sets ``ran``. One signal is not
    enough: one that arrives after the main thread released the GIL but before its wait
    began does not interrupt the wait, and its handler runs only once the wait is over.
    The handler must therefore act once (``once``) and ignore the repeats (they may also
    interrupt its own wait, which then goes on)."""
    deadline = time.monotonic() + WAIT
    while True:
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
        if ran.wait(0.05):
            return
        assert time.monotonic() < deadline, "the main thread never ran its signal handler"


class Noticed(list[FlushCallback]):
    """A writer's list of queued flush callbacks that calls ``notice(length)`` after each
    append (put in place of the writer's list while the writer is held)."""

    def __init__(self, notice: Callable[[int], None]) -> None:
        super().__init__()
        self._notice = notice

    def append(self, callback: FlushCallback) -> None:
        super().append(callback)
        self._notice(len(self))


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


# --------------------------------------------------------------------------- journal


def journal_size(rig: Rig) -> int:
    """Records in the journal (its frames hold a commit's records each)."""
    with rig.env.begin() as txn:
        return sum(len(t.records) for t in scan_journal(txn, rig.dbs.journal, None).values())


def uncompacted(rig: Rig) -> int:
    """Journaled records that ``events`` does not hold (the journal may also still hold
    copies of compacted ones: a round deletes frames only once it ends)."""
    with rig.env.begin() as txn:
        in_events = {key for key, _ in event_records(txn, rig.dbs.events)}
        tails = scan_journal(txn, rig.dbs.journal, None)
    return sum(
        event_key(key, seq) not in in_events
        for key, tail in tails.items()
        for seq in range(tail.first, tail.first + len(tail.records))
    )


def journal_frames(rig: Rig) -> int:
    with rig.env.begin() as txn:
        return int(txn.stat(rig.dbs.journal)["entries"])


def compacted(rig: Rig) -> dict[bytes, bytes]:
    with rig.env.begin() as txn:
        return dict(event_records(txn, rig.dbs.events))


def read_back(rig: Rig, session_id: str) -> list[bytes]:
    """A session's records through the store's merged view (journal + events)."""
    row = rig.store.row(session_id)
    assert row is not None
    return [value for _, part in rig.store.chunks(row) for value in part]


def test_a_commit_goes_to_the_journal_and_reads_see_it_before_and_after_compaction(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "JOURNAL_MAX_RECORDS", 25)
    rig.writer.track(header(1, "a"), next_seq=0, new=True)
    rig.writer.track(header(2, "b"), next_seq=0, new=True)
    for seq in range(10):
        rig.writer.submit(PendingRecord(1, seq, payload(1, seq)))
        rig.writer.submit(PendingRecord(2, seq, payload(2, seq)))
    rig.writer.flush(WAIT)
    assert journal_size(rig) == 20  # not compacted yet: the commit wrote the journal only
    assert journal_frames(rig) == 1  # one value for the whole commit
    assert compacted(rig) == {}
    assert read_back(rig, "a") == [payload(1, seq) for seq in range(10)]
    assert rig.store.row("b") == (header(2, "b"), 9)

    for seq in range(10, 20):  # 20 in the journal + 10 more reach the threshold
        rig.writer.submit(PendingRecord(1, seq, payload(1, seq)))
    rig.writer.flush(WAIT)
    assert uncompacted(rig) == 0  # a round of one step, with this commit's records
    assert journal_frames(rig) == 1  # only the frame of the round's own commit is left
    assert rig.writer.statistics().compactions == 1
    assert list(compacted(rig)) == [event_key(1, s) for s in range(20)] + [
        event_key(2, s) for s in range(10)
    ]
    with rig.env.begin() as txn:  # the rows now end where the compaction did
        assert decode_row(txn.get(b"a", db=rig.dbs.sessions)).last_seq == 19
    assert read_back(rig, "a") == [payload(1, seq) for seq in range(20)]

    rig.writer.submit(PendingRecord(2, 10, payload(2, 10)))  # a tail after compacted ones
    rig.writer.flush(WAIT)
    assert uncompacted(rig) == 1
    assert read_back(rig, "b") == [payload(2, seq) for seq in range(11)]
    row = rig.store.row("b")
    assert row is not None
    assert [first for first, _ in rig.store.chunks(row, lower=5, upper=10)] == [5]
    assert [v for _, part in rig.store.chunks(row, lower=9) for v in part] == [
        payload(2, 9),
        payload(2, 10),
    ]


def test_an_idle_writer_compacts_its_journal(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    compacting = threading.Event()
    original = compact

    def observed(*args: Any) -> None:
        original(*args)
        compacting.set()

    monkeypatch.setattr(writer_module, "JOURNAL_IDLE_S", 0.01)
    monkeypatch.setattr(writer_module, "compact", observed)
    rig.writer.track(header(1), next_seq=0, new=True)
    rig.writer.submit(PendingRecord(1, 0, payload(1, 0)))
    rig.writer.flush(WAIT)
    assert compacting.wait(WAIT)
    rig.writer.flush(WAIT)  # the compaction's commit is over
    assert journal_size(rig) == 0
    assert compacted(rig) == {event_key(1, 0): payload(1, 0)}


def test_close_compacts_the_journal(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "env")
    rig.writer.track(header(1), next_seq=0, new=True)
    rig.writer.submit(PendingRecord(1, 0, payload(1, 0)))
    rig.writer.flush(WAIT)
    assert journal_size(rig) == 1
    rig.writer.close()
    assert journal_size(rig) == 0
    assert compacted(rig) == {event_key(1, 0): payload(1, 0)}
    rig.store.close()


def test_compaction_grows_a_full_map_without_losing_or_duplicating_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "JOURNAL_MAX_RECORDS", 300)
    rig = Rig(tmp_path / "tiny", map_size=64 << 10)
    try:
        for key in (1, 2, 3):
            rig.writer.track(header(key), next_seq=0, new=True)
        for seq in range(1000):
            for key in (1, 2, 3):
                rig.writer.submit(PendingRecord(key, seq, payload(key, seq, size=200)))
            if seq % 37 == 0:
                rig.writer.flush(WAIT)
        rig.writer.flush(WAIT)
        for key in (1, 2, 3):
            assert read_back(rig, f"session-{key}") == [
                payload(key, seq, size=200) for seq in range(1000)
            ]
        stats = rig.writer.statistics()
    finally:
        rig.close()
    assert stats.resizes >= 1
    assert stats.compactions >= 5
    reopened = LmdbEnv(tmp_path / "tiny", readonly=True, map_size=0, sync=True)
    try:
        with reopened.env.begin() as txn:
            assert txn.stat(reopened.dbs.journal)["entries"] == 0
            assert len(list(event_records(txn, reopened.dbs.events))) == 3000
    finally:
        reopened.close()


def test_a_compaction_under_load_goes_in_steps_and_its_last_deletes_the_frames_it_covers(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "JOURNAL_MAX_RECORDS", 24)
    monkeypatch.setattr(compaction_module, "COMPACT_STEP_RECORDS", 4)
    sessions = 6
    for key in range(1, sessions + 1):
        rig.writer.track(header(key, f"s{key}"), next_seq=0, new=True)
    next_seq = dict.fromkeys(range(1, sessions + 1), 0)

    def commit(keys: range) -> None:  # one record of each of ``keys``, one commit
        for key in keys:
            rig.writer.submit(PendingRecord(key, next_seq[key], payload(key, next_seq[key])))
            next_seq[key] += 1
        rig.writer.flush(WAIT)

    def all_read_back() -> None:
        for key in range(1, sessions + 1):
            assert read_back(rig, f"s{key}") == [payload(key, s) for s in range(next_seq[key])]

    for _ in range(3):  # 18 records in 3 frames
        commit(range(1, sessions + 1))
    compacted_sessions = []  # after each commit of the round
    while rig.writer.statistics().compactions == 0:
        commit(range(1, 3))  # 2 records a commit: the third reaches 24 and starts a round
        done = {key[:8] for key in compacted(rig)}
        if done:
            compacted_sessions.append(len(done))
        all_read_back()  # exact at every step: events, journal copies and tails merged
        assert len(compacted_sessions) < 20, "the round never ended"
    # In steps: each commit compacted a few more sessions (about 4 records' worth), not
    # all of them at once.
    assert len(compacted_sessions) >= 3
    assert compacted_sessions == sorted(compacted_sessions)
    assert compacted_sessions[0] < sessions == compacted_sessions[-1]
    # The last step deleted the frames from before the round; those of the round's own
    # commits stay (their records are in ``events``, or in the tails of sessions 1 and 2
    # if they came after their step).
    with rig.env.begin() as txn:
        first_frame = next(iter(txn.cursor(db=rig.dbs.journal)))[0]
    assert first_frame > encode_u64(4)
    assert set(rig.store.tails) <= {1, 2}
    all_read_back()
    assert stored(rig.env, rig.dbs) == {
        event_key(key, s): payload(key, s)
        for key in range(1, sessions + 1)
        for s in range(next_seq[key])
    }


def run_until_killed(script: str, path: Path) -> None:
    """Run ``script`` on a store at ``path`` in a child that ends by SIGKILLing itself."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run(
        [sys.executable, "-c", script, str(path)], env=env, check=False, timeout=WAIT
    )
    assert child.returncode == -signal.SIGKILL


CRASH_MID_ROUND = """
import os, signal, sys
from storage import Store
from storage.events import MessageTrigger, TurnStart
from storage.lmdb import compaction, writer
writer.JOURNAL_MAX_RECORDS = 12
compaction.COMPACT_STEP_RECORDS = 2
store = Store.open(sys.argv[1])
sessions = [store.create_session(f"s{i}") for i in range(4)]
store.flush()
for session in sessions:  # a commit each: the fourth starts a round of two steps
    facts = [("turn/start", TurnStart(turn=t, trigger=MessageTrigger())) for t in (1, 2, 3)]
    session.extend(facts)
    store.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_store_killed_in_the_middle_of_a_round_reads_and_reopens_exactly(
    tmp_path: Path,
) -> None:
    path = tmp_path / "env"
    run_until_killed(CRASH_MID_ROUND, path)

    reader = LmdbEnv(path, readonly=True, map_size=0, sync=True)
    try:  # the journal still holds records that events holds too: reads merge exactly
        with reader.env.begin() as txn:
            journaled = scan_journal(txn, reader.dbs.journal, None)
            compacted_keys = {k[:8] for k, _ in event_records(txn, reader.dbs.events)}
        assert any(encode_u64(key) in compacted_keys for key in journaled)  # mid-round
        rows = reader.rows()
        assert [row.last_seq for row in rows] == [2] * 4
        records = {row.header.id: [v for _, p in reader.chunks(row) for v in p] for row in rows}
        assert all(len(values) == 3 for values in records.values())
        assert all(b'"turn":3' in values[2] for values in records.values())
    finally:
        reader.close()

    reopened = LmdbEnv(path, readonly=False, map_size=1 << 20, sync=True)
    try:  # compacts what events lacks, nothing twice, and empties the journal
        with reopened.env.begin() as txn:
            assert txn.stat(reopened.dbs.journal)["entries"] == 0
        for row in reopened.rows():
            assert row.last_seq == 2
            assert [v for _, p in reopened.chunks(row) for v in p] == records[row.header.id]
    finally:
        reopened.close()


CRASH_AFTER_FLUSH = """
import os, signal, sys
from storage import Store
from storage.events import MessageTrigger, TurnStart
store = Store.open(sys.argv[1])
session = store.create_session("a")
for turn in range(5):
    session.append("turn/start", TurnStart(turn=turn + 1, trigger=MessageTrigger()))
store.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writable_open_compacts_what_a_crash_left_in_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "env"
    run_until_killed(CRASH_AFTER_FLUSH, path)

    reader = LmdbEnv(path, readonly=True, map_size=0, sync=True)
    try:  # a read-only open scans the journal
        with reader.env.begin() as txn:
            assert (
                sum(len(t.records) for t in scan_journal(txn, reader.dbs.journal, None).values())
                == 5
            )
            assert txn.stat(reader.dbs.events)["entries"] == 0
        row = reader.row("a")
        assert row is not None and row.last_seq == 4
        records = [v for _, part in reader.chunks(row) for v in part]
        assert [v for _, part in reader.chunks(row, lower=2) for v in part] == records[2:]
        assert [r.last_seq for r in reader.rows()] == [4]
    finally:
        reader.close()

    reopened = LmdbEnv(path, readonly=False, map_size=1 << 20, sync=True)
    try:
        with reopened.env.begin() as txn:
            assert txn.stat(reopened.dbs.journal)["entries"] == 0
            compacted_row = decode_row(txn.get(b"a", db=reopened.dbs.sessions))
            assert [v for _, v in event_records(txn, reopened.dbs.events)] == records
        assert compacted_row.last_seq == 4
        writer = LogWriter(reopened, sync_on_flush=False)
        writer.track(compacted_row.header, next_seq=5, new=False)
        writer.submit(PendingRecord(compacted_row.header.key, 5, payload(1, 5)))
        writer.flush(WAIT)
        writer.close()
        row = reopened.row("a")
        assert row is not None and row.last_seq == 5
    finally:
        reopened.close()


# --------------------------------------------------------------------------- waking


def test_blocking_flushers_are_woken_in_a_chain_that_skips_those_who_gave_up() -> None:
    first, quitter, third = Waiter(), Waiter(), Waiter()
    assert not quitter.wait(0)  # gives up before the commit resolves it
    called: list[BaseException | None] = []
    end = resolve([first, quitter, called.append, third], None)
    assert called == [None]  # plain callbacks run at once, on the resolving thread
    assert end is not None
    assert not third.woken  # its turn comes when the first one runs
    outcome: list[bool] = []
    waiting = threading.Thread(target=lambda: outcome.append(third.wait(WAIT)))
    waiting.start()
    assert first.wait(WAIT)  # woken by the commit; wakes the next one still waiting
    waiting.join(WAIT)
    assert outcome == [True]
    assert end.wait(WAIT)  # the last one woke the end of the chain (the writer's)


def test_a_waiter_woken_while_giving_up_passes_the_turn_on() -> None:
    first, second = Waiter(), Waiter()
    error = StorageError("boom")
    end = resolve([first, second], error)
    assert end is not None
    assert first.give_up()  # woken before it gave up: counts as woken, wakes second
    assert second.wait(WAIT)
    assert second.error is error
    assert end.wait(WAIT)


def test_a_blocking_flush_reuses_its_waiter_but_never_one_that_gave_up(rig: Rig) -> None:
    rig.writer.flush(WAIT)
    spare = waiters_module.spare.slot[0]
    assert spare is not None  # woken normally: kept for this thread's next flush
    rig.writer.flush(WAIT)
    assert waiters_module.spare.slot[0] is spare
    release = hold_writer(rig)
    try:
        with pytest.raises(TimeoutError, match="did not complete"):
            rig.writer.flush(timeout=0.01)  # takes the spare, then gives it up
    finally:
        release.set()
    assert spare.gone
    assert waiters_module.spare.slot[0] is None  # the writer may still hold the one given up
    rig.writer.flush(WAIT)
    fresh = waiters_module.spare.slot[0]
    assert fresh is not None and fresh is not spare and not fresh.gone


def test_a_flush_woken_while_giving_up_returns_and_its_waiter_is_not_reused(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.writer.flush(WAIT)
    target = waiters_module.spare.slot[0]
    assert target is not None
    woken = threading.Event()
    release = hold_writer(rig)
    real_wake, real_give_up = waiters_module.wake, Waiter.give_up

    def wake(waiter: Waiter | None) -> None:
        real_wake(waiter)
        if waiter is target:
            woken.set()

    def give_up(self: Waiter) -> bool:
        if self is target:  # timed out: let the writer wake it before it gives up
            release.set()
            assert woken.wait(WAIT)
        return real_give_up(self)

    monkeypatch.setattr(waiters_module, "wake", wake)  # resolve and the waiters call it
    monkeypatch.setattr(writer_module, "wake", wake)  # and so does a flush
    monkeypatch.setattr(Waiter, "give_up", give_up)
    rig.writer.flush(timeout=0.01)  # woken meanwhile: no TimeoutError
    assert target.gone
    assert waiters_module.spare.slot[0] is None  # its _done is released, not held
    rig.writer.flush(WAIT)
    assert waiters_module.spare.slot[0] not in (None, target)


def test_a_flush_interrupted_once_queued_passes_the_turn_on_and_is_not_reused(
    rig: Rig,
) -> None:
    assert threading.current_thread() is threading.main_thread()  # KeyboardInterrupt's
    rig.writer.flush(WAIT)
    interrupted = waiters_module.spare.slot[0]
    queued = [threading.Event(), threading.Event()]
    outcome: list[BaseException | None] = []

    def flush_next() -> None:  # the waiter after the interrupted one in the chain
        try:
            rig.writer.flush(WAIT)
            outcome.append(None)
        except BaseException as err:  # reported below
            outcome.append(err)

    other = threading.Thread(target=flush_next)

    def interrupt() -> None:
        assert queued[0].wait(WAIT)
        other.start()
        assert queued[1].wait(WAIT)
        _thread.interrupt_main()  # raised in the main thread's flush, whatever it runs
        release.set()

    release = hold_writer(rig)
    with rig.writer._lock:  # the writer has drained the list; it waits
        rig.writer._callbacks = Noticed(lambda length: queued[length - 1].set())
    sender = threading.Thread(target=interrupt)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            rig.writer.flush(WAIT)
    finally:
        release.set()
        sender.join(WAIT)
    other.join(WAIT)
    assert outcome == [None]  # woken in turn (by the interrupted flush, or past it)
    assert interrupted is not None and interrupted.gone
    assert waiters_module.spare.slot[0] is None
    rig.writer.flush(WAIT)
    assert waiters_module.spare.slot[0] not in (None, interrupted)


def test_a_flush_in_a_signal_handler_during_a_flush_waits_with_a_waiter_of_its_own(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert threading.current_thread() is threading.main_thread()  # signal handlers run there
    rig.writer.flush(WAIT)
    outer = waiters_module.spare.slot[0]  # the interrupted flush takes it
    queued, woken = threading.Event(), threading.Event()
    spares: list[Waiter | None] = []
    real_wake = waiters_module.wake

    def wake(waiter: Waiter | None) -> None:
        real_wake(waiter)
        if waiter is outer:
            woken.set()

    ran, first = threading.Event(), once()

    def handler(signum: int, frame: object) -> None:
        if not first():
            return  # a repeated signal (see signal_main_until)
        ran.set()
        release.set()
        assert woken.wait(WAIT)  # the handler's flush goes to the next commit (for the
        rig.writer.flush(WAIT)  # same one, see the test after this one)
        spares.append(waiters_module.spare.slot[0])

    def interrupt() -> None:
        assert queued.wait(WAIT)
        signal_main_until(ran)

    monkeypatch.setattr(waiters_module, "wake", wake)  # resolve and the waiters call it
    monkeypatch.setattr(writer_module, "wake", wake)  # and so does a flush
    release = hold_writer(rig)
    with rig.writer._lock:  # the writer has drained the list; it waits
        rig.writer._callbacks = Noticed(lambda length: queued.set())
    previous = signal.signal(signal.SIGUSR1, handler)
    sender = threading.Thread(target=interrupt)
    try:
        sender.start()
        rig.writer.flush(WAIT)  # interrupted once queued: the handler's flush runs inside it
    finally:
        sender.join(WAIT)
        signal.signal(signal.SIGUSR1, previous)
        release.set()
    assert outer is not None and spares == [None]  # the handler's waiter is not kept
    assert waiters_module.spare.slot[0] is outer  # put back by the outer flush


def test_a_flush_in_a_signal_handler_that_shares_the_interrupted_flushs_commit_returns(
    rig: Rig,
) -> None:
    """The handler's flush and the one it interrupted are resolved by one commit, with
    another thread's flush queued after them: none of the three waits for the
    interrupted thread to run again (it cannot before the handler returns)."""
    assert threading.current_thread() is threading.main_thread()  # signal handlers run there
    rig.writer.flush(WAIT)
    outer = waiters_module.spare.slot[0]  # the interrupted flush takes it
    queued = [threading.Event() for _ in range(3)]
    outcome: dict[str, BaseException | None] = {}

    def flush_into(name: str) -> None:
        try:
            rig.writer.flush(WAIT)
            outcome[name] = None
        except BaseException as err:  # reported below
            outcome[name] = err

    ran, first = threading.Event(), once()

    def handler(signum: int, frame: object) -> None:
        if first():  # else a repeated signal (see signal_main_until)
            ran.set()
            flush_into("handler")

    other = threading.Thread(target=flush_into, args=("other",))

    def interrupt() -> None:
        assert queued[0].wait(WAIT)
        signal_main_until(ran)
        assert queued[1].wait(WAIT)
        other.start()
        assert queued[2].wait(WAIT)
        release.set()  # one commit resolves all three

    release = hold_writer(rig)
    with rig.writer._lock:  # the writer has drained the list; it waits
        rig.writer._callbacks = Noticed(lambda length: queued[length - 1].set())
    previous = signal.signal(signal.SIGUSR1, handler)
    sender = threading.Thread(target=interrupt)
    try:
        sender.start()
        flush_into("interrupted")
    finally:
        sender.join(WAIT)
        signal.signal(signal.SIGUSR1, previous)
        release.set()
    other.join(WAIT)
    assert outcome == {"handler": None, "other": None, "interrupted": None}
    assert waiters_module.spare.slot[0] is outer  # put back by the outer flush


def test_many_flushes_from_one_thread_and_from_many_threads_all_return_durable(
    rig: Rig,
) -> None:
    threads, per_thread = 8, 200
    for key in range(threads + 1):
        rig.writer.track(header(key), next_seq=0, new=True)
    for seq in range(per_thread):  # one thread: each flush reuses the last one's waiter
        rig.writer.submit(PendingRecord(0, seq, payload(0, seq)))
        rig.writer.flush(WAIT)
        if seq % 50 == 0:
            assert event_key(0, seq) in stored(rig.env, rig.dbs)
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def produce(key: int) -> None:
        try:
            start.wait(WAIT)
            for seq in range(per_thread):
                rig.writer.submit(PendingRecord(key, seq, payload(key, seq)))
                rig.writer.flush(WAIT)
        except BaseException as err:  # reported below
            errors.append(err)

    producers = [threading.Thread(target=produce, args=(key,)) for key in range(1, threads + 1)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join(WAIT * 6)
    assert errors == []
    assert not any(thread.is_alive() for thread in producers)
    assert stored(rig.env, rig.dbs) == {
        event_key(key, seq): payload(key, seq)
        for key in range(threads + 1)
        for seq in range(per_thread)
    }


def test_a_read_with_a_tail_taken_just_before_a_compaction_reads_the_compacted_records(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a compaction's commit and the writer dropping its in-memory tails, a
    reader may hold a tail that ends before what the transaction shows compacted."""
    monkeypatch.setattr(writer_module, "JOURNAL_MAX_RECORDS", 5)
    rig.writer.track(header(1, "a"), next_seq=0, new=True)
    rig.writer.submit(PendingRecord(1, 0, payload(1, 0)))
    rig.writer.flush(WAIT)
    stale = {1: Tail(1, [payload(1, 1), payload(1, 2)])}
    for seq in range(1, 7):
        rig.writer.submit(PendingRecord(1, seq, payload(1, seq)))
    rig.writer.flush(WAIT)  # one compaction: 0..6 in ``events``
    assert uncompacted(rig) == 0
    rig.store.tails = stale
    row = rig.store.row("a")
    assert row is not None and row.last_seq == 6
    assert read_back(rig, "a") == [payload(1, seq) for seq in range(7)]


@pytest.mark.parametrize(
    ("sessions", "step"),
    [(1, None), (6, 2)],
    ids=["one session, whole rounds", "six sessions, a round of several steps"],
)
def test_in_process_readers_never_see_a_gap_while_the_writer_compacts(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, sessions: int, step: int | None
) -> None:
    monkeypatch.setattr(writer_module, "JOURNAL_MAX_RECORDS", 7 * sessions)
    if step is not None:  # a step of ``step`` records, whatever the commit carries
        monkeypatch.setattr(compaction_module, "COMPACT_STEP_RECORDS", step)
        monkeypatch.setattr(compaction_module, "COMPACT_STEP_FACTOR", 0)
    keys = range(1, sessions + 1)
    for key in keys:
        rig.writer.track(header(key, f"s{key}"), next_seq=0, new=True)
    rig.writer.flush(WAIT)
    done = threading.Event()
    problems: list[BaseException] = []

    def read_until_done() -> None:
        try:
            seen = dict.fromkeys(keys, 0)
            while not done.is_set():
                for key in keys:
                    records = read_back(rig, f"s{key}")
                    assert records == [payload(key, seq) for seq in range(len(records))]
                    assert len(records) >= seen[key], "went backwards"
                    seen[key] = len(records)
        except BaseException as err:
            problems.append(err)

    readers = [threading.Thread(target=read_until_done) for _ in range(2)]
    for reader in readers:
        reader.start()
    rng = random.Random(sessions)
    next_seq = dict.fromkeys(keys, 0)
    try:
        for index in range(400 * sessions):
            key = rng.choice(keys)  # sessions interleave at random within a commit
            rig.writer.submit(PendingRecord(key, next_seq[key], payload(key, next_seq[key])))
            next_seq[key] += 1
            if index % 3 == 0:
                rig.writer.flush(WAIT)
        rig.writer.flush(WAIT)
    finally:
        done.set()
        for reader in readers:
            reader.join(WAIT)
    assert problems == []
    assert rig.writer.statistics().compactions >= 20
    expected = {
        event_key(key, seq): payload(key, seq) for key in keys for seq in range(next_seq[key])
    }
    assert stored(rig.env, rig.dbs) == expected  # events and the journal's copies agree
    for key in keys:
        assert read_back(rig, f"s{key}") == [payload(key, s) for s in range(next_seq[key])]
    # The writer's count of what it has not compacted (what starts a round) is its tails.
    tails = rig.store.tails.values()
    assert rig.writer._journal_records == sum(len(tail.records) for tail in tails)
    assert rig.writer._journal_bytes == sum(len(r) for tail in tails for r in tail.records)


_STEPPED_THEN_DIRECT = r"""
import os, sys
import storage.lmdb.compaction as compaction
import storage.lmdb.writer as writer
from storage import Store

writer.JOURNAL_MAX_BYTES = 2 << 20  # small rounds of small steps, to meet the case soon
compaction.COMPACT_STEP_BYTES = 64 << 10
compaction.COMPACT_STEP_RECORDS = 64
store = Store.open(sys.argv[1], durability="none")
store.register_event_type("probe/blob")
w = store._writer
victim = store.create_session("victim")
fill = [store.create_session(f"f{i}") for i in range(100)]
blob = "y" * 3000
while w._journal_bytes < (2 << 20) - (256 << 10):
    for s in fill[:50]:
        s.append("probe/blob", {"x": blob})
    store.flush()
victim.append("probe/blob", {"x": "a"})
store.flush()
while w._round_end is None:  # a round starts
    for s in fill[:50]:
        s.append("probe/blob", {"x": blob})
    store.flush()
while victim.header.key in store._db.tails and w._round_end is not None:
    fill[-1].append("probe/blob", {"x": "z"})  # commits until the victim is stepped
    store.flush()
assert w._round_end is not None, "the round ended first"
victim.extend([("probe/blob", {"x": "b" * 2000}) for _ in range(20)])  # a run for events
store.flush()
victim.append("probe/blob", {"x": "c"})  # journaled again, its stepped frames still there
store.flush()
print("ready", flush=True)
sys.stdin.readline()  # the parent reads the store meanwhile
os._exit(0)  # a crash: everything above was flushed
"""


def test_a_session_stepped_then_written_straight_to_events_reads_back_and_reopens_after_a_crash(
    tmp_path: Path,
) -> None:
    # Its compacted frames stay in the journal until the round ends; a large run went
    # straight to `events`, then a small record to the journal again: the journal held
    # its records with a gap, and a read-only reader, and the open after a crash, refused
    # the whole store as damaged although every record was there.
    from storage import Store

    path = tmp_path / "store"
    with subprocess.Popen(
        [sys.executable, "-c", _STEPPED_THEN_DIRECT, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "ready"
            with Store.open(path, readonly=True) as reader:
                reader.register_event_type("probe/blob")
                assert [e.seq for e in reader.read("victim")] == list(range(22))
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.wait(60) == 0
        finally:
            child.kill()
    with Store.open(path) as store:
        store.register_event_type("probe/blob")
        assert [e.seq for e in store.read("victim")] == list(range(22))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_blocking_flushers_beyond_the_pipe_gates_all_return_and_hold_no_more_descriptors(
    rig: Rig,
) -> None:
    # A blocking flush waits on a pipe (two descriptors) while fewer than _MAX_GATES
    # are open, on a lock beyond: rounds of 3 x _MAX_GATES threads flushing at once all
    # return, and the process never holds more than the gates' descriptors.
    count = 3 * waiters_module._MAX_GATES
    before = _open_fds()
    for _round in range(2):
        all_waiting = threading.Barrier(count + 1, timeout=WAIT)
        gates_seen: list[int] = []
        errors: list[BaseException] = []

        def flusher() -> None:
            try:
                all_waiting.wait()  # this round's barrier
                rig.writer.flush(WAIT)
                gates_seen.append(waiters_module._gates.open)
            except BaseException as err:  # reported below
                errors.append(err)

        threads = [threading.Thread(target=flusher) for _ in range(count)]
        for thread in threads:
            thread.start()
        all_waiting.wait()
        for thread in threads:
            thread.join(WAIT)
        assert errors == []
        assert not any(thread.is_alive() for thread in threads)
        assert len(gates_seen) == count
        assert max(gates_seen) <= waiters_module._MAX_GATES
        assert _open_fds() <= before + 2 * waiters_module._MAX_GATES
