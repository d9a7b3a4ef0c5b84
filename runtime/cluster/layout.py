"""Where a cluster keeps its files, and how a reader finds them.

```
<path>/cluster.json        {"shards": N}: the store is reopened with the shape it was made with
<path>/reshard.json        {"from": N, "to": M}: a reshard under way (runtime.cluster.reshard)
<path>/shard-<k>/          shard k's ordinary corral LMDB store (data.mdb, lock.mdb)
<path>/shard-<k>.agents    shard k's agent journal (see runtime.cluster.journal)
```

Every path is on the node that runs shard ``k`` (its local disk), or on a filesystem all
nodes share. :func:`shard_stores` is what ``corral log`` uses to read a sharded store as
one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import ClusterLayoutError

__all__ = [
    "LAYOUT_FILE",
    "RESHARD_FILE",
    "claim_layout",
    "is_sharded",
    "journal_path",
    "layout_shards",
    "reshard_plan",
    "shard_path",
    "shard_stores",
    "stores_for",
    "write_json",
]

LAYOUT_FILE = "cluster.json"
RESHARD_FILE = "reshard.json"


def shard_path(root: str | os.PathLike[str], index: int) -> Path:
    return Path(root) / f"shard-{index}"


def journal_path(root: str | os.PathLike[str], index: int) -> Path:
    return Path(root) / f"shard-{index}.agents"


def is_sharded(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` holds a cluster's shards rather than one store."""
    return (Path(root) / LAYOUT_FILE).is_file()


def _read_shards(root: Path) -> int:
    try:
        shards = json.loads((root / LAYOUT_FILE).read_text(encoding="utf-8"))["shards"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ClusterLayoutError(
            f'{root / LAYOUT_FILE} is unreadable ({err}); it should read {{"shards": N}}'
        ) from err
    if type(shards) is not int or shards < 1:
        raise ClusterLayoutError(f"{root / LAYOUT_FILE}: shards must be an int >= 1")
    return shards


def write_json(path: Path, value: object) -> None:
    """Replace the file at ``path`` with ``value`` as JSON, atomically and durably."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    with scratch.open("w", encoding="utf-8") as f:
        f.write(json.dumps(value) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(scratch, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def reshard_plan(root: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(from, to) of the reshard under way at ``root``; None when there is none."""
    path = Path(root) / RESHARD_FILE
    if not path.is_file():
        return None
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
        before, after = plan["from"], plan["to"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ClusterLayoutError(
            f'{path} is unreadable ({err}); it should read {{"from": N, "to": M}}'
        ) from err
    if not all(type(n) is int and n >= 1 for n in (before, after)):
        raise ClusterLayoutError(f"{path}: from and to must be ints >= 1")
    return before, after


def _check_no_reshard(top: Path) -> None:
    plan = reshard_plan(top)
    if plan is not None:
        raise ClusterLayoutError(
            f"the cluster store at {top} has an unfinished reshard from {plan[0]} to "
            f"{plan[1]} shards (it was interrupted): finish it with corral log reshard "
            f"--store {top} --shards {plan[1]} (or Cluster.open(..., shards={plan[1]}, "
            "reshard=True))"
        )


def layout_shards(root: str | os.PathLike[str]) -> int | None:
    """The shard count the cluster store at ``root`` was made with (None: none yet)."""
    top = Path(root)
    return _read_shards(top) if is_sharded(top) else None


def claim_layout(root: str | os.PathLike[str], shards: int) -> None:
    """Record that the store at ``root`` has ``shards`` shards, or check that it has:
    agent ids are routed by the shard count, so a store is never reopened with another."""
    top = Path(root)
    top.mkdir(parents=True, exist_ok=True)
    if is_sharded(top):
        _check_no_reshard(top)
        found = _read_shards(top)
        if found != shards:
            raise ClusterLayoutError(
                f"the cluster store at {top} was made with {found} shards, not {shards}: "
                f"open it with shards={found}, or move its agents to {shards} shards with "
                f"corral log reshard --store {top} --shards {shards} (or "
                f"Cluster.open(..., shards={shards}, reshard=True))"
            )
        return
    if any(top.glob("*.mdb")):
        raise ClusterLayoutError(
            f"{top} holds a single-process corral store; open it with Runtime.open, or "
            "give the cluster an empty directory"
        )
    write_json(top / LAYOUT_FILE, {"shards": shards})


def shard_stores(root: str | os.PathLike[str]) -> list[Path]:
    """The store directory of every shard of the cluster store at ``root``, in shard
    order (a shard that never started has none yet and is left out)."""
    top = Path(root)
    _check_no_reshard(top)
    shards = _read_shards(top)
    paths = [shard_path(top, k) for k in range(shards)]
    return [path for path in paths if (path / "data.mdb").exists()]


def stores_for(root: str | os.PathLike[str], session: str | None = None) -> list[Path]:
    """The stores a reader of ``root`` opens: ``[root]`` for a single store; for a
    cluster store, the one shard store that holds ``session`` (its id routes there), or
    every shard store."""
    top = Path(root)
    if not is_sharded(top):
        return [top]
    _check_no_reshard(top)  # (a session may be in either shard while one runs)
    if session is None:
        return shard_stores(top)
    from .routing import Router  # noqa: PLC0415 - only readers of one session need it

    return [shard_path(top, Router(_read_shards(top)).shard_of(session))]
