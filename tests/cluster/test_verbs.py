"""The verbs of Runtime and Agent beyond the first ones, through the facade on a real
two-node Ray cluster: fork (in the source's shard and into another), the inbox edits
(remove, replace, splice, clear), passivate; each as on a plain Runtime."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime, TextBlock, UnknownMessageError, UserMessage
from runtime.cluster import Cluster

ECHO = "tests.cluster.stack:echo_model"


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster.open(tmp_path_factory.mktemp("verbs") / "store", shards=2) as opened:
        yield opened


def _shape(events: list[Any]) -> list[tuple[str, int, Any]]:
    return [(e.type, e.seq, e.data) for e in events]  # all but the wall-clock time


def _id_in_shard(cluster: Cluster, shard: int, prefix: str) -> str:
    return next(
        f"{prefix}-{n}" for n in range(1000) if cluster.router.shard_of(f"{prefix}-{n}") == shard
    )


def test_fork_seeds_a_child_in_the_source_shard_or_in_another_as_a_runtime_fork_does(
    cluster: Cluster, tmp_path: Path
) -> None:
    from tests.cluster.stack import echo_model

    def run_source(agent: Any, events: Any) -> int:
        for n in range(2):
            agent.followup(f"turn {n}", id=f"src-{n}")
            assert agent.wait_idle(30)
        return next(e.seq for e in events() if e.type == "turn/end")  # after turn 1

    with Runtime.open(tmp_path / "single") as rt:
        source = rt.spawn(model=echo_model(), session_id="source")
        boundary = run_source(source, source.session.events)
        expected = _shape(rt.fork("source", boundary, model=echo_model()).session.events())

    source = cluster.spawn(model=ECHO, session_id="source")
    assert run_source(source, source.events) == boundary
    here = cluster.fork("source", boundary, model=ECHO)  # no id: one in the source's shard
    elsewhere = cluster.fork(
        "source", boundary, model=ECHO, session_id=_id_in_shard(cluster, 1 - source.shard, "far")
    )
    assert here.shard == source.shard
    assert elsewhere.shard == 1 - source.shard
    for child in (here, elsewhere):
        events = child.events()
        assert _shape(events) == expected  # the prefix and its session/end-seed
        assert events[-1].data.source_session == "source"
        child.followup("after the fork")
        assert child.wait_idle(30)
        turns = [e.data.turn for e in child.events() if e.type == "turn/start"]
        assert turns == [1, 2]  # numbers continue from the prefix
        texts = [m.content[0].text for m in child.messages()]
        assert texts == ["turn 0", "turn 0", "after the fork", "after the fork"]
    assert {a.id for a in cluster.agents()} >= {"source", here.id, elsewhere.id}


def test_a_fork_inside_an_open_turn_or_of_an_unknown_source_is_refused(cluster: Cluster) -> None:
    from storage import ForkBoundaryError, UnknownSessionError

    agent = cluster.spawn(model=ECHO, session_id="forked-badly")
    agent.followup("one")
    assert agent.wait_idle(30)
    start = next(e.seq for e in agent.events() if e.type == "turn/start")
    far = _id_in_shard(cluster, 1 - agent.shard, "bad-fork")
    for session_id in (None, far):
        with pytest.raises(ForkBoundaryError, match="inside turn 1"):
            cluster.fork("forked-badly", start, model=ECHO, session_id=session_id)
    with pytest.raises(UnknownSessionError):
        cluster.fork("no-such-source", 0, model=ECHO, session_id=far)
    assert far not in {a.id for a in cluster.agents()}  # nothing was left behind


def test_inbox_edits_remove_replace_splice_and_clear_as_on_an_agent(cluster: Cluster) -> None:
    agent = cluster.spawn(model=ECHO, session_id="edited")
    first = agent.inject("one")  # pending, no wake
    second = agent.inject("two")
    inserted = agent.splice(
        "next-turn", 0, 0, ["later", UserMessage(id="m-own", content=(TextBlock(text="mine"),))]
    )
    assert inserted == []  # nothing discarded
    inbox = agent.inbox
    assert inbox.ids() == [inbox.next_turn[0].id, "m-own", first, second]
    assert agent.remove(first).content[0].text == "one"
    new_id = agent.replace(second, "TWO")
    assert agent.inbox.next_step[0].id == new_id
    assert agent.inbox.next_step[0].content[0].text == "TWO"
    with pytest.raises(UnknownMessageError):
        agent.remove(first)  # gone already: the shard's error, as raised there
    removed = agent.splice("next-turn", 0, 1)
    assert [m.content[0].text for m in removed] == ["later"]
    cleared = agent.clear()
    assert [m.id for m in cleared] == ["m-own", new_id]
    assert len(agent.inbox) == 0
    assert agent.wait_idle(10)
    assert not [e for e in agent.events() if e.type == "turn/start"]  # no edit woke it
    spliced = [e for e in agent.events() if e.type == "agent/inbox/spliced"]
    assert len(spliced) == 8  # each insert and discard is a durable fact (clear: one a lane)


def test_passivate_evicts_an_idle_agent_and_its_next_send_brings_it_back(
    cluster: Cluster,
) -> None:
    agent = cluster.spawn(model="tests.cluster.stack:slow_echo_model", session_id="sleeper")
    agent.followup("before")
    assert agent.wait_idle(30)
    assert agent.passivate()
    assert agent.passivate()  # passive already: nothing to do, and no error
    agent.followup("after")  # rehydrates it from its log
    assert agent.wait_idle(30)
    turns = [e.data.turn for e in agent.events() if e.type == "turn/start"]
    assert turns == [1, 2]
    agent.followup("busy now")
    assert not agent.passivate(timeout=5)  # busy: refused, nothing done
    assert agent.wait_idle(30)
