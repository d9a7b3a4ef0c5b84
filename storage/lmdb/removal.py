"""Removing whole sessions from a store that no process is writing: what a cluster's
reshard does with the sessions it copied to another shard's store.

A log is append-only while a store is open; removal is an offline operation on the
store directory. It takes the writer lock (a process that has the store open for
writing makes it fail; readers are welcome), compacts what a crash left in the journal
(as every writable open does), then deletes in one transaction each session's rows in
``events``, ``sessions`` and ``session-order`` (the layout is
:mod:`storage.lmdb.layout`'s). A crash leaves every session either whole or gone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import lmdb

from storage.errors import StorageError
from storage.lmdb.env import LmdbEnv
from storage.lmdb.layout import Databases, decode_row, encode_u64

__all__ = ["remove_sessions"]

_MAP_SIZE = 64 << 20  # (as Store.open: the map is the file's size if that is larger)


def remove_sessions(path: str | os.PathLike[str], session_ids: Iterable[str]) -> list[str]:
    """Delete each session of ``session_ids`` (its header and every event) from the
    store at ``path``; returns those that were there (an absent one is skipped: a
    removal interrupted and run again finds it gone). Raises :class:`StorageError` if
    the store is open for writing elsewhere, or its journal could not be compacted."""
    ids = list(session_ids)
    env = LmdbEnv(Path(path), readonly=False, map_size=_MAP_SIZE, sync=True)
    try:
        if env.tails:
            raise StorageError(
                f"the journal of the store at {path} could not be compacted (the disk is "
                "full): free some space and run the removal again"
            )
        dbs = env.dbs
        while True:
            try:
                with env.writing() as txn:
                    removed = [sid for sid in ids if _remove(txn, dbs, sid)]
            except lmdb.MapFullError:  # (a delete may split pages before it frees them)
                env.grow()
            else:
                return removed
    finally:
        env.close()


def _remove(txn: lmdb.Transaction[bytes], dbs: Databases, session_id: str) -> bool:
    raw = txn.get(session_id.encode(), db=dbs.sessions)
    if raw is None:
        return False
    prefix = encode_u64(decode_row(raw).header.key)
    cursor = txn.cursor(db=dbs.events)
    if cursor.set_range(prefix):
        while cursor.key()[: len(prefix)] == prefix:
            if not cursor.delete():
                break
    txn.delete(session_id.encode(), db=dbs.sessions)
    txn.delete(prefix, db=dbs.order)
    return True
