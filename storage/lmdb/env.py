"""Opening a store's LMDB environment: the directory and its writer lock, the
databases, the schema version (an older store is migrated, a newer one refused), the
recovery of what a crash left in the journal; and its transactions (a
:class:`ResizeLock` shared by read transactions, because growing the map invalidates
every transaction of the process). The layout is :mod:`storage.lmdb.layout`'s; the
reads are :class:`storage.lmdb.reads.Reads`, this class's base.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import lmdb

from storage.errors import LogCorruptError, SchemaVersionError, StorageError, StoreClosedError
from storage.lmdb.compaction import compact
from storage.lmdb.layout import (
    EVENTS_DB,
    JOURNAL_DB,
    META_DB,
    MIN_MAP_SIZE,
    NEXT_KEY_KEY,
    OLDER_VERSIONS,
    ORDER_DB,
    PER_RECORD_VERSION,
    ROW_PREFIX,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    SESSIONS_DB,
    Databases,
    Span,
    Tail,
    Tails,
    decode_row,
    decode_u64,
    encode_row,
    encode_u64,
    put_spans,
)
from storage.lmdb.reads import Reads, scan_journal
from storage.lmdb.space import LOCK_FILE_BYTES, compaction_fits, disk_full, reserve_lock_file

__all__ = ["DAMAGE", "LmdbEnv", "ResizeLock", "writer_pid"]

# LMDB's errors for pages that are not what they should be (a damaged file); a read
# transaction that met one may answer its next call with MDB_BAD_TXN (seen in the bit
# flip soak: a flipped page of the creation-order index or of meta).
DAMAGE: Final = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.BadTxnError,
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


class LmdbEnv(Reads):
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
        # The session rows (id, header JSON) of the sessions in ``tails`` at open: a
        # journal a crash left that did not fit to be compacted (see _recover), for the
        # writer to compact later.
        self.recovered: dict[int, tuple[bytes, bytes]] = {}
        self._stored_version: bytes | None = None  # as meta holds it (see _open_dbs)
        self._closed = False
        self._lock_fd: int | None = None
        existed = _check_directory(path, readonly=readonly)
        if not readonly:
            self._lock_fd = _lock_writer(path)
        try:
            reserve_lock_file(path, readonly=readonly)
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
            full = disk_full(err, path, "a new store", _NEW_STORE_BYTES)
            if full is not None:
                raise full from err
            if isinstance(err, (lmdb.Error, OSError)):
                raise StorageError(f"cannot open the store at {path}: {err}") from err
            raise
        try:
            _check_size(self.env, path)
            self.env.reader_check()  # free reader slots left by processes that died
            self.dbs = self._open_dbs(existed=existed)
            if not readonly:
                self._recover()
        except DAMAGE as err:
            self.env.close()
            self._unlock()
            raise LogCorruptError(f"the store at {path} is damaged ({err}): restore it") from err
        except BaseException as err:
            self.env.close()
            self._unlock()
            full = disk_full(err, path, "opening the store", _NEW_STORE_BYTES)
            if full is not None:
                raise full from err
            if isinstance(err, lmdb.Error):
                raise StorageError(f"cannot open the store at {path}: {err}") from err
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
        if stored not in (None, current, *OLDER_VERSIONS):
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
        return self._stored_version != PER_RECORD_VERSION

    def _recover(self) -> None:
        """Compact what a crash left in the journal, so that :attr:`tails` (empty) is
        exact for the writer that is about to start; an older store is stamped with the
        current version in the same transaction (its journal read in its own format).

        A compaction that does not fit on the disk (asked first, see
        :func:`~storage.lmdb.space.compaction_fits`, or found when the commit fails) is
        left to the writer: the journal's records go into :attr:`tails` and their
        sessions' rows into :attr:`recovered`, as if the writer had journaled them."""
        current = str(SCHEMA_VERSION).encode("ascii")
        keep = False
        while True:
            try:
                with self.writing() as txn:
                    self._compact_journal(txn, keep=keep)
                    if self._stored_version != current:
                        txn.put(SCHEMA_VERSION_KEY, current, db=self.dbs.meta)
            except lmdb.MapFullError:
                self.grow()
            except lmdb.Error as err:
                full = disk_full(err, self.path, "recovering the journal", 0)
                if full is None:
                    raise
                if keep or not self.framed:  # (a version 2 journal must be compacted)
                    raise full from err
                keep = True  # try again, leaving the journal to the writer
            else:
                self._stored_version = current
                return

    def _compact_journal(self, txn: lmdb.Transaction[bytes], *, keep: bool) -> None:
        """Compact the whole journal in ``txn``. A session's journaled records up to its
        row's last seq are in ``events`` already (a compaction round that a crash
        interrupted moved them there): only those after it are compacted. With ``keep``,
        or when the compaction does not fit on the disk, they are kept in
        :attr:`tails` instead (see :meth:`_recover`)."""
        dbs = self.dbs
        self.tails, self.recovered = {}, {}
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
            rows[key] = (session_id, raw[ROW_PREFIX.size :])
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
        size = sum(len(record) for _, _, records in spans for record in records)
        if self.framed and (keep or not compaction_fits(self.env, self.path, size)):
            self.tails = {key: Tail(first, list(records)) for key, first, records in spans}
            self.recovered = {key: rows[key] for key in self.tails}
            return
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
                    except DAMAGE as err:
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

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None


# What a new store writes at its first open: the lock file, two meta pages, the roots.
_NEW_STORE_BYTES: Final = LOCK_FILE_BYTES + (8 << 10) * 4

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
        data = path / "data.mdb"
        existed = data.exists()
        if existed and not data.is_file():  # a FIFO would hang LMDB's read of it forever
            raise StorageError(
                f"{data} is not a regular file, so {path} is not a corral store: choose "
                "another directory (or restore the store from a backup or an export)"
            )
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


def writer_pid(path: Path) -> int | None:
    """The process id the store's last writer recorded in its ``writer.lock`` (None: no
    writer ever opened it, or unreadable). For readers in other processes (``corral
    top``): that process may have ended since; whether it still runs is the caller's to
    ask. Reads the file only, never takes the lock (a writer starting then is not
    disturbed)."""
    try:
        return int((path / "writer.lock").read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def _lock_holder(fd: int) -> str:
    """``this process`` or ``process PID``, from what the holder wrote into the lock file."""
    try:
        pid = int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return "another runtime or store (this or another process)"
    return "this process" if pid == os.getpid() else f"process {pid}"
