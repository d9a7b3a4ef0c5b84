"""Resharding a cluster store: only the sessions whose shard changes move, each lands in
exactly one shard with its log byte for byte, and a SIGKILL anywhere in a reshard leaves
a store that refuses to open until the reshard is run again, which finishes it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.cluster import Cluster, ClusterLayoutError, Router, shard_stores
from runtime.cluster.factories import AgentRecipe
from runtime.cluster.journal import Journal
from runtime.cluster.layout import claim_layout, journal_path, shard_path, stores_for
from runtime.cluster.reshard import reshard
from storage import Store
from tests.cli.conftest import corral

ECHO = "tests.cluster.stack:echo_model"
AGENTS = 30


def _make_store(root: Path, shards: int) -> None:
    """A cluster store as shards leave it after a clean close (made without Ray: one
    Runtime per shard store, and each shard's journal)."""
    from tests.cluster.stack import echo_model

    claim_layout(root, shards)
    router = Router(shards)
    ids = [f"agent-{n}" for n in range(AGENTS)]
    for k in range(shards):
        mine = [i for i in ids if router.shard_of(i) == k]
        journal = Journal(journal_path(root, k))
        journal.spawned((i, AgentRecipe(model=ECHO)) for i in mine)
        with Runtime.open(shard_path(root, k)) as rt:
            for agent_id in mine:
                agent = rt.spawn(model=echo_model(), session_id=agent_id)
                agent.followup(f"hello {agent_id}")
                assert agent.wait_idle(30)
            disposed = rt.spawn(model=echo_model(), session_id=f"gone-{k}")
            assert disposed.dispose(timeout=30)  # a disposed session moves too
        journal.close(clean=True)


def _logs(root: Path) -> dict[str, tuple[int, list[bytes]]]:
    """Every session of every shard store: (its shard, its exported records)."""
    found: dict[str, tuple[int, list[bytes]]] = {}
    for path in shard_stores(root):
        k = int(path.name.removeprefix("shard-"))
        with Store.open(path, readonly=True) as store:
            for header in store.sessions():
                out = io.BytesIO()
                store.export_jsonl(header.id, out)
                assert header.id not in found, f"{header.id} in two shards"
                found[header.id] = (k, out.getvalue().splitlines()[1:])
    return found


def _check_resharded(root: Path, before: dict[str, tuple[int, list[bytes]]], shards: int) -> None:
    after = _logs(root)
    router = Router(shards)
    assert sorted(after) == sorted(before)  # every session, each in exactly one shard
    assert all(k == router.shard_of(i) for i, (k, _) in after.items())
    assert {i: r for i, (_, r) in after.items()} == {i: r for i, (_, r) in before.items()}
    agents: dict[str, int] = {}
    for k in range(shards):
        journal = Journal(journal_path(root, k))
        journal.close()
        assert journal.clean  # a clean close stays clean: a reopen wakes nothing
        for agent_id in journal.agents:
            assert agent_id not in agents
            agents[agent_id] = k
    assert agents == {f"agent-{n}": router.shard_of(f"agent-{n}") for n in range(AGENTS)}
    assert not (root / "reshard.json").exists()


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 2)])
def test_a_reshard_moves_only_the_sessions_whose_shard_changes(
    tmp_path: Path, before: int, after: int
) -> None:
    root = tmp_path / "store"
    _make_store(root, before)
    logs = _logs(root)
    report = reshard(root, after)
    moved = sum(Router(after).shard_of(i) != Router(before).shard_of(i) for i in logs)
    assert (report.before, report.after, report.sessions) == (before, after, len(logs))
    assert report.moved == moved < len(logs)  # rendezvous: only what changes shard
    _check_resharded(root, logs, after)
    assert sorted(p.name for p in root.glob("shard-*") if p.is_dir()) == [
        f"shard-{k}" for k in range(after)
    ]
    assert reshard(root, after).moved == 0  # the count it has: nothing to do


KILLER = """
import os, signal, sys
from runtime.cluster import reshard as module
from storage import Store

where, at = sys.argv[2], int(sys.argv[3])
calls = [0]

def killing(real):
    def call(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return call

if where == "import":
    Store.import_jsonl = killing(Store.import_jsonl)
elif where == "remove":
    module.remove_sessions = killing(module.remove_sessions)
else:
    module.write_json = killing(module.write_json)  # 1: the plan, 2: cluster.json
module.reshard(sys.argv[1], 3)
"""


@pytest.mark.parametrize(
    ("where", "at"), [("import", 1), ("import", 4), ("remove", 1), ("remove", 2), ("json", 2)]
)
def test_a_sigkill_mid_reshard_leaves_each_session_in_one_shard_once_it_is_run_again(
    tmp_path: Path, where: str, at: int
) -> None:
    root = tmp_path / "store"
    _make_store(root, 2)
    logs = _logs(root)
    child = subprocess.run(
        [sys.executable, "-c", KILLER, str(root), where, str(at)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert child.returncode == -9, child.stderr  # killed where it was told to be
    with pytest.raises(ClusterLayoutError, match="unfinished reshard from 2 to 3"):
        claim_layout(root, 2)  # the cluster refuses to open it (either count) ...
    with pytest.raises(ClusterLayoutError, match="corral log reshard"):
        shard_stores(root)  # ... and corral log to read it
    with pytest.raises(ClusterLayoutError, match="corral log reshard"):
        stores_for(root, "agent-1")
    with pytest.raises(ClusterLayoutError, match="finish it first"):
        reshard(root, 4)
    report = reshard(root, 3)  # run again: finishes it
    assert report.after == 3
    _check_resharded(root, logs, 3)


def test_a_cluster_opened_with_another_count_refuses_or_reshards_and_its_agents_go_on(
    ray_cluster: Any, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    with Cluster.open(root, shards=2) as cluster:
        # Named, not generated, ids: five of these twelve route to shard 2 of 3 (with
        # random ids none would, once in 130 runs: (2/3)**12).
        ids = [f"reshard-{i}" for i in range(12)]
        agents = cluster.spawn_many(12, model=ECHO, session_ids=ids)
        cluster.send_many((a, "before") for a in agents)
        assert cluster.wait_idle(timeout=60)
        before = {a.id: [(e.type, e.seq, e.data) for e in a.events()] for a in agents}
    with pytest.raises(ClusterLayoutError, match=r"made with 2 shards, not 3.*log reshard"):
        Cluster.open(root, shards=3)
    # (half a CPU a shard: the test's Ray cluster has two nodes of one CPU)
    with Cluster.open(root, shards=3, reshard=True, shard_cpus=0.5) as cluster:
        assert cluster.shards == 3
        assert sorted(a.id for a in cluster.agents()) == sorted(before)
        assert sum(i.resumed for i in cluster.shard_info()) == 12
        moved = [cluster.get(i) for i in before if cluster.router.shard_of(i) == 2]
        assert len(moved) == 5  # went to the new shard
        for agent in moved:
            assert [(e.type, e.seq, e.data) for e in agent.events()] == before[agent.id]
            agent.followup("after")
        assert cluster.wait_idle(timeout=60)
        assert all(
            [e.data.turn for e in a.events() if e.type == "turn/start"] == [1, 2] for a in moved
        )
    back = corral("log", "reshard", "--store", root, "--shards", "2", timeout=120)
    assert back.returncode == 0, back.stdout + back.stderr
    assert "3 -> 2 shards" in back.stdout
    check = corral("log", "check", "--store", root, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "12 sessions OK" in check.stdout
