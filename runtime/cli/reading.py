"""Opening a store read-only for a ``corral log`` command: a plain store, or, for one
session, the shard of a cluster's store that holds it.

A read-only open never blocks a writer in another process: every read is a short LMDB
read transaction (see :mod:`runtime.cli.log`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.cluster.layout import is_sharded, stores_for
from storage import Store

from .errors import CliError
from .listing import resolve_session, resolve_session_in
from .transcript import plural

__all__ = ["reading", "reading_session"]


@contextmanager
def reading(path: Path) -> Iterator[Store]:
    """The store at ``path``, open read-only (a cluster's store is refused: give a shard's)."""
    if is_sharded(path):
        raise CliError(
            f"{path} is a cluster's store (one store per shard): give one shard's, "
            f"--store {path / 'shard-0'}"
        )
    if not path.exists():
        raise CliError(
            f"no corral store at {path}: it does not exist (give the store with --store)"
        )
    store = Store.open(path, readonly=True)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def reading_session(path: Path, text: str) -> Iterator[tuple[Store, str]]:
    """The store that holds the session ``text`` names (its id or a unique prefix of
    it), open, and that session's id. On a cluster's store an id is looked up in the
    shard it routes to, a prefix in every shard's store."""
    if not is_sharded(path):
        with reading(path) as store:
            yield store, resolve_session(store, text)
        return
    routed = stores_for(path, text)[0]  # where the session of this exact id lives
    if text and (routed / "data.mdb").exists():
        with reading(routed) as store:
            found = store.has_session(text)
            if found:
                yield store, text
        if found:
            return
    with contextlib.ExitStack() as stack:
        shards = [stack.enter_context(reading(shard)) for shard in stores_for(path)]
        where = f"the cluster store at {path} ({plural(len(shards), 'shard store')})"
        yield resolve_session_in(shards, text, where)
