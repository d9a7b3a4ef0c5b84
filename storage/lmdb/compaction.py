"""Compacting the journal into the session-major ``events`` database (the layout is
:mod:`storage.lmdb.layout`'s): how a group commit's runs are routed, the thresholds
and steps of a compaction round, and the writes that end one. The log writer
(:mod:`storage.lmdb.writer`) decides when, on its thread.

A group commit appends its records to the journal (a page or two for the whole batch,
see :mod:`storage.lmdb_env`) and updates the in-memory copy of the journal that the
store's readers merge. The writer *compacts* the journal into the session-major
``events`` database. After :data:`JOURNAL_IDLE_S` without work, and at close, it
compacts the whole journal in one transaction. Under load, once the records not yet
compacted reach :data:`JOURNAL_MAX_RECORDS` or :data:`JOURNAL_MAX_BYTES`, it starts a
*round*: the sessions that have records in the journal at that moment are compacted a
few at a time, one *step* per commit (see :func:`next_step`), each with
every record it has then; the round's last step deletes the journal frames written
before the round began, every record of them being in ``events`` by then. (In one
commit, a whole compaction held every flush that waited on that commit for as long as
it took to write and sync all of it.) A large run of a session that has nothing in the
journal (a bulk append, a batch) skips the journal and goes straight to ``events``
with its session row (see :class:`Batch`).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Final, NamedTuple

import lmdb

from storage.errors import StorageError
from storage.lmdb.layout import U64, Databases, Span, Tails

__all__ = [
    "COMPACT_STEP_BYTES",
    "COMPACT_STEP_FACTOR",
    "COMPACT_STEP_RECORDS",
    "DIRECT_MIN_BYTES",
    "JOURNAL_IDLE_S",
    "JOURNAL_MAX_BYTES",
    "JOURNAL_MAX_RECORDS",
    "NO_STEP",
    "Batch",
    "Step",
    "compact",
    "next_step",
    "route",
    "step_spans",
    "trim_journal",
]

_PAYLOADS: Final = itemgetter(2)  # a span's records

# Compaction thresholds: a round starts once the records not yet compacted reach them.
# Larger ones give each session's block more records, so compaction costs less per
# record (1,000 agents x 40 turns, the close charged, three runs each: 9,791-10,223
# turns/s at 16,384 records / 8 MiB, 10,989-11,291 at 65,536 / 32 MiB); smaller ones
# keep short the journal that read-only processes scan and the writer's in-memory copy
# of what it has not compacted. The frames a round writes stay until the next round
# ends: the journal on disk holds up to about twice this much, plus what arrives
# during a round.
JOURNAL_MAX_RECORDS: Final = 65536
JOURNAL_MAX_BYTES: Final = 32 << 20
JOURNAL_IDLE_S: Final = 0.5
# A compaction under load goes in steps, one per commit, of at least this many records
# or bytes (see LogWriter._next_step): the whole 16,384-record journal in one commit
# held every flush waiting on it for the ~50 ms it took to write and sync (1,000 agents
# x 20 turns: the dispatcher idle ~20% of the run).
COMPACT_STEP_RECORDS: Final = 2048
COMPACT_STEP_BYTES: Final = 1 << 20
# ... and this many times what the commit journals: a round ends after a few commits
# however fast records come in (and the tails it leaves in memory stay bounded).
COMPACT_STEP_FACTOR: Final = 2
# A run of a session with nothing in the journal goes straight to ``events`` from this
# size on (4 pages): smaller ones share the journal's pages with other sessions' runs.
DIRECT_MIN_BYTES: Final = 16 << 10


class Step(NamedTuple):
    """One commit's part of a compaction round: the sessions whose records it moves to
    ``events`` (with how many records and bytes their tails hold), and whether it is the
    round's last (which deletes the journal frames the round covers)."""

    keys: list[int]
    last: bool
    records: int
    size: int


NO_STEP: Final = Step([], False, 0, 0)


class Batch(NamedTuple):
    """The records of one group commit, routed.

    A session's records are stored as seqs ``0..k`` in ``events`` and ``k + 1..m`` in
    the journal (see :mod:`storage.lmdb_env`). A run goes ``direct`` to ``events``,
    with its session row, when it fills pages of its own (:data:`DIRECT_MIN_BYTES`)
    and its session has nothing in the journal: a bulk append or a large
    ``submit_many`` is written once instead of twice (journal, then compaction), and
    builds no in-memory tail. Other runs are ``journaled``.
    """

    direct: list[Span]
    journaled: list[Span]
    records: int
    size: int
    journal_records: int
    journal_bytes: int


def route(runs: list[Span], tails: Tails) -> Batch:
    """Split ``runs`` into those written straight to ``events`` and those appended
    to the journal (see :class:`Batch`)."""
    sizes = [sum(map(len, payloads)) for _, _, payloads in runs]
    records = sum(map(len, map(_PAYLOADS, runs)))
    size = sum(sizes)
    if not sizes or max(sizes) < DIRECT_MIN_BYTES:  # the usual batch: loops in C only
        return Batch([], runs, records, size, records, size)
    direct: list[Span] = []
    journaled: list[Span] = []
    journaled_keys: set[int] = set()
    journal_records = journal_bytes = 0
    for run, run_size in zip(runs, sizes, strict=True):
        key, _, payloads = run
        if run_size >= DIRECT_MIN_BYTES and key not in tails and key not in journaled_keys:
            direct.append(run)
        else:
            journaled.append(run)
            journaled_keys.add(key)
            journal_records += len(payloads)
            journal_bytes += run_size
    return Batch(direct, journaled, records, size, journal_records, journal_bytes)


def next_step(pending: list[int], tails: Tails, batch: Batch) -> Step:
    """The sessions the next commit compacts: the next ones of the round ``pending`` (taken
    from it), at least
    :data:`COMPACT_STEP_RECORDS` records or :data:`COMPACT_STEP_BYTES` bytes and
    :data:`COMPACT_STEP_FACTOR` times what ``batch`` journals (a step is at least
    one session, so a round always ends). The round's last step also deletes the
    journal frames the round covers."""
    want_records = max(COMPACT_STEP_RECORDS, COMPACT_STEP_FACTOR * batch.journal_records)
    want_bytes = max(COMPACT_STEP_BYTES, COMPACT_STEP_FACTOR * batch.journal_bytes)
    keys: list[int] = []
    records = size = 0
    while pending and records < want_records and size < want_bytes:
        key = pending.pop()
        tail = tails.get(key)
        if tail is not None:  # Invariant: only a step or a whole compaction drops one
            keys.append(key)
            records += len(tail.records)
            size += sum(map(len, tail.records))
    return Step(keys, not pending, records, size)


def step_spans(keys: list[int], batch: Batch, tails: Tails) -> list[Span]:
    """The records of a step's sessions: their tails, and what ``batch`` appends to
    them (compacted in the same commit, so that no tail is left behind in memory)."""
    wanted = set(keys)
    more: dict[int, list[bytes]] = {}
    for key, _, payloads in batch.journaled:
        if key in wanted:
            more.setdefault(key, []).extend(payloads)
    spans: list[Span] = []
    for key in keys:
        tail = tails[key]
        extra = more.get(key)
        spans.append((key, tail.first, tail.records + extra if extra else tail.records))
    return spans


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
    stop = U64.pack(end)
    deleted = 0
    if cursor.first():
        while cursor.key() < stop and cursor.delete():
            deleted += 1
    return deleted
