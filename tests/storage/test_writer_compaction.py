"""The log writer's journal and its compaction into ``events``: rounds of steps under
load, idle and close compactions, reads while it compacts, crashes in a round."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from storage.lmdb import compaction as compaction_module
from storage.lmdb import writer as writer_module
from storage.lmdb.compaction import compact
from storage.lmdb.env import LmdbEnv
from storage.lmdb.layout import Tail, decode_row, encode_u64, event_key
from storage.lmdb.reads import event_records, scan_journal
from storage.lmdb.writer import LogWriter
from storage.records import PendingRecord
from tests.storage.writer_rig import (
    WAIT,
    Rig,
    compacted,
    header,
    journal_frames,
    journal_size,
    no_idle_compaction,
    payload,
    read_back,
    rig,
    run_until_killed,
    stored,
    uncompacted,
)

__all__ = ["no_idle_compaction", "rig"]  # fixtures used by name


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
