"""``corral bench --fresh``: wiping a store before a run, and only a corral store
(:func:`wipe_store`), or a sharded one shard by shard (:func:`wipe_sharded_store`)."""

from __future__ import annotations

from pathlib import Path

from storage import SchemaVersionError, StorageError, Store

from .errors import CliError
from .options import STORE_FILES

__all__ = ["wipe_sharded_store", "wipe_store"]


def wipe_store(path: Path) -> None:
    """Delete the corral store at ``path`` (its files; the directory stays).

    Refuses anything that is not clearly a corral store: a file, a directory holding other
    files, an LMDB environment that is not a store, or a store another process has open
    for writing. A missing or empty directory is left as it is."""
    if not path.exists():
        return
    if not path.is_dir():
        raise CliError(f"--fresh refuses to wipe {path}: it is not a directory")
    names = {entry.name for entry in path.iterdir()}
    if not names:
        return
    strangers = sorted(names - STORE_FILES)
    if strangers or "data.mdb" not in names:
        shown = ", ".join(strangers[:3]) or "no data.mdb"
        raise CliError(f"--fresh refuses to wipe {path}: it is not a corral store ({shown})")
    try:
        Store.open(path, durability="none").close()  # takes the writer lock: nobody writes
    except SchemaVersionError:
        pass  # a corral store of another version, and nobody held its writer lock
    except StorageError as err:
        raise CliError(f"--fresh refuses to wipe {path}: {err}") from err
    for name in names:
        (path / name).unlink()


def wipe_sharded_store(path: Path) -> None:
    """Delete the sharded store at ``path`` (``corral bench --shards --fresh``): every
    shard's store (each wiped as :func:`wipe_store` wipes one), its agent journal and
    the layout file; a single store there is wiped as one (the shards then make theirs)."""
    from runtime.cluster.layout import (  # noqa: PLC0415 - the sharded layout's reader
        LAYOUT_FILE,
        is_sharded,
        journal_path,
        layout_shards,
        shard_path,
    )

    if not is_sharded(path):
        wipe_store(path)
        return
    shards = layout_shards(path) or 0
    for index in range(shards):
        shard = shard_path(path, index)
        wipe_store(shard)
        if shard.is_dir():
            shard.rmdir()
        journal_path(path, index).unlink(missing_ok=True)
    (path / LAYOUT_FILE).unlink()
