"""The on-disk layout of a store: its databases, keys, session rows, blocks and frames.

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
  compacted seq (``-1``: none) + the :class:`~storage.records.SessionHeader` as JSON.
- ``session-order``: key = 8-byte big-endian session key; value = session id: the
  creation order.
- ``meta``: ``schema_version`` (ASCII decimal) and ``next_session_key`` (8 bytes).

Why a journal: a group commit carries one record each of many sessions. Written
session-major, each record dirties its own ``events`` leaf page (plus its session
row), and a commit costs a page write per session. Appended to the journal, the same
records share a page or two, written as one value: the writer packs a commit's
records in one C call instead of a key and an LMDB put per record. The writer compacts
the journal into ``events`` (and the session rows) once it is large, a few sessions
per commit, or whole when idle (see :mod:`storage.lmdb.compaction`): a session's many records
then share pages and one block (one LMDB put, not one per record). A large run of one
session that has nothing in the journal (a bulk append, a ``Session.extend``) skips
the journal: it goes straight to ``events`` with its session row. A session's records
are therefore seqs ``0..k`` in ``events`` (``k`` = its row's last seq) and ``k + 1..m``
in the journal. The journal may also still hold some of seqs ``0..k`` (a compaction
round moves a session's records to ``events`` before it deletes the frames that hold
them): such a record is a copy of the one in ``events``, and readers take seqs up to
``k`` from ``events`` only. A session's journaled records are contiguous. Readers merge
the two:

- in the writing process, from :attr:`storage.lmdb.env.LmdbEnv.tails`, an in-memory copy of the
  journal that the writer updates after each commit (before acknowledging it);
- in read-only processes, by scanning the journal (bounded by compaction).

A writable open compacts what a crash left in the journal before anything reads.

The writer (:mod:`storage.lmdb.writer`), the compaction (:mod:`storage.lmdb.compaction`),
the open and migration (:mod:`storage.lmdb.env`) and the readers (:mod:`storage.lmdb.reads`)
share this module so that they agree on the layout in one place.
"""

from __future__ import annotations

import struct
from operator import itemgetter
from typing import Final, NamedTuple

import lmdb
import msgspec

from storage.errors import LogCorruptError, StorageError
from storage.records import SessionHeader

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_RECORDS",
    "EVENT_KEY",
    "FRAME_DECODER",
    "OLDER_VERSIONS",
    "PER_RECORD_VERSION",
    "RECORDS_DECODER",
    "ROW_PREFIX",
    "SCHEMA_VERSION",
    "U64",
    "Databases",
    "SessionRow",
    "Span",
    "Tail",
    "Tails",
    "block_records",
    "decode_row",
    "decode_u64",
    "encode_frame",
    "encode_row",
    "encode_u64",
    "event_key",
    "put_spans",
]

SCHEMA_VERSION: Final = 4
# Older versions this one opens: version 1 has no journal; version 2 journals one
# record per value (8-byte session key + 8-byte seq + the record bytes). Both store one
# record per ``events`` value, which later versions read as it is (see above). Version
# 3 is version 4 without compaction rounds: its journal never holds a compacted
# record (version 4's may; an older release would refuse to recover it, hence the new
# version). A writable open compacts what an old journal holds and stamps the current
# version in one transaction; a read-only open reads the store as it is.
OLDER_VERSIONS: Final = (b"1", b"2", b"3")
PER_RECORD_VERSION: Final = b"2"

EVENTS_DB: Final = b"events"
JOURNAL_DB: Final = b"journal"
SESSIONS_DB: Final = b"sessions"
ORDER_DB: Final = b"session-order"
META_DB: Final = b"meta"
SCHEMA_VERSION_KEY: Final = b"schema_version"
NEXT_KEY_KEY: Final = b"next_session_key"

MIN_MAP_SIZE: Final = 64 << 10  # room for the databases themselves; the map grows anyway
# A block's bounds: a read of one record decodes its whole block (a copy of its bytes).
BLOCK_RECORDS: Final = 512
BLOCK_BYTES: Final = 256 << 10
EVENT_KEY: Final = struct.Struct(">QQ")
U64: Final = struct.Struct(">Q")
ROW_PREFIX: Final = struct.Struct(">q")
_SESSION: Final = itemgetter(0)
_header_decoder: Final = msgspec.json.Decoder(SessionHeader)
_frame_encoder: Final = msgspec.msgpack.Encoder()
# A frame's runs, each session's records left undecoded until a reader wants them.
FRAME_DECODER: Final = msgspec.msgpack.Decoder(list[tuple[int, int, msgspec.Raw]])
RECORDS_DECODER: Final = msgspec.msgpack.Decoder(list[bytes])
_block_size_decoder: Final = msgspec.msgpack.Decoder(list[msgspec.Raw])


def event_key(session_key: int, seq: int) -> bytes:
    """The ``events`` key of one record."""
    return EVENT_KEY.pack(session_key, seq)


def encode_u64(value: int) -> bytes:
    return U64.pack(value)


def decode_u64(raw: bytes) -> int:
    (value,) = U64.unpack(raw)
    return int(value)


class SessionRow(NamedTuple):
    """A ``sessions`` row: the header and the highest durable seq (``-1``: none)."""

    header: SessionHeader
    last_seq: int


def encode_row(header_json: bytes, last_seq: int) -> bytes:
    return ROW_PREFIX.pack(last_seq) + header_json


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
        (last_seq,) = ROW_PREFIX.unpack_from(raw)
        return SessionRow(_header_decoder.decode(raw[ROW_PREFIX.size :]), last_seq)
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
        start = EVENT_KEY.pack(key, first)
        # Keys past the end are appended (no search for their place, full pages); only
        # the last value stored can overlap them, if it is the session's.
        append = start > end
        if not append or end.startswith(start[:8]):
            _refuse_stored(cursor, key, first)
        for seq, block in _blocks(first, payloads):
            block_key = start if seq == first else EVENT_KEY.pack(key, seq)
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
    prefix = U64.pack(key)
    found = cursor.set_range(EVENT_KEY.pack(key, first))
    stored = found and cursor.key().startswith(prefix)
    if not stored and (cursor.prev() if found else cursor.last()):
        # The session's last value before ``first``: does it reach ``first``?
        before = cursor.key()
        if before.startswith(prefix):
            (seq,) = U64.unpack_from(before, 8)
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


def block_records(value: bytes, key: bytes) -> list[bytes]:
    """The records of the ``events`` value stored at ``key`` (see the module docstring)."""
    if value[:1] < b"\x80":
        return [value]  # one record, as versions 1 and 2 stored them
    try:
        return RECORDS_DECODER.decode(value)
    except msgspec.DecodeError as err:
        raise _damaged_block(key, err) from err


def _damaged_block(key: bytes, err: msgspec.DecodeError) -> LogCorruptError:
    session, seq = EVENT_KEY.unpack(key)
    return LogCorruptError(
        f"the events block of session key {session} from seq {seq} cannot be read "
        f"({err}); the store is damaged: restore it from a backup or an export"
    )


def encode_frame(spans: list[Span]) -> bytes:
    """The ``journal`` value of one group commit: its journaled runs (see above)."""
    return _frame_encoder.encode(spans)
