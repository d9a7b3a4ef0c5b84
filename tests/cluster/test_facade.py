"""The facade's verbs on a real two-node Ray cluster: each agent in the shard its id
routes to, the verbs of Runtime and Agent through Ray, live events in order."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import AgentDisposedError, Runtime
from runtime.cluster import (
    Cluster,
    ClusterEvent,
    DuplicateAgentError,
    UnportableError,
)

ECHO = "tests.cluster.stack:echo_model"


class Collect:
    """A listener that keeps events and sets ``done`` once ``until`` holds."""

    def __init__(self, until: Any) -> None:
        self.events: list[ClusterEvent] = []
        self.until = until
        self.done = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, event: ClusterEvent) -> None:
        with self.lock:
            self.events.append(event)
            if self.until(self.events):
                self.done.set()


@pytest.fixture
def cluster(ray_cluster: Any, tmp_path: Path) -> Any:
    with Cluster.open(tmp_path / "store", shards=2) as opened:
        yield opened


def test_agents_are_spread_over_the_shards_and_their_shards_run_on_different_nodes(
    cluster: Cluster,
) -> None:
    agents = cluster.spawn_many(40, model=ECHO)
    shards = {agent.shard for agent in agents}
    assert shards == {0, 1}
    info = cluster.shard_info()
    assert info[0].node != info[1].node  # one per worker node
    assert info[0].pid != info[1].pid
    assert sorted(a.id for a in cluster.agents()) == sorted(a.id for a in agents)
    assert all(a.shard == cluster.router.shard_of(a.id) for a in agents)


def test_followup_runs_a_turn_and_the_session_reads_back_through_the_facade(
    cluster: Cluster,
) -> None:
    settled = Collect(lambda events: len(events) == 2)
    cluster.on("agent/settled", settled)
    agent = cluster.spawn(model=ECHO, session_id="reader")
    first = agent.followup("hello")
    second = agent.followup("again", id="my-own-id")
    assert second == "my-own-id"
    assert settled.done.wait(30)
    assert [e.data["turn"] for e in settled.events] == [1, 2]
    assert all(
        e.agent == "reader" and e.data["reason"] == {"kind": "completed"} for e in settled.events
    )
    assert agent.wait_idle(10)
    assert agent.status == "idle"
    texts = [m.content[0].text for m in agent.messages()]
    assert texts == ["hello", "hello", "again", "again"]
    users = [e for e in agent.events() if e.type == "user/message"]
    assert [e.data.message.id for e in users] == [first, "my-own-id"]


def test_steer_inject_cancel_and_wait_idle_act_as_on_a_runtime(cluster: Cluster) -> None:
    agent = cluster.spawn(model="tests.cluster.stack:slow_echo_model", session_id="steered")
    agent.inject("context first")  # no wake: nothing runs
    assert agent.wait_idle(10)
    assert not [e for e in agent.events() if e.type == "turn/start"]
    agent.steer("now go")  # wakes: both join the first step
    assert agent.wait_idle(30)
    claimed = [e for e in agent.events() if e.type == "user/message"]
    assert [e.data.message.content[0].text for e in claimed] == ["context first", "now go"]
    agent.followup("long")
    agent.followup("queued")
    agent.cancel()  # clears the queued one, aborts the running one
    assert agent.wait_idle(30)
    ends = [e.data.reason.kind for e in agent.events() if e.type == "turn/end"]
    assert ends[0] == "completed"
    assert "queued" not in [m.content[0].text for m in agent.messages() if hasattr(m, "id")]


def test_dispose_ends_the_agent_and_resume_brings_it_back_from_its_log(cluster: Cluster) -> None:
    agent = cluster.spawn(model=ECHO, session_id="phoenix")
    agent.followup("one")
    assert agent.wait_idle(30)
    assert agent.dispose(timeout=30)
    assert agent.dispose(timeout=30)  # idempotent
    with pytest.raises(AgentDisposedError, match="is not live in its shard"):
        cluster.get("phoenix")
    with pytest.raises(AgentDisposedError, match="disposed"):
        agent.followup("refused")
    back = cluster.resume("phoenix", model=ECHO)
    back.followup("two")
    assert back.wait_idle(30)
    turns = [e.data.turn for e in back.events() if e.type == "turn/start"]
    assert turns == [1, 2]  # numbers continue across the disposal


def test_a_duplicate_id_and_an_unportable_model_are_refused_with_their_errors(
    cluster: Cluster,
) -> None:
    cluster.spawn(model=ECHO, session_id="twice")
    with pytest.raises(DuplicateAgentError, match="twice"):
        cluster.spawn(model=ECHO, session_id="twice")
    with pytest.raises(UnportableError, match="cannot be sent"):
        cluster.spawn(model=object())  # type: ignore[arg-type]
    with pytest.raises(UnportableError, match=r"package\.module:function"):
        cluster.spawn(model=ECHO, tools=[lambda: None])  # type: ignore[list-item]
    with pytest.raises(UnportableError, match="cannot be imported"):
        cluster.spawn(model="no_such_module_here:factory")
    with pytest.raises(ValueError, match="not forwarded"):
        cluster.on("agent/pre-step", lambda event, next: next())


def test_a_setup_factory_registers_a_waterfall_that_runs_inside_each_shard(
    ray_cluster: Any, tmp_path: Path
) -> None:
    with Cluster.open(
        tmp_path / "store", shards=2, setup="tests.cluster.stack:block_forbidden"
    ) as cluster:
        settled = Collect(lambda events: len(events) == 2)
        cluster.on("agent/settled", settled)
        ok, blocked = cluster.spawn_many(2, model=ECHO, session_ids=["fine", "stopped"])
        ok.followup("hello")
        blocked.followup("forbidden words")
        assert settled.done.wait(30)
        reasons = {e.agent: e.data["reason"]["kind"] for e in settled.events}
        assert reasons == {"fine": "completed", "stopped": "blocked"}


def test_live_events_arrive_in_order_per_agent_and_match_the_durable_log(
    cluster: Cluster,
) -> None:
    agents = cluster.spawn_many(12, model=ECHO)
    turns = 4
    settled = Collect(lambda events: len(events) == len(agents) * turns)
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()

    def on_session_event(event: ClusterEvent) -> None:
        with lock:
            seen.setdefault(event.agent, []).append(event.data["event"]["seq"])

    cluster.on("session/event", on_session_event)
    cluster.on("agent/settled", settled)
    for turn in range(turns):
        cluster.send_many([(agent, f"turn {turn}") for agent in agents])
    assert settled.done.wait(60)
    assert cluster.wait_idle(timeout=30)
    for agent in agents:
        per_turn = [e.data["turn"] for e in settled.events if e.agent == agent.id]
        assert per_turn == list(range(1, turns + 1))
        logged = [e.seq for e in agent.events()]
        assert seen[agent.id] == logged  # every append, once, in order


def test_an_agent_log_is_the_same_as_a_single_process_run_of_the_same_script(
    cluster: Cluster, tmp_path: Path
) -> None:
    from tests.cluster.stack import echo_model, shout

    def script(spawn: Any) -> None:
        agent = spawn()
        for n in range(3):
            agent.followup(f"message {n}", id=f"msg-{n}")
            assert agent.wait_idle(30)

    with Runtime.open(tmp_path / "single") as rt:
        script(
            lambda: rt.spawn(
                model=echo_model(), tools=[shout], session_id="same", system="be brief"
            )
        )
        single = rt.get("same").session.events()
    script(
        lambda: cluster.spawn(
            model=ECHO,
            tools=["tests.cluster.stack:shout_tool"],
            session_id="same",
            system="be brief",
        )
    )
    sharded = cluster.get("same").events()

    def shape(events: list[Any]) -> list[tuple[str, int, Any]]:
        return [(e.type, e.seq, e.data) for e in events]  # all but the wall-clock time

    assert len(single) > 10
    assert shape(sharded) == shape(single)


def test_unwaited_sends_are_applied_in_order_and_a_refusal_surfaces_at_flush(
    cluster: Cluster,
) -> None:
    agent = cluster.spawn(model=ECHO, session_id="pipelined")
    # (Ray reorders a few calls in thousands to a threaded actor: 200 sends would show it)
    ids = [agent.followup(f"n{i}", wait=False) for i in range(200)]
    cluster.flush()  # their acknowledgement
    assert agent.wait_idle(60)
    claimed = [e.data.message.id for e in agent.events() if e.type == "user/message"]
    assert claimed == ids
    gone = cluster.spawn(model=ECHO, session_id="gone")
    assert gone.dispose(timeout=30)
    gone.followup("refused later", wait=False)  # no round trip: nothing raised here
    with pytest.raises(AgentDisposedError, match="gone"):
        cluster.flush()
    cluster.flush()  # reported once


def test_a_reopened_cluster_resumes_its_agents_and_parked_work_waits_for_a_wake(
    ray_cluster: Any, tmp_path: Path
) -> None:
    root = tmp_path / "store"
    with Cluster.open(root, shards=2) as cluster:
        agents = cluster.spawn_many(6, model=ECHO)
        for agent in agents:
            agent.followup("first")
            assert agent.wait_idle(30)
            agent.inject("parked")  # pending, no wake
        cluster.flush()
    with Cluster.open(root) as cluster:  # the store's shard count
        assert cluster.shards == 2
        info = cluster.shard_info()
        assert sum(i.resumed for i in info) == 6
        assert sum(i.rewoken for i in info) == 0  # a clean close: nothing woken
        assert sorted(a.id for a in cluster.agents()) == sorted(a.id for a in agents)
        again = cluster.get(agents[0].id)
        assert again.wait_idle(30)
        texts = [m.content[0].text for m in again.messages()]
        assert texts == ["first", "first"]  # "parked" is still pending
        again.followup("wake")
        assert again.wait_idle(30)
        users = [e.data.message.content[0].text for e in again.events() if e.type == "user/message"]
        assert users[0] == "first"
        assert sorted(users[1:]) == ["parked", "wake"]  # both in the woken turn
        turns = [e.data.turn for e in again.events() if e.type == "turn/start"]
        assert turns == [1, 2]
