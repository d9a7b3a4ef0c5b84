"""The ``events`` layout: a session's records stored as blocks (see storage.lmdb.layout)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from storage.errors import LogCorruptError, StorageError
from storage.lmdb import layout
from storage.lmdb.env import LmdbEnv
from storage.lmdb.layout import event_key, put_spans
from storage.lmdb.reads import event_records, read_events


def record(key: int, seq: int, size: int = 0) -> bytes:
    return b'{"key":%d,"seq":%d,"pad":"%s"}' % (key, seq, b"x" * size)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[LmdbEnv]:
    opened = LmdbEnv(tmp_path / "env", readonly=False, map_size=1 << 22, sync=False)
    try:
        yield opened
    finally:
        opened.close()


def values(env: LmdbEnv) -> list[tuple[int, int]]:
    """Each stored value as (first seq, record count), in key order."""
    out = []
    with env.env.begin() as txn:
        for key, value in txn.cursor(db=env.dbs.events):
            out.append((int.from_bytes(key[8:], "big"), layout._size(value, key)))
    return out


def read(env: LmdbEnv, key: int, first: int, end: int) -> list[bytes] | None:
    with env.env.begin() as txn:
        return read_events(txn.cursor(db=env.dbs.events), key, first, end)


def every_range_reads_back(env: LmdbEnv, key: int, records: list[bytes]) -> None:
    for first in range(len(records)):
        for end in range(first + 1, len(records) + 1):
            assert read(env, key, first, end) == records[first:end], (first, end)
    assert read(env, key, 0, len(records) + 1) is None  # one past the end is not stored


def test_a_span_is_cut_into_blocks_within_the_record_and_byte_bounds(
    env: LmdbEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "BLOCK_RECORDS", 4)
    monkeypatch.setattr(layout, "BLOCK_BYTES", 200)
    records = [record(1, s) for s in range(10)] + [record(1, 10, size=500)]
    records += [record(1, s, size=60) for s in range(11, 17)]
    with env.env.begin(write=True) as txn:
        assert put_spans(txn, env.dbs.events, [(1, 0, records)]) == {1: 16}
    # 4 + 4 + 2 small ones, the large one alone, then 60-byte pads: 2 fit in 200 bytes
    assert values(env) == [(0, 4), (4, 4), (8, 2), (10, 1), (11, 2), (13, 2), (15, 2)]
    every_range_reads_back(env, 1, records)
    with env.env.begin() as txn:
        stored = list(event_records(txn, env.dbs.events))
    assert stored == [(event_key(1, s), r) for s, r in enumerate(records)]


def test_blocks_of_later_spans_follow_records_stored_one_per_value(env: LmdbEnv) -> None:
    """A version 2 store (one record per value) continued by version 3 (blocks)."""
    records = [record(7, s) for s in range(12)]
    with env.env.begin(write=True) as txn:
        for seq in range(5):
            txn.put(event_key(7, seq), records[seq], db=env.dbs.events)
        put_spans(txn, env.dbs.events, [(7, 5, records[5:9]), (7, 9, records[9:])])
        put_spans(txn, env.dbs.events, [(3, 0, [record(3, 0)]), (9, 0, [record(9, 0)])])
    assert values(env)[:7] == [(0, 1), (0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 4)]
    every_range_reads_back(env, 7, records)
    assert read(env, 3, 0, 1) == [record(3, 0)]
    assert read(env, 9, 0, 1) == [record(9, 0)]


def test_a_gap_or_an_overlap_between_values_reads_as_damage(env: LmdbEnv) -> None:
    records = [record(1, s) for s in range(6)]
    with env.env.begin(write=True) as txn:
        put_spans(txn, env.dbs.events, [(1, 0, records[:3]), (1, 4, records[4:6])])
    assert read(env, 1, 0, 3) == records[:3]
    assert read(env, 1, 4, 6) == records[4:6]
    assert read(env, 1, 2, 5) is None  # seq 3 is missing
    assert read(env, 1, 3, 4) is None
    assert read(env, 2, 0, 1) is None  # another session's values are not its own
    with env.env.begin(write=True) as txn:  # seqs 2..3 again: overlaps the block 0..2
        txn.put(event_key(1, 2), msgspec.msgpack.encode(records[2:4]), db=env.dbs.events)
    assert read(env, 1, 0, 3) == records[:3]  # the overlap is beyond this read
    assert read(env, 1, 0, 6) is None
    assert read(env, 1, 1, 4) is None


def test_a_span_over_stored_records_is_refused(env: LmdbEnv) -> None:
    records = [record(1, s) for s in range(10)]
    with env.env.begin(write=True) as txn:
        put_spans(txn, env.dbs.events, [(1, 0, records[:6]), (2, 0, [record(2, 0)])])
    for first in (0, 3, 5):  # at a block's key, inside a block, at its last seq
        with (
            pytest.raises(StorageError, match=f"session key 1 from seq {first} on"),
            env.env.begin(write=True) as txn,
        ):
            put_spans(txn, env.dbs.events, [(1, first, records[first:])])
    with env.env.begin(write=True) as txn:  # stored records after the span's first seq
        put_spans(txn, env.dbs.events, [(3, 4, [record(3, 4)])])
    with (
        pytest.raises(StorageError, match="session key 3 from seq 2 on"),
        env.env.begin(write=True) as txn,
    ):
        put_spans(txn, env.dbs.events, [(3, 2, [record(3, 2)])])
    with env.env.begin(write=True) as txn:  # the last value stored, a block of 9's 0..4
        put_spans(txn, env.dbs.events, [(9, 0, [record(9, s) for s in range(5)])])
    with (
        pytest.raises(StorageError, match="session key 9 from seq 2 on"),
        env.env.begin(write=True) as txn,  # past the last key, inside its block
    ):
        put_spans(txn, env.dbs.events, [(9, 2, [record(9, 2)])])
    assert values(env) == [(0, 6), (0, 1), (4, 1), (0, 5)]  # nothing was written
    with env.env.begin(write=True) as txn:  # the next seq is fine
        assert put_spans(txn, env.dbs.events, [(1, 6, records[6:])]) == {1: 9}
    every_range_reads_back(env, 1, records)


def test_an_empty_span_writes_nothing(env: LmdbEnv) -> None:
    with env.env.begin(write=True) as txn:
        put_spans(txn, env.dbs.events, [(1, 0, [])])
    assert values(env) == []


def test_an_unreadable_block_is_reported_with_its_session_key_and_first_seq(
    env: LmdbEnv,
) -> None:
    with env.env.begin(write=True) as txn:
        txn.put(event_key(4, 10), b"\xdd\x00\x00\x00\x09 torn", db=env.dbs.events)
    with pytest.raises(LogCorruptError, match="session key 4 from seq 10"):
        read(env, 4, 10, 11)
    with (
        pytest.raises(LogCorruptError, match="events block of session key 4 from seq 10"),
        env.env.begin(write=True) as txn,
    ):
        put_spans(txn, env.dbs.events, [(4, 11, [record(4, 11)])])
