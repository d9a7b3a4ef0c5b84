"""Disk space: what a full filesystem does to LMDB, and how the store tells it apart.

LMDB maps ``lock.mdb`` (the reader table) and writes into the map; the file is made
with ``ftruncate``, so it is sparse, and on a full filesystem the first write into a
page that has no block behind it kills the process with SIGBUS. :func:`reserve_lock_file`
gives the file real blocks first (``posix_fallocate``): on a full disk that call fails
with ``ENOSPC``, a typed :class:`~storage.errors.DiskFullError`, instead.

A commit on a full disk fails with ``ENOSPC`` (:class:`lmdb.DiskError`) or, when the
kernel took part of a page write, with ``EIO``: LMDB reports a short write as an I/O
error. :func:`disk_full` reads the filesystem's free space after such a failure to tell
a full disk from a failing one. ``data.mdb`` never has holes: LMDB (without
``MDB_WRITEMAP``) writes it with ``pwrite`` and only reads it through the map.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from stat import S_ISREG
from typing import Final

import lmdb

from storage.errors import DiskFullError, StorageError

__all__ = [
    "LOCK_FILE_BYTES",
    "compaction_fits",
    "disk_full",
    "free_bytes",
    "reserve_lock_file",
    "room_for",
]

# The reader table of ``max_readers=512`` is 32,896 bytes (511 slots of 64 bytes and a
# 192-byte header, LMDB 0.9 on x86-64); a larger file only gives LMDB more slots (it sizes
# the table from the file), a smaller one it would extend sparsely: round up generously.
LOCK_FILE_BYTES: Final = 64 << 10
# After a short write, a disk with less than this free counts as full: the write that
# failed needed more than there was (pages of 4 KiB, the transaction's new tree pages).
_FULL_SLACK: Final = 1 << 20


def free_bytes(path: Path) -> int:
    """Bytes this process may still write on the filesystem that holds ``path``."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


_OPEN_AGAIN: Final = "then open it again"


def compaction_fits(env: lmdb.Environment, path: Path, journal_bytes: int) -> bool:
    """Whether compacting ``journal_bytes`` of journal fits in the room there is: the
    filesystem's free bytes and the unused end of ``data.mdb`` (what an aborted commit
    left written past the last page, which the next commit writes over). Compacting
    writes every record a second time, in blocks, with new tree pages: about twice the
    journal, plus a margin. Asking first spares a doomed attempt that would spend the
    room a freed disk has (the file grows before the commit fails)."""
    try:
        used = (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])
        slack = max(0, (path / "data.mdb").stat().st_size - used)
        room = free_bytes(path) + slack
    except OSError:
        return True  # cannot tell: try, and put it off if it does not fit
    return room >= 2 * journal_bytes + _FULL_SLACK


def room_for(path: Path, what: str, needed: int, then: str = _OPEN_AGAIN) -> DiskFullError:
    """The error for a write of about ``needed`` bytes that the disk holding ``path``
    has no room for; ``then`` says what happens (or to do) once there is room."""
    try:
        free = free_bytes(path)
    except OSError:
        free = 0
    need = f", and {what} needs about {needed:,}" if needed else f" for {what}"
    return DiskFullError(
        f"no space left on the filesystem that holds the store at {path}: {free:,} bytes "
        f"free{need}; free some space (or move the store to a larger disk), {then}",
        free,
        needed,
    )


def disk_full(
    err: BaseException, path: Path, what: str, needed: int, then: str = _OPEN_AGAIN
) -> DiskFullError | None:
    """The :class:`DiskFullError` that ``err`` (raised by a write of about ``needed``
    bytes) stands for, or ``None`` if it is not a full disk."""
    if isinstance(err, lmdb.DiskError) or (
        isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)
    ):
        return room_for(path, what, needed, then)
    if isinstance(err, lmdb.Error) and "Input/output error" in str(err):
        try:
            free = free_bytes(path)
        except OSError:
            return None
        if free < max(2 * needed, _FULL_SLACK):  # a short write on a (nearly) full disk
            return room_for(path, what, needed, then)
    return None


def reserve_lock_file(path: Path, *, readonly: bool) -> None:
    """Give ``path/lock.mdb`` real blocks before LMDB maps it (see the module
    docstring). A read-only open where the file cannot be made (a read-only directory)
    leaves it to LMDB, which then opens without a lock file."""
    lock = path / "lock.mdb"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o600)
    except OSError as err:
        if readonly and err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return
        full = disk_full(err, path, "the lock file", LOCK_FILE_BYTES)
        if full is not None:
            raise full from err
        raise
    try:
        stat = os.fstat(fd)
        if not S_ISREG(stat.st_mode):
            raise StorageError(
                f"{lock} is not a regular file: a corral store's lock.mdb is LMDB's; "
                "remove what is there, or choose another directory"
            )
        size = stat.st_size
        os.posix_fallocate(fd, 0, max(size, LOCK_FILE_BYTES))
    except OSError as err:
        if err.errno == errno.EOPNOTSUPP:
            return  # a filesystem without fallocate: LMDB's own (sparse) file it is
        full = disk_full(err, path, "the lock file", LOCK_FILE_BYTES)
        if full is not None:
            raise full from err
        raise
    finally:
        os.close(fd)
