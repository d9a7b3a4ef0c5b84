"""The LMDB side of a store: on-disk layout, opening, and short read transactions.

One environment directory (``subdir=True``) holds five named databases:

- ``events``: key = 8-byte big-endian session key + 8-byte big-endian seq, so a
  session's records sort by seq; value = a *block*: the msgpack array of the
  codec-encoded bytes of records ``seq``, ``seq + 1``, ... (at most
  :data:`BLOCK_RECORDS` records and, beyond its first, :data:`BLOCK_BYTES` bytes). A
  value that starts with an ASCII byte is one record (versions 1 and 2 stored one
  record per value; such values stay readable): a record is JSON text, and a msgpack
  array never starts with an ASCII byte. A session's values cover its seqs without a
  gap or an overlap.
- ``journal``: key = 8-byte big-endian counter, one per group commit; value = a
  *frame*: the commit's runs of records, as the msgpack array of ``[session key,
  first seq, [record bytes, ...]]`` runs, in commit order (a session may have several
  runs in one frame, in seq order). A frame is deleted once all of its records are
  *compacted* into ``events``.
- ``sessions``: key = session id (UTF-8); value = 8-byte signed big-endian last
  compacted seq (``-1``: none) + the :class:`~storage.session.SessionHeader` as JSON.
- ``session-order``: key = 8-byte big-endian session key; value = session id: the
  creation order.
- ``meta``: ``schema_version`` (ASCII decimal) and ``next_session_key`` (8 bytes).

Why a journal: a group commit carries one record each of many sessions. Written
session-major, each record dirties its own ``events`` leaf page (plus its session
row), and a commit costs a page write per session. Appended to the journal, the same
records share a page or two, written as one value: the writer packs a commit's
records in one C call instead of a key and an LMDB put per record. The writer compacts
the journal into ``events`` (and the session rows) once it is large, a few sessions
per commit, or whole when idle (see :mod:`storage.writer`): a session's many records
then share pages and one block (one LMDB put, not one per record). A large run of one
session that has nothing in the journal (a bulk append, a ``Session.extend``) skips
the journal: it goes straight to ``events`` with its session row. A session's records
are therefore seqs ``0..k`` in ``events`` (``k`` = its row's last seq) and ``k + 1..m``
in the journal. The journal may also still hold some of seqs ``0..k`` (a compaction
round moves a session's records to ``events`` before it deletes the frames that hold
them): such a record is a copy of the one in ``events``, and readers take seqs up to
``k`` from ``events`` only. A session's journaled records are contiguous. Readers merge
the two:

- in the writing process, from :attr:`LmdbEnv.tails`, an in-memory copy of the
  journal that the writer updates after each commit (before acknowledging it);
- in read-only processes, by scanning the journal (bounded by compaction).

A writable open compacts what a crash left in the journal before anything reads.

The writer (:mod:`storage.writer`) and the store's readers share this module so that
they agree on the layout in one place. Read transactions take a :class:`ResizeLock`
shared, because growing the map invalidates every transaction of the process.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from operator import itemgetter
from pathlib import Path
from typing import Final, NamedTuple

import lmdb
import msgspec

from storage.errors import LogCorruptError, SchemaVersionError, StorageError, StoreClosedError
from storage.session import SessionHeader

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_RECORDS",
    "SCHEMA_VERSION",
    "Databases",
    "LmdbEnv",
    "ResizeLock",
    "SessionRow",
    "Span",
    "Tail",
    "compact",
    "decode_row",
    "encode_frame",
    "encode_row",
    "encode_u64",
    "event_key",
    "event_records",
    "put_spans",
    "trim_journal",
]

SCHEMA_VERSION: Final = 4
# Older versions this one opens: version 1 has no journal; version 2 journals one
# record per value (8-byte session key + 8-byte seq + the record bytes). Both store one
# record per ``events`` value, which later versions read as it is (see above). Version
# 3 is version 4 without compaction rounds: its journal never holds a compacted
# record (version 4's may; an older release would refuse to recover it, hence the new
# version). A writable open compacts what an old journal holds and stamps the current
# version in one transaction; a read-only open reads the store as it is.
_OLDER: Final = (b"1", b"2", b"3")
_PER_RECORD: Final = b"2"

EVENTS_DB: Final = b"events"
JOURNAL_DB: Final = b"journal"
SESSIONS_DB: Final = b"sessions"
ORDER_DB: Final = b"session-order"
META_DB: Final = b"meta"
SCHEMA_VERSION_KEY: Final = b"schema_version"
NEXT_KEY_KEY: Final = b"next_session_key"

MIN_MAP_SIZE: Final = 64 << 10  # room for the databases themselves; the map grows anyway
_READ_CHUNK: Final = 4096  # records copied per read transaction, so readers stay short
# A block's bounds: a read of one record decodes its whole block (a copy of its bytes).
BLOCK_RECORDS: Final = 512
BLOCK_BYTES: Final = 256 << 10
_EVENT_KEY: Final = struct.Struct(">QQ")
_U64: Final = struct.Struct(">Q")
_ROW_PREFIX: Final = struct.Struct(">q")
_SESSION: Final = itemgetter(0)
_header_decoder: Final = msgspec.json.Decoder(SessionHeader)
_frame_encoder: Final = msgspec.msgpack.Encoder()
# A frame's runs, each session's records left undecoded until a reader wants them.
_frame_decoder: Final = msgspec.msgpack.Decoder(list[tuple[int, int, msgspec.Raw]])
_records_decoder: Final = msgspec.msgpack.Decoder(list[bytes])
_block_size_decoder: Final = msgspec.msgpack.Decoder(list[msgspec.Raw])
# LMDB's errors for pages that are not what they should be (a damaged file); a read
# transaction that met one may answer its next call with MDB_BAD_TXN (seen in the bit
# flip soak: a flipped page of the creation-order index or of meta).
_DAMAGE: Final = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.BadTxnError,
)


def event_key(session_key: int, seq: int) -> bytes:
    """The ``events`` key of one record."""
    return _EVENT_KEY.pack(session_key, seq)


def encode_u64(value: int) -> bytes:
    return _U64.pack(value)


def decode_u64(raw: bytes) -> int:
    (value,) = _U64.unpack(raw)
    return int(value)


class SessionRow(NamedTuple):
    """A ``sessions`` row: the header and the highest durable seq (``-1``: none)."""

    header: SessionHeader
    last_seq: int


def encode_row(header_json: bytes, last_seq: int) -> bytes:
    return _ROW_PREFIX.pack(last_seq) + header_json


class Tail(NamedTuple):
    """One session's records in the journal: seqs ``first``, ``first + 1``, ...

    The writer only ever appends to ``records``, so a reader that notes its length
    before a read transaction may use that many records afterwards.
    """

    first: int
    records: list[bytes]


Tails = dict[int, Tail]  # session key -> its records in the journal


def decode_row(raw: bytes) -> SessionRow:
    try:
        (last_seq,) = _ROW_PREFIX.unpack_from(raw)
        return SessionRow(_header_decoder.decode(raw[_ROW_PREFIX.size :]), last_seq)
    except (struct.error, msgspec.DecodeError) as err:
        raise LogCorruptError(
            f"a session row cannot be read ({err}); the store is damaged: restore it from "
            "a backup or an export"
        ) from err


class Databases(NamedTuple):
    """The five named databases of a store environment."""

    events: lmdb._Database
    sessions: lmdb._Database
    order: lmdb._Database
    meta: lmdb._Database
    journal: lmdb._Database | None  # None: a version 1 store opened read-only


Span = tuple[int, int, list[bytes]]
"""One session's records of seqs ``first``, ``first + 1``, ...: (session key, first, records)."""


def put_spans(
    txn: lmdb.Transaction[bytes], events: lmdb._Database, spans: list[Span]
) -> dict[int, int]:
    """Write ``spans`` (each session's in seq order) to the ``events`` database as
    blocks; return the last seq written of each session. Raises :class:`StorageError`
    if a record of a span is stored already (a damaged store): nothing is overwritten."""
    spans = sorted(spans, key=_SESSION)  # stable: a session's spans stay in seq order
    cursor = txn.cursor(db=events)
    end = cursor.key() if cursor.last() else b""  # the highest key stored
    encode = _frame_encoder.encode
    for key, first, payloads in spans:
        if not payloads:
            continue
        start = _EVENT_KEY.pack(key, first)
        # Keys past the end are appended (no search for their place, full pages); only
        # the last value stored can overlap them, if it is the session's.
        append = start > end
        if not append or end.startswith(start[:8]):
            _refuse_stored(cursor, key, first)
        for seq, block in _blocks(first, payloads):
            block_key = start if seq == first else _EVENT_KEY.pack(key, seq)
            if not cursor.put(block_key, encode(block), overwrite=False, append=append):
                _refuse_stored(cursor, key, seq)  # raises (the key is stored)
            end = max(end, block_key)
    return {key: first + len(payloads) - 1 for key, first, payloads in spans}  # last wins


def _blocks(first: int, payloads: list[bytes]) -> list[tuple[int, list[bytes]]]:
    """``payloads`` (seqs ``first``, ...) cut into blocks within the bounds."""
    if len(payloads) <= BLOCK_RECORDS and sum(map(len, payloads)) <= BLOCK_BYTES:
        return [(first, payloads)]  # a compaction's or a turn's run: one block
    blocks: list[tuple[int, list[bytes]]] = []
    start = size = 0
    for index, payload in enumerate(payloads):
        if index > start and (index - start >= BLOCK_RECORDS or size + len(payload) > BLOCK_BYTES):
            blocks.append((first + start, payloads[start:index]))
            start, size = index, 0
        size += len(payload)
    blocks.append((first + start, payloads[start:]))
    return blocks


def _refuse_stored(cursor: lmdb.Cursor[bytes], key: int, first: int) -> None:
    """Raise :class:`StorageError` if ``events`` holds a record of session ``key`` at
    seq ``first`` or later (moves the cursor)."""
    prefix = _U64.pack(key)
    found = cursor.set_range(_EVENT_KEY.pack(key, first))
    stored = found and cursor.key().startswith(prefix)
    if not stored and (cursor.prev() if found else cursor.last()):
        # The session's last value before ``first``: does it reach ``first``?
        before = cursor.key()
        if before.startswith(prefix):
            (seq,) = _U64.unpack_from(before, 8)
            stored = seq + _size(cursor.value(), before) > first
    if stored:
        raise StorageError(
            f"events refused records of session key {key} from seq {first} on: "
            "they are stored already (the store is damaged?)"
        )


def _size(value: bytes, key: bytes) -> int:
    """How many records the ``events`` value stored at ``key`` holds."""
    if value[:1] < b"\x80":
        return 1  # one record, as versions 1 and 2 stored them
    try:
        return len(_block_size_decoder.decode(value))
    except msgspec.DecodeError as err:
        raise _damaged_block(key, err) from err


def _records(value: bytes, key: bytes) -> list[bytes]:
    """The records of the ``events`` value stored at ``key`` (see the module docstring)."""
    if value[:1] < b"\x80":
        return [value]  # one record, as versions 1 and 2 stored them
    try:
        return _records_decoder.decode(value)
    except msgspec.DecodeError as err:
        raise _damaged_block(key, err) from err


def _damaged_block(key: bytes, err: msgspec.DecodeError) -> LogCorruptError:
    session, seq = _EVENT_KEY.unpack(key)
    return LogCorruptError(
        f"the events block of session key {session} from seq {seq} cannot be read "
        f"({err}); the store is damaged: restore it from a backup or an export"
    )


def read_events(cursor: lmdb.Cursor[bytes], key: int, first: int, end: int) -> list[bytes] | None:
    """The records of seqs ``first .. end - 1`` of session ``key`` in ``events``, or
    ``None`` if one of them is not stored, or values overlap (a damaged store)."""
    start = _EVENT_KEY.pack(key, first)
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
        (at,) = _U64.unpack_from(stored, 8)
        records = _records(value, stored)
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
        session, seq = _EVENT_KEY.unpack(stored)
        for offset, record in enumerate(_records(value, stored)):
            yield _EVENT_KEY.pack(session, seq + offset), record


def encode_frame(spans: list[Span]) -> bytes:
    """The ``journal`` value of one group commit: its journaled runs (see above)."""
    return _frame_encoder.encode(spans)


def compact(txn: lmdb.Transaction[bytes], dbs: Databases, rows: list[tuple[bytes, bytes]]) -> None:
    """Finish a compaction in the caller's transaction, once every journal record is in
    ``events`` (:func:`put_spans`): write the session ``rows`` that now end there and
    empty the journal."""
    if dbs.journal is None:
        raise StorageError("a version 1 store opened read-only has no journal to compact")
    rows.sort()  # one call, in key order: no GIL round trip per session
    txn.cursor(db=dbs.sessions).putmulti(rows)
    txn.drop(dbs.journal, delete=False)


def trim_journal(txn: lmdb.Transaction[bytes], dbs: Databases, end: int) -> int:
    """Delete the journal frames of keys below ``end`` (the end of a compaction round,
    every record they hold being in ``events`` now); return how many."""
    if dbs.journal is None:
        raise StorageError("a version 1 store opened read-only has no journal to compact")
    cursor = txn.cursor(db=dbs.journal)
    stop = _U64.pack(end)
    deleted = 0
    if cursor.first():
        while cursor.key() < stop and cursor.delete():
            deleted += 1
    return deleted


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
        unpack = _EVENT_KEY.unpack_from
        for value in values:
            if not value.startswith(prefix):
                continue
            if len(value) < _EVENT_KEY.size:
                raise LogCorruptError(
                    "a journal record is too short; the store is damaged: restore it"
                )
            session, seq = unpack(value)
            _join(tails, session, seq, [value[_EVENT_KEY.size :]])
        return tails
    try:
        for value in values:
            for session, first, records in _frame_decoder.decode(value):
                if key is None or session == key:
                    _join(tails, session, first, _records_decoder.decode(records))
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


class ResizeLock:
    """Shared for read transactions, exclusive for ``env.set_mapsize``/``env.close``
    and for the abort of a write transaction.

    ``set_mapsize`` invalidates every transaction of the environment in this process,
    so the map is grown only while no reader of this process is inside one; a write
    transaction is aborted the same way, or py-lmdb's abort waits for the readers (see
    :meth:`LmdbEnv.writing`). Readers never wait for commits, only (briefly) for a
    resize or an abort. Not reentrant.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._resizing = False

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def resizing(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


class LmdbEnv:
    """An open store environment: its databases, resize lock and read helpers.

    A writable one also holds the directory's writer lock (``writer.lock``, an
    advisory ``flock``), so a second writing process is refused while readers in
    other processes are welcome. The kernel releases the lock if the process dies.
    """

    def __init__(self, path: Path, *, readonly: bool, map_size: int, sync: bool) -> None:
        self.path = path
        self.readonly = readonly
        self.resize_lock = ResizeLock()
        # The journal's records, kept by the writer of a writable environment (empty at
        # open: the journal is compacted first). The writer replaces the dict when it
        # compacts; readers take it (and a tail's length) *before* their transaction.
        self.tails: Tails = {}
        self._stored_version: bytes | None = None  # as meta holds it (see _open_dbs)
        self._closed = False
        self._lock_fd: int | None = None
        existed = _check_directory(path, readonly=readonly)
        if not readonly:
            self._lock_fd = _lock_writer(path)
        try:
            self.env = lmdb.open(
                str(path),
                subdir=True,
                max_dbs=8,
                max_readers=512,  # read transactions from many dispatcher threads at once
                map_size=max(map_size, MIN_MAP_SIZE),
                readonly=readonly,
                sync=sync,
                metasync=sync,
                mode=0o600,
                create=not readonly,
            )
        except BaseException as err:  # (a Ctrl-C too: the lock is not left held)
            self._unlock()
            if isinstance(err, lmdb.Error):
                raise StorageError(f"cannot open the store at {path}: {err}") from err
            raise
        try:
            _check_size(self.env, path)
            self.env.reader_check()  # free reader slots left by processes that died
            self.dbs = self._open_dbs(existed=existed)
            if not readonly:
                self._recover()
        except _DAMAGE as err:
            self.env.close()
            self._unlock()
            raise LogCorruptError(f"the store at {path} is damaged ({err}): restore it") from err
        except BaseException:
            self.env.close()
            self._unlock()
            raise

    def _open_dbs(self, *, existed: bool) -> Databases:
        env, path = self.env, self.path
        not_store = f"{path} holds an LMDB environment that is not a corral store"
        if existed and not self.readonly and _never_created(env):
            existed = False  # a first open that never ended: made anew
        try:
            meta = env.open_db(META_DB, create=not existed)
        except lmdb.NotFoundError as err:
            raise StorageError(not_store) from err
        with env.begin(db=meta) as txn:
            stored = txn.get(SCHEMA_VERSION_KEY)
        if stored is None and existed:
            raise StorageError(f"{not_store} (it has no schema version)")
        current = str(SCHEMA_VERSION).encode("ascii")
        if stored not in (None, current, *_OLDER):
            found = stored.decode("ascii", "replace")
            raise SchemaVersionError(
                f"the store at {path} has schema version {found}; this corral supports "
                f"version {SCHEMA_VERSION}: open it with a matching corral release"
            )
        create = not self.readonly
        no_journal = stored == b"1" and self.readonly
        dbs = Databases(
            env.open_db(EVENTS_DB, create=create),
            env.open_db(SESSIONS_DB, create=create),
            env.open_db(ORDER_DB, create=create),
            meta,
            None if no_journal else env.open_db(JOURNAL_DB, create=create),
        )
        self._stored_version = stored
        if stored is None:  # a new store (an older one is stamped by _recover)
            with self.writing() as txn:
                txn.put(SCHEMA_VERSION_KEY, current, db=meta)
                txn.put(NEXT_KEY_KEY, encode_u64(1), db=meta)
            self._stored_version = current
        return dbs

    @property
    def framed(self) -> bool:
        """Whether the journal holds frames (version 3) or one record per value (a
        version 2 store opened read-only; a writable open upgrades it)."""
        return self._stored_version != _PER_RECORD

    def _recover(self) -> None:
        """Compact what a crash left in the journal, so that :attr:`tails` (empty) is
        exact for the writer that is about to start; an older store is stamped with the
        current version in the same transaction (its journal read in its own format)."""
        current = str(SCHEMA_VERSION).encode("ascii")
        while True:
            try:
                with self.writing() as txn:
                    self._compact_journal(txn)
                    if self._stored_version != current:
                        txn.put(SCHEMA_VERSION_KEY, current, db=self.dbs.meta)
            except lmdb.MapFullError:
                self.grow()
            else:
                self._stored_version = current
                return

    def _compact_journal(self, txn: lmdb.Transaction[bytes]) -> None:
        """Compact the whole journal in ``txn``. A session's journaled records up to its
        row's last seq are in ``events`` already (a compaction round that a crash
        interrupted moved them there): only those after it are compacted."""
        dbs = self.dbs
        tails = scan_journal(txn, dbs.journal, None, framed=self.framed)
        if not tails:
            return
        rows: dict[int, tuple[bytes, bytes]] = {}  # session key -> (session id, header)
        spans: list[Span] = []
        for key, tail in tails.items():
            session_id = txn.get(encode_u64(key), db=dbs.order)
            raw = txn.get(session_id, db=dbs.sessions) if session_id is not None else None
            if session_id is None or raw is None:
                raise LogCorruptError(
                    f"the journal of {self.path} holds records of session key {key}, "
                    "which has no session row: restore the store from a backup or an export"
                )
            rows[key] = (session_id, raw[_ROW_PREFIX.size :])
            stored = decode_row(raw).last_seq
            if tail.first > stored + 1:
                raise LogCorruptError(
                    f"the journal of {self.path} holds session key {key} from seq "
                    f"{tail.first}, but its stored events end at seq {stored}: the store "
                    "is damaged: restore it from a backup or an export"
                )
            first = max(tail.first, stored + 1)
            if first < tail.first + len(tail.records):
                spans.append((key, first, tail.records[first - tail.first :]))
        last = put_spans(txn, dbs.events, spans)
        compact(txn, dbs, [(rows[k][0], encode_row(rows[k][1], seq)) for k, seq in last.items()])

    def close(self) -> None:
        """Close the environment once no reader is inside a transaction, and let go of
        the writer lock. Idempotent, and a close interrupted half-way (a Ctrl-C) is
        finished by the next one: ``env.close()`` is idempotent, as is the unlock."""
        with self.resize_lock.resizing():
            self.env.close()
            self._closed = True
        self._unlock()

    @contextmanager
    def writing(self) -> Iterator[lmdb.Transaction[bytes]]:
        """A write transaction, committed when the block returns and aborted if it
        raises (as on :class:`lmdb.MapFullError`, when the map must grow).

        The abort holds the resize lock, as a growth does: readers of this process
        finish their transaction and wait. py-lmdb (3.0) aborts a write transaction only
        at an instant when no other thread is inside an LMDB call (its ``active_ops``
        count, which holds a call until its thread has the GIL back), and readers in a
        loop starved that wait: the growth that follows a full map took seconds to
        minutes with three reader threads (RELIABILITY.md, section 7). A commit does not
        wait (a failed one is aborted by LMDB itself)."""
        txn = self.env.begin(write=True)
        try:
            yield txn
        except BaseException:
            with self.resize_lock.resizing():
                txn.abort()
            raise
        txn.commit()

    def grow(self) -> int:
        """Double the map (no write transaction may be active); return the new size."""
        with self.resize_lock.resizing():
            size = 2 * int(self.env.info()["map_size"])
            self.env.set_mapsize(size)
        return size

    def map_size(self) -> int:
        with self.reading():
            return int(self.env.info()["map_size"])

    @contextmanager
    def reading(self) -> Iterator[lmdb.Transaction[bytes]]:
        """A short read transaction; adopts a map another process has grown."""
        for _attempt in range(8):
            with self.resize_lock.reading():
                if self._closed:
                    raise StoreClosedError(f"the store at {self.path} is closed; open it again")
                try:
                    txn = self.env.begin()
                except lmdb.MapResizedError:
                    txn = None
                if txn is not None:
                    try:
                        yield txn
                    except _DAMAGE as err:
                        raise LogCorruptError(
                            f"the store at {self.path} is damaged ({err}): restore it from a "
                            "backup or an export"
                        ) from err
                    finally:
                        txn.abort()
                    return
            with self.resize_lock.resizing():
                self.env.set_mapsize(0)  # adopt the size the writing process chose
        raise StorageError(f"the map of {self.path} keeps growing under this reader; retry")

    def next_session_key(self) -> int:
        with self.reading() as txn:
            raw = txn.get(NEXT_KEY_KEY, db=self.dbs.meta)
        return decode_u64(raw) if raw is not None else 1

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
                tails = scan_journal(txn, self.dbs.journal, row.header.key, framed=self.framed)
        return _with_tail(row, tails.get(row.header.key))

    def rows(self) -> list[SessionRow]:
        """Every session row, in creation order."""
        tails = self.tails
        with self.reading() as txn:
            ids = [value for _, value in txn.cursor(db=self.dbs.order)]
            raws = [txn.get(sid, db=self.dbs.sessions) for sid in ids]
            if self.readonly:
                tails = scan_journal(txn, self.dbs.journal, None, framed=self.framed)
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
            count = min(_READ_CHUNK, last - first + 1)
            end = first + count
            tail = self.tails.get(key)  # before the transaction: see the module docstring
            with self.reading() as txn:
                compacted = self._compacted_last(txn, session)
                if self.readonly and compacted < end - 1:
                    tail = scan_journal(txn, self.dbs.journal, key, framed=self.framed).get(key)
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

    def _compacted_last(self, txn: lmdb.Transaction[bytes], session: SessionRow) -> int:
        raw = txn.get(session.header.id.encode("utf-8"), db=self.dbs.sessions)
        return decode_row(raw).last_seq if raw is not None else -1

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None


def _with_tail(row: SessionRow, tail: Tail | None) -> SessionRow:
    """``row`` with the last seq of its records in the journal, if they go further (a
    tail taken just before a compaction may end before the compacted records)."""
    if tail is None or tail.first + len(tail.records) - 1 <= row.last_seq:
        return row
    return row._replace(last_seq=tail.first + len(tail.records) - 1)


_OWN_DBS: Final = frozenset({META_DB, EVENTS_DB, SESSIONS_DB, ORDER_DB, JOURNAL_DB})
_OWN_FILES: Final = frozenset({"writer.lock", "lock.mdb"})
"""What a first open makes before ``data.mdb`` (the lock files)."""


def _never_created(env: lmdb.Environment) -> bool:
    """Whether the environment is a store whose first open never ended (a Ctrl-C or a
    kill before it committed the schema version): no schema version and no data at all,
    only (some of) corral's own databases, empty. Anything else is not touched."""
    with env.begin() as txn:
        names = [bytes(key) for key in txn.cursor().iternext(keys=True, values=False)]
    if not set(names) <= _OWN_DBS:
        return False
    for name in names:
        db = env.open_db(name, create=False)
        with env.begin(db=db) as txn:
            if txn.stat(db)["entries"]:
                return False
    return True


def _check_size(env: lmdb.Environment, path: Path) -> None:
    """Refuse a data file shorter than its own meta page says: LMDB would read the
    missing pages through its memory map, and the process would die of SIGBUS."""
    need = (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])
    have = (path / "data.mdb").stat().st_size
    if have < need:
        raise LogCorruptError(
            f"the store at {path} is damaged: data.mdb has {have} bytes but its meta page "
            f"needs {need}; the file was truncated (a full disk, a partial copy?): restore "
            "it from a backup or an export"
        )


def _check_directory(path: Path, *, readonly: bool) -> bool:
    """Create the store directory if needed; return whether a store already exists."""
    try:
        if path.exists() and not path.is_dir():
            raise StorageError(f"{path} is not a directory: a corral store is a directory")
        existed = (path / "data.mdb").exists()
        if readonly and not existed:
            raise StorageError(
                f"no corral store at {path} (no data.mdb): a store is made by its first "
                "writable open (Runtime.open, corral run, corral bench, corral log import)"
            )
        if (
            not existed
            and path.exists()
            # (the lock files alone: a first open stopped before it made data.mdb)
            and any(entry.name not in _OWN_FILES for entry in path.iterdir())
        ):
            raise StorageError(
                f"{path} is not a corral store: it holds other files and no data.mdb; "
                "choose an empty or new directory"
            )
        if not path.exists():
            path.mkdir(mode=0o700, parents=True)
            path.chmod(0o700)
    except OSError as err:
        raise StorageError(f"cannot use {path} as a store: {err}") from err
    return existed


def _lock_writer(path: Path) -> int:
    try:
        fd = os.open(path / "writer.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as err:
        raise StorageError(f"cannot use {path} as a store: {err}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:  # who holds it, for the message another writer gets
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # only a message is less precise
    except BlockingIOError:
        holder = _lock_holder(fd)
        os.close(fd)
        raise StorageError(
            f"the store at {path} is already open for writing by {holder}, and a store "
            "has one writer at a time: close that runtime or store first (readers, "
            "Store.open(path, readonly=True) and the corral log commands, may open it "
            "meanwhile)"
        ) from None
    except BaseException:  # (a Ctrl-C once locked: closing the descriptor unlocks)
        os.close(fd)
        raise
    return fd


def _lock_holder(fd: int) -> str:
    """``this process`` or ``process PID``, from what the holder wrote into the lock file."""
    try:
        pid = int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return "another runtime or store (this or another process)"
    return "this process" if pid == os.getpid() else f"process {pid}"
