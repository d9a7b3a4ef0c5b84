"""A shard's worker process SIGKILLed under load: Ray restarts it, it reopens its store,
repairs the interrupted turns and resumes its agents; the driver's handles keep working,
no acknowledged send is lost or applied twice, and ``corral log check`` passes."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from runtime.cluster import Cluster, ClusterEvent
from tests.cli.conftest import corral

SLOW = "tests.cluster.stack:slower_echo_model"  # 100 ms a reply: work owed at the kill
AGENTS = 24
ROUNDS_BEFORE, ROUNDS_AFTER = 6, 2


def test_sigkill_of_a_shard_under_load_loses_no_acknowledged_send_and_resumes_every_agent(
    ray_cluster: Any, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    settled: list[ClusterEvent] = []
    lock = threading.Lock()
    some_settled = threading.Event()

    def on_settled(event: ClusterEvent) -> None:
        with lock:
            settled.append(event)
            if len(settled) >= AGENTS:
                some_settled.set()

    with Cluster.open(root, shards=2) as cluster:
        cluster.on("agent/settled", on_settled)
        agents = cluster.spawn_many(AGENTS, model=SLOW)
        victims = [a for a in agents if a.shard == 0]
        assert victims and len(victims) < AGENTS
        acknowledged: list[str] = []
        for r in range(ROUNDS_BEFORE):
            ids = cluster.send_many([(a, f"round {r}") for a in agents])
            cluster.flush()  # durable from here: acknowledged
            acknowledged += ids
        assert some_settled.wait(60)  # the load is running
        before = cluster.shard_info()[0]
        with lock:
            seen_before = [(e.agent, e.data["turn"]) for e in settled if e.shard == 0]
        os.kill(before.pid, signal.SIGKILL)

        # The handles keep working: these sends find shard 0 dead or restarting and are
        # sent again until it answers (each once: the shard knows their ids).
        for r in range(ROUNDS_BEFORE, ROUNDS_BEFORE + ROUNDS_AFTER):
            ids = cluster.send_many([(a, f"round {r}") for a in agents])
            cluster.flush()
            acknowledged += ids
        assert cluster.wait_idle(timeout=120)
        after = cluster.shard_info()[0]
        assert after.pid != before.pid  # a new process
        assert after.resumed == len(victims)  # every agent of the shard came back
        assert after.rewoken > 0  # it was killed with work owed, which it took up again

        logged: dict[str, list[str]] = {}
        for agent in agents:
            events = agent.events()
            logged[agent.id] = [e.data.message.id for e in events if e.type == "user/message"]
            ends = {e.data.turn for e in events if e.type == "turn/end"}
            for shard_agent, turn in seen_before:
                if shard_agent == agent.id:
                    assert turn in ends  # a turn the driver saw settle is in the log
        every_id = [mid for ids in logged.values() for mid in ids]
        assert sorted(every_id) == sorted(acknowledged)  # each acknowledged send once
        assert len(set(every_id)) == len(every_id)

    check = corral("log", "check", "--store", root, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{AGENTS} sessions OK" in check.stdout
    listed = corral("log", "ls", "--store", root, timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert f"{AGENTS} session(s)" in listed.stdout
    assert all(agent.id in listed.stdout for agent in agents)
