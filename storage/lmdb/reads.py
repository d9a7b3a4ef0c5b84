"""Reading a store: a session's records from ``events`` and the journal, merged, and
its session rows (see :mod:`storage.lmdb.layout` for where each record is).

In the writing process the journal's records come from :attr:`LmdbEnv.tails`, the
writer's in-memory copy, taken *before* the read transaction (the writer only appends
to a tail, and replaces the dict when it compacts); read-only processes scan the
journal in the transaction itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Final

import lmdb
import msgspec

from storage.errors import LogCorruptError
from storage.lmdb.layout import (
    EVENT_KEY,
    FRAME_DECODER,
    RECORDS_DECODER,
    U64,
    Databases,
    SessionRow,
    Tail,
    Tails,
    block_records,
    decode_row,
    encode_u64,
)

__all__ = ["READ_CHUNK", "Reads", "event_records", "read_events", "scan_journal"]

READ_CHUNK: Final = 4096  # records copied per read transaction, so readers stay short


def read_events(cursor: lmdb.Cursor[bytes], key: int, first: int, end: int) -> list[bytes] | None:
    """The records of seqs ``first .. end - 1`` of session ``key`` in ``events``, or
    ``None`` if one of them is not stored, or values overlap (a damaged store)."""
    start = EVENT_KEY.pack(key, first)
    found = cursor.set_range(start)
    # ``first`` is the first seq of a value, or inside the one before.
    if (not found or cursor.key() != start) and not (cursor.prev() if found else cursor.last()):
        return None
    prefix = start[:8]
    values: list[bytes] = []
    seq = first  # the next one wanted
    for stored, value in cursor.iternext():
        if not stored.startswith(prefix):
            return None
        (at,) = U64.unpack_from(stored, 8)
        records = block_records(value, stored)
        # The first value may start before ``first``; each next one where the last ended
        # (an overlap is damage too).
        if not (at <= seq < at + len(records) if seq == first else at == seq):
            return None
        if at == seq and at + len(records) <= end:
            values += records
        else:
            values += records[seq - at : end - at]
        seq = at + len(records)
        if seq >= end:
            return values
    return None


def event_records(
    txn: lmdb.Transaction[bytes], events: lmdb._Database
) -> Iterator[tuple[bytes, bytes]]:
    """Every record in ``events`` as ``(event_key(session key, seq), record bytes)``, in
    key order (for tools and tests that look at the stored layout)."""
    for stored, value in txn.cursor(db=events):
        session, seq = EVENT_KEY.unpack(stored)
        for offset, record in enumerate(block_records(value, stored)):
            yield EVENT_KEY.pack(session, seq + offset), record


def scan_journal(
    txn: lmdb.Transaction[bytes],
    journal: lmdb._Database | None,
    key: int | None,
    *,
    framed: bool = True,
) -> Tails:
    """The journal's records of session ``key`` (of every session for ``None``);
    ``framed=False`` reads a version 2 journal (one record per value)."""
    if journal is None:
        return {}
    tails: Tails = {}
    values = txn.cursor(db=journal).iternext(keys=False)
    if not framed:
        prefix = encode_u64(key) if key is not None else b""
        unpack = EVENT_KEY.unpack_from
        for value in values:
            if not value.startswith(prefix):
                continue
            if len(value) < EVENT_KEY.size:
                raise LogCorruptError(
                    "a journal record is too short; the store is damaged: restore it"
                )
            session, seq = unpack(value)
            _join(tails, session, seq, [value[EVENT_KEY.size :]])
        return tails
    try:
        for value in values:
            for session, first, records in FRAME_DECODER.decode(value):
                if key is None or session == key:
                    _join(tails, session, first, RECORDS_DECODER.decode(records))
    except msgspec.DecodeError as err:
        raise LogCorruptError(
            f"a journal frame cannot be read ({err}); the store is damaged: restore it"
        ) from err
    return tails


def _join(tails: Tails, session: int, first: int, records: list[bytes]) -> None:
    """Add a run of ``session``'s journaled records, which must continue its tail.

    A run that starts past the tail's end supersedes it: the tail is the stale copy of
    records a compaction round moved to ``events`` (its frames are deleted only when the
    round ends), and the records between went straight to ``events`` (a large run).
    The callers check the tail against the session row's last seq: a real gap is still
    damage."""
    tail = tails.get(session)
    if tail is None:
        tails[session] = Tail(first, records)
    elif first == tail.first + len(tail.records):
        tail.records.extend(records)
    elif first > tail.first + len(tail.records):
        tails[session] = Tail(first, records)
    else:
        raise LogCorruptError(
            f"the journal holds seq {first} of session key {session} after seq "
            f"{tail.first + len(tail.records) - 1}; the store is damaged: restore it"
        )


class Reads:
    """The read side of :class:`storage.lmdb.env.LmdbEnv` (its base class): session rows
    and record chunks, the journal merged."""

    if TYPE_CHECKING:  # set by LmdbEnv
        env: lmdb.Environment
        dbs: Databases
        readonly: bool
        tails: Tails

        @property
        def framed(self) -> bool: ...

        def reading(self) -> AbstractContextManager[lmdb.Transaction[bytes]]: ...

    def row(self, session_id: str) -> SessionRow | None:
        """The session's header and durable last seq (compacted or in the journal)."""
        key = session_id.encode("utf-8", "replace")
        if not key or len(key) > self.env.max_key_size():
            return None
        tails = self.tails  # before the transaction: see the module docstring
        with self.reading() as txn:
            raw = txn.get(key, db=self.dbs.sessions)
            if raw is None:
                return None
            row = decode_row(raw)
            if self.readonly:
                tails = self._journal_tails(txn)
        return _with_tail(row, tails.get(row.header.key))

    def rows(self) -> list[SessionRow]:
        """Every session row, in creation order."""
        tails = self.tails
        with self.reading() as txn:
            ids = [value for _, value in txn.cursor(db=self.dbs.order)]
            raws = [txn.get(sid, db=self.dbs.sessions) for sid in ids]
            if self.readonly:
                tails = self._journal_tails(txn)
        rows = [decode_row(raw) for raw in raws if raw is not None]
        return [_with_tail(row, tails.get(row.header.key)) for row in rows]

    def chunks(
        self, session: SessionRow, lower: int = 0, upper: int | None = None
    ) -> Iterator[tuple[int, list[bytes]]]:
        """The record bytes of ``session`` with ``lower <= seq <= upper`` (and at most its
        row's last seq), as ``(first seq, records)`` chunks in seq order.

        Each chunk is copied out in one short read transaction (records never change
        once written). Raises :class:`LogCorruptError` if a seq is missing.
        """
        first = max(lower, 0)
        last = session.last_seq if upper is None else min(upper, session.last_seq)
        key = session.header.key
        while first <= last:
            count = min(READ_CHUNK, last - first + 1)
            end = first + count
            tail = self.tails.get(key)  # before the transaction: see the module docstring
            with self.reading() as txn:
                compacted = self._compacted_last(txn, session)
                if self.readonly and compacted < end - 1:
                    tail = self._journal_tails(txn).get(key)
                # Seqs first..split - 1 are in ``events``, split..end - 1 in the journal.
                # The split is the transaction's: a tail taken just before a compaction
                # still holds its records, but the writer may have compacted more.
                split = max(first, min(end, compacted + 1))
                values: list[bytes] | None = []
                if split > first:
                    values = read_events(txn.cursor(db=self.dbs.events), key, first, split)
                intact = values is not None
            if values is not None and split < end:
                if tail is not None and tail.first <= split:
                    values += tail.records[split - tail.first : end - tail.first]
                intact = len(values) == count
            if values is None or not intact:
                raise LogCorruptError(
                    f"session {session.header.id!r}: records of seqs {first}..{first + count - 1}"
                    " are not all stored; the log has a gap (restore from a backup or export)"
                )
            yield first, values
            first += count

    # Read-only: the journal's tails of every session as of one snapshot (the id of the
    # transaction that wrote it). A journal is scanned once per snapshot, not once per
    # session read: the journal a killed writer leaves, which no compaction shrinks until
    # the next writable open, made every read of every session scan all of it.
    _journal_snapshot: tuple[int, Tails] | None = None

    def _journal_tails(self, txn: lmdb.Transaction[bytes]) -> Tails:
        """Read-only: every session's journal tail in ``txn``'s snapshot (scanned once per
        snapshot; a snapshot never changes, so its tails are shared as they are)."""
        snapshot = txn.id()
        cached = self._journal_snapshot
        if cached is None or cached[0] != snapshot:
            cached = (snapshot, scan_journal(txn, self.dbs.journal, None, framed=self.framed))
            self._journal_snapshot = cached
        return cached[1]

    def _compacted_last(self, txn: lmdb.Transaction[bytes], session: SessionRow) -> int:
        raw = txn.get(session.header.id.encode("utf-8"), db=self.dbs.sessions)
        return decode_row(raw).last_seq if raw is not None else -1


def _with_tail(row: SessionRow, tail: Tail | None) -> SessionRow:
    """``row`` with the last seq of its records in the journal, if they go further (a
    tail taken just before a compaction may end before the compacted records)."""
    if tail is None or tail.first + len(tail.records) - 1 <= row.last_seq:
        return row
    return row._replace(last_seq=tail.first + len(tail.records) - 1)
