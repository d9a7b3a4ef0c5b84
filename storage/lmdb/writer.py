"""The log writer: the one thread that owns every LMDB write transaction of a store.

A session puts its encoded records in its *outbox* (:meth:`LogWriter.outbox`, see
``storage.records.Outbox``): a list append per record, and a word to the writer (under
its lock) only when the list was empty. Other producers hand records over through
:meth:`LogWriter.submit` or a batch of one session's records through
:meth:`LogWriter.submit_many`. Records wait as *runs* (one session's consecutive seqs),
which the writer handles with a few calls that loop in C rather than Python code per
record. The writer thread drains *everything* pending — the records of every outbox
and run, new session headers and flush requests — into one write transaction (group
commit), commits it, and only then resolves the flush requests it drained. A flush is
therefore acknowledged only once every record appended before it is on disk. (Handing
records over through outboxes instead of a :meth:`LogWriter.submit` per record: 5-8%
more turns per second with 1,000 agents, see benchmarks/README.md.)

A group commit appends its records to the journal and updates the in-memory copy of
the journal that the store's readers merge (see :mod:`storage.lmdb.layout`); the
writer compacts the journal into ``events`` when idle, at close, and in rounds of steps
under load (see :mod:`storage.lmdb.compaction`). Blocking :meth:`LogWriter.flush`
callers of one commit are woken in a chain (see :mod:`storage.lmdb.waiters`), and the
writer waits (at most :data:`GATHER_S`) for the end of the chain before it drains the
next batch, so that threads that flush after every append share one commit.

Failure semantics:

- A full map aborts the transaction, doubles the map and retries the same batch:
  nothing is lost or written twice.
- A full *disk* (see :mod:`storage.lmdb.space`) is not a failure: the batch is *held*
  (queued again, in order, ahead of what comes next) and retried every
  :data:`FULL_RETRY_S` and at each flush request; the flushes of a commit that found the
  disk full fail with :class:`~storage.errors.DiskFullError`, appends go on being
  accepted (held in memory), and the first commit that fits writes everything held and
  acknowledges later flushes as usual. A compaction that does not fit is put off
  (:data:`COMPACT_RETRY_S`) and the batch retried at once without it: appending needs
  far less room than compacting.
- Any other failure is sticky: the flush requests of the failed batch and every later
  one fail with a :class:`~storage.errors.StorageError` whose ``__cause__`` is the
  original error, and new records are refused (an append raises, leaving nothing).
  Nothing is dropped silently.
- Records of one session are accepted only in seq order without gaps: a record out of
  order is refused in :meth:`LogWriter.submit`, before anything is queued; an outbox
  takes a session's records in the order its appends made them, and the outbox of a
  session object that was opened again since refuses them.
- Close and append race safely: an append that returns is written by the close's last
  batch; one the close refuses raises and leaves nothing (see :class:`_Outbox`).

The layout it writes is described in :mod:`storage.lmdb.layout`.

One piece, over 500 lines: the producers' side (outboxes, runs, flush requests) and
the commit loop share one lock and one set of fields (what is queued, what the journal
holds, the state), which each method reads and changes together; split, each half would
reach into the other's fields.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import lmdb
import msgspec

from storage.errors import DiskFullError, StorageError, StoreClosedError
from storage.lmdb.compaction import (
    JOURNAL_IDLE_S,
    JOURNAL_MAX_BYTES,
    JOURNAL_MAX_RECORDS,
    NO_STEP,
    Batch,
    Step,
    compact,
    next_step,
    route,
    step_spans,
    trim_journal,
)
from storage.lmdb.env import LmdbEnv
from storage.lmdb.layout import (
    NEXT_KEY_KEY,
    Span,
    Tail,
    decode_u64,
    encode_frame,
    encode_row,
    encode_u64,
    put_spans,
)
from storage.lmdb.space import compaction_fits, disk_full, room_for
from storage.lmdb.waiters import SoloWaiter, Waiter, call, resolve, spare, wake
from storage.locks import wait_until_free
from storage.records import FlushCallback, Record, SessionHeader
from storage.threads import start_thread

__all__ = ["COMPACT_RETRY_S", "FULL_RETRY_S", "GATHER_S", "LogWriter", "WriterStatistics"]

_log = logging.getLogger("storage.writer")  # its name before the move into storage.lmdb

_COUNTER: Final = struct.Struct(">Q")  # a journal key
_header_encoder: Final = msgspec.json.Encoder()
_get_ident: Final = threading.get_ident


GATHER_S: Final = 0.002
# While the disk is full: how often the held batch is tried again without a flush
# asking, and how long a compaction that did not fit is put off.
FULL_RETRY_S: Final = 0.25
COMPACT_RETRY_S: Final = 5.0
_HELD: Final = (
    "the records appended meanwhile are held in memory and written, in order, as soon "
    "as there is room (flush again then)"
)
_LOST: Final = (
    "the store was closed meanwhile: what no flush acknowledged was not written (it is "
    "not in the log; nothing acknowledged is lost)"
)


@dataclass(frozen=True, slots=True)
class WriterStatistics:
    """Counters of one writer (this process only)."""

    events_written: int
    commits: int
    bytes_written: int
    resizes: int
    compactions: int
    full_disk_commits: int = 0  # commits that found the disk full (and were held)


class _Tracked:
    """What the writer knows of one session: its id and header, for its row."""

    __slots__ = ("header_json", "id_bytes")

    def __init__(self, id_bytes: bytes, header_json: bytes) -> None:
        self.id_bytes = id_bytes
        self.header_json = header_json

    @classmethod
    def of(cls, header: SessionHeader) -> _Tracked:
        return cls(header.id.encode("utf-8"), _header_encoder.encode(header))


class _Outbox:
    """A session's records not taken yet (see ``storage.records.Outbox``). The session
    appends to ``records`` under its own lock; the writer takes them from the front
    under its lock, in the same critical section in which it takes the flush requests
    they precede (:meth:`LogWriter._take`).

    Invariant (outside the writer's critical section): ``records`` is non-empty only if
    the outbox is pending (its key in ``LogWriter._pending``) or ``stopped``. A session
    appends to a non-empty list without a word; one that finds only its own records
    there (the writer has emptied the list, and may have dropped the key) announces
    them; the writer keeps the key pending if records came in while it took the others.
    """

    __slots__ = ("_writer", "key", "records", "stale", "stopped")

    def __init__(self, writer: LogWriter, key: int) -> None:
        self._writer = writer
        self.key = key
        self.records: list[bytes] = []
        # Set under the writer's lock, never cleared: the writer closed or failed, or a
        # newer outbox of the same session key took over (``stale``).
        self.stopped = False
        self.stale = False

    def announce(self, last: bytes, count: int) -> None:
        self._writer._announce(self, last, count)


_OPEN, _FAILED, _CLOSED = 0, 1, 2  # _OPEN is falsy; _CLOSED also while the last batch drains


class LogWriter:
    """The single writer thread of one store; implements ``storage.records.LogSink``."""

    def __init__(
        self, store: LmdbEnv, *, sync_on_flush: bool, name: str = "corral-log-writer"
    ) -> None:
        self._store = store
        self._env = store.env
        self._dbs = store.dbs
        self._sync_on_flush = sync_on_flush
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # Invariant: every queued record of a session has seq == the previous one + 1,
        # starting at the durable last seq + 1 given to ``track``.
        self._next_seq: dict[int, int] = {}
        # In submission order; the writer owns the lists it drains. Invariant: a session's
        # newest run ends at its _next_seq - 1 (every record passes that check), so a
        # record of the session of the last run continues that run.
        self._runs: list[Span] = []
        self._headers: list[SessionHeader] = []
        self._callbacks: list[FlushCallback] = []
        self._tracked: dict[int, _Tracked] = {}
        # The newest outbox of each session key that has one, and those holding records
        # the writer has not taken (see _Outbox).
        self._outboxes: dict[int, _Outbox] = {}
        self._pending: dict[int, _Outbox] = {}
        self._state = _OPEN
        self._failure: StorageError | None = None
        self._stopping = False
        self._unsynced = False
        self._events_written = 0
        self._commits = 0
        self._bytes_written = 0
        self._resizes = 0
        self._compactions = 0
        self._full_disk_commits = 0
        # Set while the disk is full (the last commit did not fit): the batch is held.
        self._full: DiskFullError | None = None
        # No compaction is tried before this (time.monotonic): the last one did not fit.
        self._compact_after = 0.0
        # The journal as the writer thread left it: its next key, and the records and
        # bytes of its tails (the records not compacted yet).
        self._counter, self._frames = self._journal_end()  # next key, frames on disk
        # (Not empty at open only if the journal a crash left did not fit to be compacted.)
        recovered = store.tails.values()
        self._journal_records = sum(len(tail.records) for tail in recovered)
        self._journal_bytes = sum(len(r) for tail in recovered for r in tail.records)
        for key, (id_bytes, header_json) in store.recovered.items():
            self._tracked[key] = _Tracked(id_bytes, header_json)
        # The compaction round in progress (see _run): the sessions it has still to
        # compact, and the key of the first journal frame it does not cover (None: no
        # round in progress).
        self._round: list[int] = []
        self._round_end: int | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread_id: int | None = None
        try:
            start_thread(self._thread)
        except BaseException:  # a Ctrl-C in start() once the thread ran: it is stopped
            if self._thread.ident is not None:
                self.close()
            raise
        self._thread_id = self._thread.ident

    # ------------------------------------------------------------------ producers

    def track(
        self,
        header: SessionHeader,
        *,
        next_seq: int,
        new: bool,
        seed: Sequence[bytes] = (),
    ) -> None:
        """Accept records of ``header``'s session from ``next_seq`` on.

        ``new`` queues the header itself: it is written in the next transaction,
        together with ``seed`` (the records of seqs ``next_seq``, ``next_seq + 1``, ...
        of an import or fork), all queued at once so that a crash leaves the new
        session either absent or whole.
        """
        tracked = _Tracked.of(header)
        with self._lock:
            self._check_open()
            self._tracked[header.key] = tracked
            key = header.key
            self._retire(key)
            if seed:
                self._runs.append((key, next_seq, list(seed)))
            self._next_seq[key] = next_seq + len(seed)
            if new:
                self._headers.append(header)
            if new or seed:
                self._wake.notify()

    def track_new(self, headers: Sequence[SessionHeader]) -> None:
        """:meth:`track` of many new empty sessions (``new=True``, seq 0 on) at once:
        one lock and one wake-up of the writer thread, their headers written in one
        transaction (a batch spawn)."""
        tracked = [_Tracked.of(header) for header in headers]
        with self._lock:
            self._check_open()
            for header, known in zip(headers, tracked, strict=True):
                key = header.key
                self._tracked[key] = known
                self._retire(key)
                self._next_seq[key] = 0
            self._headers.extend(headers)
            if headers:
                self._wake.notify()

    def outbox(self, session_key: int) -> _Outbox | None:
        """A new outbox for the records of session ``session_key`` (see
        ``storage.records.Outbox``), from the next seq on; a session's earlier outbox is
        refused from now on (a stale session object must not interleave its records with
        a reopened one's). ``None`` for an unknown session or once the writer is down:
        :meth:`submit` then refuses the session's records with the reason."""
        with self._lock:
            if self._state or session_key not in self._next_seq:
                return None
            self._retire(session_key)
            outbox = self._outboxes[session_key] = _Outbox(self, session_key)
            return outbox

    def _announce(self, outbox: _Outbox, last: bytes, count: int) -> None:
        """A session put ``count`` records (``last`` the last) in an ``outbox`` that
        held none, or finds it stopped: make it pending, or refuse them."""
        lock = self._lock
        while not lock.acquire(False):  # not `with` (hot path): see storage.locks
            wait_until_free(lock)
        try:
            if not outbox.stopped:
                pending = self._pending
                if not pending:
                    self._wake.notify()
                pending[outbox.key] = outbox
                return
            records = outbox.records
            if records and records[-1] is last:  # not taken: refused, and taken back
                del records[-count:]
                if outbox.stale:
                    raise StorageError(
                        f"records of session key {outbox.key} are out of order: the session "
                        "was opened again since this session object was; append through "
                        "the newest one"
                    )
                raise self._refusal()
            # Taken by the writer's last batch (a close that drains): they are written.
        finally:
            lock.release()

    def _retire(self, key: int) -> None:
        """Stop the outbox of session ``key``, if any, queueing what it still holds as a
        run (its seqs come before anything appended through a newer one). The lock is
        held."""
        outbox = self._outboxes.pop(key, None)
        if outbox is None:
            return
        outbox.stopped = outbox.stale = True
        self._pending.pop(key, None)
        runs = self._runs
        idle = not runs
        self._take_from(outbox, runs)
        if idle and runs:  # as submit_many: the writer may wait for work
            self._wake.notify()

    def _take(self, runs: list[Span]) -> None:
        """Append the records of every pending outbox to ``runs`` (the lock is held)."""
        pending = self._pending
        self._pending = {}
        for outbox in pending.values():
            self._take_from(outbox, runs)

    def _take_from(self, outbox: _Outbox, runs: list[Span]) -> None:
        records = outbox.records
        count = len(records)
        if not count:
            return
        key = outbox.key
        first = self._next_seq[key]
        self._next_seq[key] = first + count
        runs.append((key, first, records[:count]))
        # Only the front goes: the session may have appended more since ``count`` was
        # read (it does not take this lock to append); then the outbox stays pending.
        del records[:count]
        if records and not outbox.stale:
            self._pending[key] = outbox

    def submit(self, record: Record) -> None:
        """Queue one encoded record; raises if it is out of order or the writer is down.
        For producers without an outbox (tools, tests): a session appends through
        :meth:`outbox`."""
        key, seq, payload = record
        self.submit_many(key, seq, [payload])

    def submit_many(self, session_key: int, first_seq: int, payloads: Sequence[bytes]) -> None:
        """Queue the records of seqs ``first_seq``, ``first_seq + 1``, ... of one session,
        all or none: raises, queueing nothing, if ``first_seq`` is out of order or the
        writer is down. They commit in one transaction (unless the map must grow).

        A list is kept, not copied (the caller gives it away, see :class:`LogSink`);
        records that continue the session's pending run join it."""
        if not payloads:
            return
        with self._lock:
            if self._state or self._next_seq.get(session_key) != first_seq:
                raise self._rejection(session_key, first_seq)
            self._next_seq[session_key] = first_seq + len(payloads)
            runs = self._runs
            if runs and runs[-1][0] == session_key:  # the session's run goes on (see _runs)
                runs[-1][2].extend(payloads)
                return
            if not runs:
                self._wake.notify()
            runs.append(
                (session_key, first_seq, payloads if type(payloads) is list else list(payloads))
            )

    def flush_async(self, callback: FlushCallback) -> None:
        """Call ``callback(None)`` once everything submitted so far is durable, or
        ``callback(error)`` if it cannot be. Called on the writer thread (or at once)."""
        with self._lock:
            refusal = self._refusal() if self._state != _OPEN else None
            if refusal is None:
                self._callbacks.append(callback)
                if len(self._callbacks) == 1:
                    self._wake.notify()
        if refusal is not None:
            call(callback, refusal)

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything submitted before the call is durable."""
        if _get_ident() == self._thread_id:
            self._refuse_on_writer_thread("flush()")  # raises
        slot = spare.slot
        nested = slot[1]
        if nested:
            # A signal handler's flush while this thread's flush waits: woken by the
            # writer itself, not in a chain. In the interrupted flush's chain it would
            # wait for this very thread to pass the turn on, after the handler returns.
            waiter: Waiter = SoloWaiter()
        else:
            waiter = slot[0]
            if waiter is None:
                waiter = Waiter()
            else:
                slot[0] = None  # in use
        held = waiter.gate
        done = woken = False  # done: woken while waiting (flush_async and wait, inline)
        try:
            slot[1] = nested + 1
            with self._lock:
                if self._state:
                    raise self._refusal()
                callbacks = self._callbacks
                if not callbacks:
                    self._wake.notify()
                callbacks.append(waiter)
            done = held.acquire() if timeout is None else held.acquire(True, timeout)
        finally:  # also if an exception (KeyboardInterrupt) comes once the waiter is queued
            slot[1] = nested
            if done:
                wake(waiter.next)
            else:
                woken = waiter.give_up()
        if not (done or woken):
            raise TimeoutError(f"log flush did not complete within {timeout} s")
        error = waiter.error
        if error is not None:
            raise error
        if done and not nested:
            # Reused by this thread's next flush: _resolve set error and next before the
            # wake, the waker set _woken before releasing _done (held again now). The
            # waker may still hold _guard, which only delays a later wake or give-up of
            # this waiter. One that gave up is never reused: the writer may still hold it.
            waiter.woken = False
            waiter.next = None
            slot[0] = waiter

    def close(self, timeout: float | None = None) -> None:
        """Refuse new work, commit what is queued (resolving its flushes), stop the thread.

        Idempotent; a close interrupted in its wait for the thread (a Ctrl-C) waits
        again when called again. Later ``submit``/``flush`` calls raise
        ``StoreClosedError``.
        """
        self._refuse_on_writer_thread("close()")
        with self._lock:
            if self._state != _CLOSED:
                self._state = _CLOSED
                self._stopping = True
                self._stop_outboxes()  # the last batch takes what they hold; nothing more
                self._wake.notify()
        self._thread.join(timeout)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` began (it refuses new work from then on)."""
        return self._state == _CLOSED

    def statistics(self) -> WriterStatistics:
        return WriterStatistics(
            self._events_written,
            self._commits,
            self._bytes_written,
            self._resizes,
            self._compactions,
            self._full_disk_commits,
        )

    @property
    def disk_full(self) -> DiskFullError | None:
        """Why the last commit was held, while the disk is full; ``None`` otherwise."""
        return self._full

    @property
    def failure(self) -> StorageError | None:
        """The sticky failure, once the writer has failed."""
        return self._failure

    # ------------------------------------------------------------------ helpers

    def _refuse_on_writer_thread(self, what: str) -> None:
        if _get_ident() == self._thread_id:
            raise StorageError(
                f"{what} was called from a flush callback, on the log writer thread, and "
                "would wait for itself forever; use flush_async() or hand the work to "
                "another thread"
            )

    def _check_open(self) -> None:
        if self._state != _OPEN:
            raise self._refusal()

    def _refusal(self) -> StorageError:
        if self._state == _CLOSED:
            return StoreClosedError("the store is closed: open it again to append or flush")
        error = StorageError(f"the log writer failed earlier: {self._failure}")
        error.__cause__ = self._failure
        return error

    def _stop_outboxes(self) -> None:
        """Refuse every outbox's later records (the lock is held)."""
        for outbox in self._outboxes.values():
            outbox.stopped = True

    def _rejection(self, key: int, seq: int) -> StorageError:
        if self._state != _OPEN:
            return self._refusal()
        expected = self._next_seq.get(key)
        if expected is None:
            return StorageError(
                f"record for unknown session key {key}: create or open the session through "
                "its store"
            )
        return StorageError(
            f"record seq {seq} of session key {key} is out of order: the log expects seq "
            f"{expected} next (gaps and reorders are refused)"
        )

    # ------------------------------------------------------------------ thread

    def _journal_end(self) -> tuple[int, int]:
        """The journal's next key and how many frames it holds."""
        if self._dbs.journal is None:
            return 0, 0  # a read-only version 1 store: nothing can be written anyway
        with self._store.reading() as txn:
            cursor = txn.cursor(db=self._dbs.journal)
            end = decode_u64(cursor.key()) + 1 if cursor.last() else 0
            return end, int(txn.stat(self._dbs.journal)["entries"])

    def _run(self) -> None:
        chain: Waiter | None = None  # the end of the last chain of woken flush() callers
        while True:
            if chain is not None:
                chain.wait(GATHER_S)
            with self._lock:
                if self._full is not None:  # held: try again on a flush, a close or in a while
                    deadline = time.monotonic() + FULL_RETRY_S
                    while not (self._callbacks or self._stopping):
                        left = deadline - time.monotonic()
                        if left <= 0 or not self._wake.wait(left):
                            break
                while not (self._runs or self._pending or self._headers or self._callbacks):
                    if self._stopping:
                        break
                    idle = (
                        max(JOURNAL_IDLE_S, self._compact_after - time.monotonic())
                        if self._frames
                        else None
                    )
                    if not self._wake.wait(idle):
                        break  # idle with a journal: compact it now
                runs, self._runs = self._runs, []
                if self._pending:  # with the callbacks: each covers what was appended before
                    self._take(runs)
                headers, self._headers = self._headers, []
                callbacks, self._callbacks = self._callbacks, []
                stop = self._stopping
            batch = self._route(runs)
            journal = self._journal_records + batch.journal_records  # if this batch joined it
            # Idle or closing: compact the whole journal at once. Under load: in a round
            # of steps, one per commit, so that no commit carries a whole compaction.
            # (Closing too: a journal that did not fit stays for the next open to recover.)
            may_compact = time.monotonic() >= self._compact_after
            compacting = (
                (journal > 0 or self._frames > 0)
                and (stop or not (runs or headers or callbacks))
                and may_compact
                and self._compaction_fits(batch)
            )
            if (
                not compacting
                and may_compact
                and self._round_end is None
                and (
                    journal >= JOURNAL_MAX_RECORDS
                    or self._journal_bytes + batch.journal_bytes >= JOURNAL_MAX_BYTES
                )
            ):
                self._round = list(self._store.tails)
                self._round_end = self._counter
            step = (
                NO_STEP
                if compacting or self._round_end is None
                else next_step(self._round, self._store.tails, batch)
            )
            error: StorageError | None = None
            committed = False  # a failure after the commit (the sync) cannot be held
            try:
                if runs or headers or compacting or step.keys or step.last:
                    self._commit(headers, batch, compacting=compacting, step=step)
                committed = True
                if (callbacks or stop) and self._unsynced:
                    self._env.sync(True)
                    self._unsynced = False
            except Exception as err:  # noqa: BLE001 -- any failure fails the flushes, loudly
                full = (
                    None
                    if committed
                    else disk_full(err, self._store.path, "the commit", batch.size, _HELD)
                )
                if full is not None and (compacting or step.keys or step.last):
                    # Compacting needs room appending does not: put it off, try again now.
                    self._put_off_compaction(full)
                    self._hold(runs, headers, callbacks)
                    chain = None
                    continue
                if full is not None and not stop:
                    self._hold(runs, headers, [])
                    self._full = error = full
                else:
                    if full is not None:  # closing: what is held cannot be written
                        err = room_for(self._store.path, "the commit", batch.size, _LOST)
                    error, late = self._fail(err)
                    callbacks.extend(late)
            else:
                if self._full is not None:
                    _log.warning("the disk has room again: the held records are written")
                    self._full = None
            chain = resolve(callbacks, error)
            if (error is not None and error is not self._full) or stop:
                return  # failed, or closed: nothing more can be queued

    def _hold(
        self, runs: list[Span], headers: list[SessionHeader], callbacks: list[FlushCallback]
    ) -> None:
        """Queue a batch that did not fit on the disk again, ahead of what came since
        (the same seqs, in the same order: see ``_runs``)."""
        self._full_disk_commits += 1
        with self._lock:
            self._runs = runs + self._runs
            self._headers = headers + self._headers
            self._callbacks = callbacks + self._callbacks
        if self._full is None and (runs or headers):
            _log.warning("the disk is full: %d records held until there is room", len(runs))

    def _compaction_fits(self, batch: Batch) -> bool:
        """Whether a whole compaction fits on the disk (asked only while the disk has
        been full since the last one: a statvfs per idle compaction otherwise)."""
        if not (self._full_disk_commits or self._store.recovered):
            return True
        size = self._journal_bytes + batch.journal_bytes
        if compaction_fits(self._env, self._store.path, size):
            return True
        self._compact_after = time.monotonic() + COMPACT_RETRY_S
        return False

    def _put_off_compaction(self, full: DiskFullError) -> None:
        """A compaction did not fit: none is tried for :data:`COMPACT_RETRY_S`; a round
        in progress is given up (its frames stay until a later round or a whole
        compaction deletes them, as after a crash)."""
        _log.warning("compacting the journal does not fit on the disk; put off: %s", full)
        self._compact_after = time.monotonic() + COMPACT_RETRY_S
        self._round, self._round_end = [], None

    def _fail(self, err: Exception) -> tuple[StorageError, list[FlushCallback]]:
        if isinstance(err, DiskFullError):
            failure: StorageError = err
        else:
            failure = StorageError(f"the log writer could not commit: {type(err).__name__}: {err}")
            failure.__cause__ = err
        _log.error("log writer failed; later appends and flushes will fail", exc_info=err)
        with self._lock:
            self._failure = failure
            if self._state == _OPEN:
                self._state = _FAILED
            self._stop_outboxes()
            self._pending = {}
            late = self._callbacks
            self._callbacks = []
            self._runs = []
            self._headers = []
        return failure, late

    def _route(self, runs: list[Span]) -> Batch:
        """Split ``runs`` into those written straight to ``events`` and those appended
        to the journal (see :func:`storage.lmdb.compaction.route`)."""
        return route(runs, self._store.tails)

    def _commit(
        self, headers: list[SessionHeader], batch: Batch, *, compacting: bool, step: Step
    ) -> None:
        while True:
            try:
                trimmed = self._write(headers, batch, compacting=compacting, step=step)
                break
            except lmdb.MapFullError:
                self._grow()
        self._commits += 1
        self._events_written += batch.records
        self._bytes_written += batch.size
        self._unsynced = self._sync_on_flush
        # Readers see the new records from here on, before any flush is acknowledged.
        if compacting:
            self._store.tails = {}
            self._compactions += 1
            self._journal_records = self._journal_bytes = 0
            self._round, self._round_end = [], None
            self._frames = 0
            return
        tails = self._store.tails
        stepped = set(step.keys)
        records = batch.journal_records - step.records
        size = batch.journal_bytes - step.size
        if stepped:  # a new dict, as for a whole compaction: see LmdbEnv.chunks
            tails = {key: tail for key, tail in tails.items() if key not in stepped}
        for key, first, payloads in batch.journaled:
            if key in stepped:  # compacted with its tail: in ``events`` already
                records -= len(payloads)
                size -= sum(map(len, payloads))
                continue
            tail = tails.get(key)
            if tail is None:
                tails[key] = Tail(first, payloads)  # the writer's own list (see submit_many)
            else:
                tail.records.extend(payloads)
        self._store.tails = tails
        if batch.journaled:
            self._counter += 1
            self._frames += 1
        self._journal_records += records
        self._journal_bytes += size
        if step.last:
            self._frames -= trimmed
            self._round_end = None
            self._compactions += 1

    def _write(
        self, headers: list[SessionHeader], batch: Batch, *, compacting: bool, step: Step
    ) -> int:
        """One commit: ``headers``, ``batch`` and the ``step`` of a compaction round, or
        ``batch`` and the whole journal (``compacting``). Returns how many journal
        frames a round's last step deleted."""
        dbs = self._dbs
        tracked = self._tracked
        with self._store.writing() as txn:
            if headers:
                next_key = 0
                for header in headers:
                    row = encode_row(tracked[header.key].header_json, -1)
                    txn.put(header.id.encode("utf-8"), row, db=dbs.sessions)
                    txn.put(encode_u64(header.key), header.id.encode("utf-8"), db=dbs.order)
                    next_key = max(next_key, header.key + 1)
                stored = txn.get(NEXT_KEY_KEY, db=dbs.meta)
                if stored is None or decode_u64(stored) < next_key:
                    txn.put(NEXT_KEY_KEY, encode_u64(next_key), db=dbs.meta)
            if compacting:
                spans = [(key, tail.first, tail.records) for key, tail in self._store.tails.items()]
                rows = self._put_events(txn, spans + batch.direct + batch.journaled)
                compact(txn, dbs, rows)
                return 0
            if batch.direct:
                rows = self._put_events(txn, batch.direct)
                txn.cursor(db=dbs.sessions).putmulti(rows)
            if batch.journaled:  # one frame (one value) per commit: see storage.lmdb_env
                frame = encode_frame(batch.journaled)
                if not txn.put(_COUNTER.pack(self._counter), frame, db=dbs.journal, append=True):
                    raise StorageError(
                        f"the journal refused key {self._counter} (the store is damaged?)"
                    )
            if step.keys:
                rows = self._put_events(txn, step_spans(step.keys, batch, self._store.tails))
                txn.cursor(db=dbs.sessions).putmulti(rows)
            if step.last:
                assert self._round_end is not None
                return trim_journal(txn, dbs, self._round_end)
            return 0

    def _put_events(
        self, txn: lmdb.Transaction[bytes], spans: list[Span]
    ) -> list[tuple[bytes, bytes]]:
        """Write ``spans`` to ``events`` (:func:`put_spans`); return the session rows
        that now end there, sorted (one putmulti in key order)."""
        tracked = self._tracked
        rows = [
            (tracked[key].id_bytes, encode_row(tracked[key].header_json, seq))
            for key, seq in put_spans(txn, self._dbs.events, spans).items()
        ]
        rows.sort()
        return rows

    def _grow(self) -> None:
        size = self._store.grow()
        self._resizes += 1
        _log.info("the log map was full; grown to %d bytes", size)
