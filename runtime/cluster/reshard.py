"""Resharding a cluster store: N shards to M, moving only the sessions whose shard changes.

An agent id routes to a shard by rendezvous hashing (:mod:`runtime.cluster.routing`), so
going from N to M > N shards moves about ``(M - N) / M`` of the sessions, each from an
old shard to a new one, and going down moves only the sessions of the shards that go.
:func:`reshard` runs with the cluster closed (every shard store's writer lock is taken:
a running shard makes it fail), in one process that reaches every shard's store (one
machine, or a filesystem every node shares).

Crash-safe by order, and resumable: ``<path>/reshard.json`` records the plan first, and
``cluster.json`` keeps the old count until every session has moved. A session moves in
three steps, each durable before the next: its log is imported into the new shard's
store (``Store.import_jsonl``: atomic, records byte-identical), its recipe appended to the
new shard's journal, then it is removed from the old store (``storage.remove_sessions``:
atomic) and its journal. A kill anywhere leaves each session whole in its old store, or
in both (the copy is whole: a rerun skips the import and removes the old one), or in the
new one only. Until the plan file is gone a cluster refuses to open (and ``corral log``
to read) the store; running the reshard again finishes it.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import msgspec

from storage import Store, remove_sessions

from .errors import ClusterLayoutError
from .journal import Journal
from .layout import (
    LAYOUT_FILE,
    RESHARD_FILE,
    journal_path,
    layout_shards,
    reshard_plan,
    shard_path,
    write_json,
)
from .routing import Router

__all__ = ["ReshardReport", "reshard"]


class ReshardReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a reshard did."""

    before: int  # the shard count the store had
    after: int
    sessions: int  # sessions in the store, moved or not
    moved: int  # sessions whose shard changed (agents and disposed sessions alike)
    agents_moved: int  # of those, agents a shard resumes at start (its journal lists them)


def reshard(root: str | os.PathLike[str], shards: int) -> ReshardReport:
    """Make the cluster store at ``root`` have ``shards`` shards (see the module doc);
    finishes an interrupted reshard to the same count. Raises
    :class:`ClusterLayoutError` for a store that is not a cluster's, or whose unfinished
    reshard was to another count, and ``StorageError`` if a shard has its store open."""
    top = Path(root)
    Router(shards)  # (checks the count)
    found = layout_shards(top)
    if found is None:
        raise ClusterLayoutError(f"{top} is not a cluster store (it has no {LAYOUT_FILE})")
    plan = reshard_plan(top)
    if plan is not None:
        before, after = plan
        if after != shards:
            raise ClusterLayoutError(
                f"the cluster store at {top} has an unfinished reshard from {before} to "
                f"{after} shards: finish it first (corral log reshard --store {top} "
                f"--shards {after}), then reshard again"
            )
    else:
        before = found
        if before == shards:
            return ReshardReport(before=before, after=shards, sessions=0, moved=0, agents_moved=0)
        write_json(top / RESHARD_FILE, {"from": before, "to": shards})
    router = Router(shards)
    sessions = moved = agents_moved = 0
    for k in range(before):
        counted = _move_out(top, k, router)
        sessions += counted[0]
        moved += counted[1]
        agents_moved += counted[2]
    for k in range(before, shards):  # a new shard with no session still gets its store
        Store.open(shard_path(top, k)).close()
    write_json(top / LAYOUT_FILE, {"shards": shards})
    for k in range(shards, before):  # shards that went: nothing is left in them
        _drop_shard(top, k)
    (top / RESHARD_FILE).unlink()
    return ReshardReport(
        before=before, after=shards, sessions=sessions, moved=moved, agents_moved=agents_moved
    )


def _move_out(top: Path, k: int, router: Router) -> tuple[int, int, int]:
    """Move every session of shard ``k`` that ``router`` sends elsewhere; returns
    (sessions seen, moved, agents moved)."""
    path = shard_path(top, k)
    if not (path / "data.mdb").exists():
        return 0, 0, 0
    with Store.open(path, readonly=True) as source:
        ids = [header.id for header in source.sessions()]
    leaving: dict[int, list[str]] = {}
    for session_id in ids:
        target = router.shard_of(session_id)
        if target != k:
            leaving.setdefault(target, []).append(session_id)
    journal = Journal(journal_path(top, k))
    agents_moved = 0
    try:
        for target, group in sorted(leaving.items()):
            agents_moved += _copy(top, k, target, group, journal)
            remove_sessions(path, group)
        # the journal forgets what lives elsewhere now (also what an interrupted run
        # removed from the store before it could write this)
        journal.disposed([a for a in list(journal.agents) if router.shard_of(a) != k])
    finally:
        journal.close(clean=journal.clean)
    return len(ids), sum(len(group) for group in leaving.values()), agents_moved


def _copy(top: Path, k: int, target: int, group: list[str], journal: Journal) -> int:
    """Copy ``group`` from shard ``k`` to ``target`` (store, then journal); returns how
    many of them are agents."""
    target_journal_path = journal_path(top, target)
    new_journal = not target_journal_path.exists()
    with (
        Store.open(shard_path(top, k), readonly=True) as source,
        Store.open(shard_path(top, target)) as dest,
    ):
        for session_id in group:
            if dest.has_session(session_id):  # copied by an interrupted run: whole
                if dest.stats(session_id) != source.stats(session_id):
                    raise ClusterLayoutError(
                        f"session {session_id!r} is in shard {k} and shard {target} with "
                        "different logs: the store was written during a reshard; restore "
                        "it from a backup"
                    )
                continue
            export = io.BytesIO()
            source.export_jsonl(session_id, export)
            export.seek(0)
            dest.import_jsonl(export, session_id=session_id)  # durable when it returns
    dest_journal = Journal(target_journal_path)
    clean = journal.clean and (new_journal or dest_journal.clean)
    try:
        agents = [(a, journal.agents[a]) for a in group if a in journal.agents]
        dest_journal.spawned([(a, spec) for a, spec in agents if a not in dest_journal.agents])
    finally:
        dest_journal.close(clean=clean)  # a clean close stays one: nothing is woken
    return len(agents)


def _drop_shard(top: Path, k: int) -> None:
    path = shard_path(top, k)
    if (path / "data.mdb").exists():
        with Store.open(path, readonly=True) as store:
            left = [header.id for header in store.sessions()]
        if left:
            raise ClusterLayoutError(
                f"shard {k} of {top} still holds {len(left)} sessions after the reshard "
                f"({left[:3]}...): it is kept; run the reshard again"
            )
        shutil.rmtree(path)
    journal_path(top, k).unlink(missing_ok=True)
