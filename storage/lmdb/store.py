"""The LMDB session store: one environment directory holding every session log.

Layout (see :mod:`storage.lmdb.layout`): ``events`` (session key + seq → record bytes),
``journal`` (append counter → records not yet compacted into ``events``), ``sessions``
(id → last compacted seq + header), ``session-order`` (session key → id) and ``meta``
(schema version, next session key). One :class:`~storage.lmdb.writer.LogWriter` thread
owns all writes; readers use short read transactions and never block it, and see
the journal's records merged with ``events``.
Another process may open the same directory ``readonly=True`` while this one writes;
a second *writing* process is refused (an advisory lock on ``writer.lock``).

Reads have journal semantics: they see what is durable (committed); an unknown session
reads as empty with highest seq 0 (:meth:`Store.stats` tells the two apart).

A little over 500 lines, one piece: :class:`Store` is the facade whose methods are the
store's verbs (open, sessions, read, fork, import/export, flush, close), each a short
composition of the environment, the writer and sessions.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Final, Literal, Self

import msgspec

from storage import export
from storage.aio import wait_durable
from storage.codec import Codec, EventTypes
from storage.errors import (
    DiskFullError,
    DuplicateSessionError,
    InvalidEventError,
    LogCorruptError,
    StorageError,
    StoreClosedError,
    UnknownSessionError,
)
from storage.events import Event, IgnoredRecord, SessionEndSeed
from storage.lmdb.env import LmdbEnv
from storage.lmdb.layout import SessionRow
from storage.lmdb.writer import LogWriter
from storage.projections import derive_messages, fork_prefix
from storage.records import FlushCallback, Record, SessionHeader
from storage.session import Session, epoch_ms
from storage.session_ids import check_session_id, new_session_id, new_session_ids
from storage.timeouts import check_timeout

__all__ = ["Durability", "SessionStats", "Store", "StoreStatistics"]

DEFAULT_PATH: Final = "./.corral/"
_LOAD_WINDOW: Final = 4096  # seqs decoded at a time when a session is opened

Durability = Literal["write-ahead", "turn", "none"]
_DURABILITIES: Final = ("write-ahead", "turn", "none")


class StoreStatistics(msgspec.Struct, frozen=True):
    """A snapshot of a store's counters; write counters cover this process only."""

    sessions: int
    events_written: int
    commits: int
    bytes_written: int
    map_size: int
    resizes: int
    compactions: int = 0  # journal compactions (see storage.lmdb.compaction)


class SessionStats(msgspec.Struct, frozen=True):
    """One session's durable size; ``last_seq`` is ``None`` while it has no events."""

    session_id: str
    event_count: int
    last_seq: int | None


class _ReadOnlySink:
    """The sink of sessions opened from a read-only store: appending is refused."""

    def submit(self, record: Record) -> None:
        raise StorageError("this store was opened read-only: open it writable to append")

    def submit_many(self, session_key: int, first_seq: int, payloads: Sequence[bytes]) -> None:
        raise StorageError("this store was opened read-only: open it writable to append")

    def flush_async(self, callback: FlushCallback) -> None:
        callback(None)

    def flush(self, timeout: float | None = None) -> None:
        return None


class Store:
    """A directory of durable session logs. Open with :meth:`open`; close it (or use it
    as a context manager) to flush and stop its writer thread. Thread-safe."""

    def __init__(
        self,
        lmdb_env: LmdbEnv,
        *,
        durability: Durability,
        codec: Codec,
        clock: Callable[[], int],
    ) -> None:
        self.path: Path = lmdb_env.path
        self.durability: Durability = durability
        self.codec = codec
        self.event_types: EventTypes = codec.types
        self.readonly = lmdb_env.readonly
        self._db = lmdb_env
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False  # close() began: every other method refuses
        self._released = False  # a close() let go of the writer and the environment
        self._releasing = False  # a close() is letting go of them
        self._headers: dict[str, SessionHeader] = {}  # writable stores: every session
        self._writer: LogWriter | None = None
        self._sink: LogWriter | _ReadOnlySink = _ReadOnlySink()
        self._next_key = 0
        if self.readonly:
            return
        rows = lmdb_env.rows()
        self._next_key = lmdb_env.next_session_key()
        self._writer = self._sink = LogWriter(lmdb_env, sync_on_flush=durability == "none")
        try:
            for row in rows:
                self._headers[row.header.id] = row.header
                self._writer.track(row.header, next_seq=row.last_seq + 1, new=False)
        except BaseException:  # (a Ctrl-C): open (which closes the environment) stops it
            self._writer.close()
            raise

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        durability: Durability = "write-ahead",
        max_event_bytes: int = 4 << 20,
        map_size: int = 64 << 20,
        event_types: EventTypes | None = None,
        readonly: bool = False,
        clock: Callable[[], int] | None = None,
    ) -> Self:
        """Open the store directory at ``path`` (default ``./.corral/``), creating it with
        owner-only permissions (``0o700``/``0o600``) unless ``readonly``.

        ``"write-ahead"`` and ``"turn"`` commit with a sync; ``"none"`` does not, and
        only an explicit flush (which syncs) is durable. The map grows by itself.
        Raises :class:`StorageError` for a path that is not a store (or unusable) and
        :class:`SchemaVersionError` for a store of another schema version.
        """
        if durability not in _DURABILITIES:
            raise ValueError(f"durability must be one of {_DURABILITIES}, not {durability!r}")
        types = event_types if event_types is not None else EventTypes.default()
        codec = Codec(types, max_event_bytes=max_event_bytes)
        where = Path(path if path is not None else DEFAULT_PATH)
        lmdb_env = LmdbEnv(where, readonly=readonly, map_size=map_size, sync=durability != "none")
        try:
            return cls(lmdb_env, durability=durability, codec=codec, clock=clock or epoch_ms)
        except BaseException:
            lmdb_env.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Flush, stop the writer thread and close the environment. Idempotent; any
        later call of another method raises :class:`StoreClosedError`. Raises the
        writer's failure, if it failed, after closing.

        A close that was interrupted (a Ctrl-C while it waits for the last flush, say)
        is finished by the next call, which lets go of the writer thread, the
        environment and the writer lock (the store can be opened again); only a close
        that got that far is done. A call while another thread's close runs returns."""
        with self._lock:
            if self._released or self._releasing:
                return
            self._closed = True
            self._releasing = True
        try:
            failure: StorageError | None = None
            if self._writer is not None:
                if not self._writer.closed:
                    try:
                        self._writer.flush()
                    except StorageError as err:
                        failure = err
                self._writer.close()
                if isinstance(failure, DiskFullError) and self._writer.failure is not None:
                    failure = self._writer.failure  # what the close's last batch could not write
            self._db.close()  # waits for readers in progress; lets go of the writer lock
            self._released = True
        finally:
            with self._lock:
                self._releasing = False
        if failure is not None:
            raise failure

    # ------------------------------------------------------------------ registry

    def register_event_type(
        self, name: str, data_type: type[msgspec.Struct] | None = None, *, ignorable: bool = False
    ) -> None:
        self.event_types.register(name, data_type, ignorable=ignorable)

    def create_session(self, session_id: str | None = None) -> Session:
        """A new empty session; its header is durable at the next flush. The session
        keeps only its not-yet-durable events in memory and reads the rest from here."""
        header = self._new_header(session_id)
        return Session(
            header,
            sink=self._sink,
            codec=self.codec,
            clock=self._clock,
            reader=_Reader(self, header.id),
        )

    def create_sessions(self, count: int) -> list[Session]:
        """``count`` new empty sessions, as ``count`` calls of :meth:`create_session`
        would make them, their headers handed to the writer at once (durable at the
        next flush, in one transaction)."""
        self._check_writable()
        assert self._writer is not None
        ids = new_session_ids(count, self._clock)
        with self._lock:
            taken = self._headers
            first = self._next_key
            headers: list[SessionHeader] = []
            chosen: set[str] = set()
            for fresh in ids:
                sid = fresh
                while sid in taken or sid in chosen:  # (48 random bits: all but never)
                    sid = new_session_id(self._clock)
                chosen.add(sid)
                header = SessionHeader(id=sid, key=first + len(headers), created=self._clock())
                headers.append(header)
            self._writer.track_new(headers)
            self._next_key = first + len(headers)
            for header in headers:
                taken[header.id] = header
        return [
            Session(
                header,
                sink=self._sink,
                codec=self.codec,
                clock=self._clock,
                reader=_Reader(self, header.id),
            )
            for header in headers
        ]

    def open_session(self, session_id: str) -> Session:
        """The session with every durable event (and everything appended before).

        Its projections are built while the events stream from the store, a window at
        a time; the session keeps none of them in memory (it reads them back here)."""
        self._check_open()
        if self._writer is not None:
            self._writer.flush()
        header = self._header(session_id)
        events, last = self._stream(header)
        if self._writer is not None:
            self._writer.track(header, next_seq=last + 1, new=False)
        return Session(
            header,
            sink=self._sink,
            codec=self.codec,
            clock=self._clock,
            events=events,
            last_seq=last,
            reader=_Reader(self, header.id),
        )

    def has_session(self, session_id: str) -> bool:
        self._check_open()
        return session_id in self._headers or self._db.row(session_id) is not None

    def sessions(self) -> list[SessionHeader]:
        """Every session's header in creation order (for a writable store, including
        sessions created here and not yet flushed)."""
        self._check_open()
        if not self.readonly:
            with self._lock:
                return sorted(self._headers.values(), key=lambda header: header.key)
        return [row.header for row in self._db.rows()]

    # ------------------------------------------------------------------ reading

    def read(
        self,
        session_id: str,
        *,
        lower: int = 0,
        upper: int | None = None,
        limit: int | None = None,
        include_ignored: bool = False,
    ) -> list[Event]:
        """Durable events with ``lower <= seq <= upper`` (inclusive), at most ``limit``;
        an unknown session reads as ``[]``.

        Records of ignorable types that this store's registry does not know are
        skipped (code that does not know a plugin's type is never handed its events),
        so the seqs read may have gaps. ``include_ignored=True`` accounts for them
        instead: each reads as a placeholder event of its type, seq and time, whose
        data is an :class:`~storage.events.IgnoredRecord` holding the record's bytes;
        every seq of the range then has its event (what checking or copying a whole
        log needs)."""
        self._check_open()
        row = self._db.row(session_id)
        if row is None:
            return []
        if limit is None:
            return self._decode(row, lower, upper, include_ignored)
        events: list[Event] = []
        stop = row.last_seq if upper is None else min(upper, row.last_seq)
        while len(events) < limit and lower <= stop:
            end = min(stop, lower + limit - len(events) - 1)
            events += self._decode(row, lower, end, include_ignored)
            lower = end + 1
        return events

    def last_seq(self, session_id: str) -> int:
        """The highest durable seq, ``0`` for an unknown or empty session (journal
        semantics: ``0`` is also a one-event session; :meth:`stats` disambiguates)."""
        self._check_open()
        row = self._db.row(session_id)
        return max(row.last_seq, 0) if row is not None else 0

    def stats(self, session_id: str) -> SessionStats:
        """The durable event count of a session; raises UnknownSessionError if absent."""
        self._check_open()
        row = self._db.row(session_id)
        if row is None:
            raise UnknownSessionError(f"no durable session {session_id!r} in {self.path}")
        last = row.last_seq if row.last_seq >= 0 else None
        return SessionStats(session_id, row.last_seq + 1, last)

    @property
    def disk_full(self) -> DiskFullError | None:
        """Why the last commit did not fit, while the disk stays full (the writer holds
        what is appended and retries); ``None`` otherwise, and for a read-only store."""
        return self._writer.disk_full if self._writer is not None else None

    def statistics(self) -> StoreStatistics:
        self._check_open()
        writer = self._writer.statistics() if self._writer is not None else None
        sessions = len(self._headers) if not self.readonly else len(self._db.rows())
        return StoreStatistics(
            sessions=sessions,
            events_written=writer.events_written if writer else 0,
            commits=writer.commits if writer else 0,
            bytes_written=writer.bytes_written if writer else 0,
            map_size=self._db.map_size(),
            resizes=writer.resizes if writer else 0,
            compactions=writer.compactions if writer else 0,
        )

    # ------------------------------------------------------------------ fork, export

    def fork(self, source_id: str, boundary: int, new_id: str | None = None) -> Session:
        """A new session seeded with ``source_id``'s events up to ``boundary`` (inclusive)
        and a ``session/end-seed`` event citing the source.

        The seed keeps the source's seqs (0..``boundary``) and so every seq its events
        cite. Records of ignorable types this store does not know are copied verbatim
        (see :class:`~storage.events.IgnoredRecord`); the child's session object skips
        them as a reopened session does. Atomic: the header, the seed and the
        ``session/end-seed`` commit in one transaction, and only once the seed has
        passed the checks a session applies to its history, so a fork that fails
        (here or in a crash) leaves no child."""
        self._check_writable()
        assert self._writer is not None
        self._writer.flush()
        source = self._header(source_id)
        seed = fork_prefix(self._load(source, include_ignored=True)[0], boundary)
        payloads: list[bytes] = []
        known: list[Event] = []
        for index, event in enumerate(seed):
            if event.seq != index:  # Invariant: a whole log read with placeholders
                raise LogCorruptError(
                    f"session {source_id!r}: seq {event.seq} is read at position {index}; "
                    "the log is damaged: restore it from a backup or an export"
                )
            if type(event.data) is IgnoredRecord:
                payloads.append(event.data.raw)
            else:
                payloads.append(self.codec.encode(event))
                known.append(event)
        try:  # what the child's session checks when it loads the seed, before any write
            derive_messages(known)
        except InvalidEventError as err:
            raise LogCorruptError(f"session {source_id!r} cannot be forked: {err}") from err
        time = max((event.time for event in seed), default=0)
        end = Event(
            "session/end-seed",
            len(seed),
            max(self._clock(), time),  # time never goes backwards in a log
            SessionEndSeed(source_session=source_id, source_seq=boundary),
        )
        payloads.append(self.codec.encode(end))
        header = self._new_header(
            new_id,
            parent=source_id,
            fork_seq=boundary,
            seed_length=len(payloads),
            payloads=payloads,
        )
        self._writer.flush()  # the seed is readable before the session drops it from memory
        return Session(
            header,
            sink=self._sink,
            codec=self.codec,
            clock=self._clock,
            events=[*known, end],
            last_seq=end.seq,
            reader=_Reader(self, header.id),
        )

    def export_jsonl(self, session_id: str, out: BinaryIO) -> int:
        """Write the session as JSONL (a header line, then each record's stored bytes);
        returns the number of events written."""
        self._check_open()
        if self._writer is not None:
            self._writer.flush()
        header = self._header(session_id)
        row = self._db.row(session_id)
        chunks = self._db.chunks(row) if row is not None else iter(())
        return export.write_jsonl(out, header, (value for _, part in chunks for value in part))

    def import_jsonl(self, inp: BinaryIO, *, session_id: str | None = None) -> Session:
        """Create a session from an export under ``session_id`` (default: the exported
        id, or a new one). Every record is validated before anything is written; the
        stored records are byte-identical to the file's lines, and the header keeps the
        export's ``created`` and lineage. A session that breaks the log's invariants
        (see :mod:`storage.invariants`; an open tail turn is allowed, a resume repairs
        it) is refused as a whole, naming the first violation. Durable when this
        returns, and atomic: the
        header and every record go to the writer at once and commit in one transaction,
        so a crash leaves the session either absent or whole."""
        self._check_writable()
        log = export.read_jsonl(inp, self.codec)
        source = log.header
        header = self._new_header(
            session_id if session_id is not None else (source.id if source else None),
            parent=source.parent if source else None,
            fork_seq=source.fork_seq if source else None,
            seed_length=source.seed_length if source else 0,
            created=source.created if source else None,
            payloads=log.payloads,
        )
        assert self._writer is not None
        self._writer.flush()  # the records are readable before the session drops them
        return Session(
            header,
            sink=self._sink,
            codec=self.codec,
            clock=self._clock,
            events=log.events,
            last_seq=len(log.payloads) - 1,
            reader=_Reader(self, header.id),
        )

    # ------------------------------------------------------------------ durability

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything appended (to any session) before the call is durable."""
        timeout = check_timeout(timeout)
        self._check_open()
        self._sink.flush(timeout)

    def flush_async(self, callback: FlushCallback) -> None:
        self._check_open()
        self._sink.flush_async(callback)

    async def aflush(self) -> None:
        """:meth:`flush` for asyncio code (see :meth:`Session.aflush`)."""
        await wait_durable(self.flush_async)

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self.path} is closed; open it again")

    def _check_writable(self) -> None:
        self._check_open()
        if self._writer is None:
            raise StorageError(f"the store at {self.path} was opened read-only")

    def _new_header(
        self,
        session_id: str | None,
        *,
        parent: str | None = None,
        fork_seq: int | None = None,
        seed_length: int = 0,
        created: int | None = None,
        payloads: Sequence[bytes] = (),
    ) -> SessionHeader:
        self._check_writable()
        assert self._writer is not None
        if session_id is None:
            sid = new_session_id(self._clock)  # 23 hex digits: nothing to check
        else:
            sid = check_session_id(session_id, max_key_bytes=self._db.env.max_key_size())
        with self._lock:
            if sid in self._headers:
                raise DuplicateSessionError(f"a session {sid!r} already exists in {self.path}")
            header = SessionHeader(
                id=sid,
                key=self._next_key,
                created=self._clock() if created is None else created,
                parent=parent,
                fork_seq=fork_seq,
                seed_length=seed_length,
            )
            self._writer.track(header, next_seq=0, new=True, seed=payloads)
            self._next_key += 1
            self._headers[sid] = header
        return header

    def _header(self, session_id: str) -> SessionHeader:
        header = self._headers.get(session_id)
        if header is None:
            row = self._db.row(session_id)
            if row is None:
                raise UnknownSessionError(
                    f"no session {session_id!r} in {self.path}; create it with create_session()"
                )
            header = row.header
        return header

    def _load(
        self, header: SessionHeader, *, include_ignored: bool = False
    ) -> tuple[list[Event], int]:
        """Every durable event of a session (checked contiguous from 0); its last seq."""
        events, last = self._stream(header, include_ignored=include_ignored)
        return list(events), last

    def _stream(
        self, header: SessionHeader, *, include_ignored: bool = False
    ) -> tuple[Iterator[Event], int]:
        """:meth:`_load` as an iterator that reads ``_LOAD_WINDOW`` seqs at a time."""
        try:
            last = self.stats(header.id).last_seq
        except UnknownSessionError:
            last = None
        if last is None:
            return iter(()), -1

        def windows(stop: int) -> Iterator[Event]:
            for lower in range(0, stop + 1, _LOAD_WINDOW):
                upper = min(stop, lower + _LOAD_WINDOW - 1)
                yield from self.read(
                    header.id, lower=lower, upper=upper, include_ignored=include_ignored
                )

        return windows(last), last

    def _decode(
        self,
        row: SessionRow,
        lower: int = 0,
        upper: int | None = None,
        include_ignored: bool = False,
    ) -> list[Event]:
        decode_run = self.codec.decode_run
        session_id = row.header.id
        events: list[Event] = []
        for first, values in self._db.chunks(row, lower, upper):
            events += decode_run(
                values, first_seq=first, session_id=session_id, include_ignored=include_ignored
            )
        return events


class _Reader:
    """``store.read`` bound to one session (a session's :class:`DurableReader`): one
    small object where a ``partial`` of a bound method was four (~200 bytes more of
    every live agent)."""

    __slots__ = ("session_id", "store")

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id

    def __call__(self, *, lower: int, upper: int) -> list[Event]:
        return self.store.read(self.session_id, lower=lower, upper=upper)
