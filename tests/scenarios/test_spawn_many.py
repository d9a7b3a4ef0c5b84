"""rt.spawn_many: many agents made as as many rt.spawn calls would make them, faster."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime, RuntimeClosedError, ScriptedModel, tool
from storage.lmdb.store import Store

from .conftest import WAIT, Timeline, check_store


def test_spawn_many_makes_agents_each_announced_created_then_session_start(
    rt: Runtime, timeline: Timeline
) -> None:
    agents = rt.spawn_many(1203, model=ScriptedModel.echo())  # more than one registry batch
    assert len({a.id for a in agents}) == 1203
    assert {a.id for a in rt.agents()} == {a.id for a in agents}
    timeline.wait_for("agent/session-start", 1203)
    for agent in agents[:3] + agents[-3:]:
        assert timeline.labels(agent=agent.id) == ["agent/created", "agent/session-start"]
    created = [e.agent.id for e in timeline.of("agent/created")]
    assert sorted(created) == sorted(a.id for a in agents)
    assert [h.id for h in rt.store.sessions()] == [a.id for a in agents]  # spawn order


def test_agents_from_spawn_many_run_turns_share_the_tools_and_are_durable(
    store_path: Path,
) -> None:
    @tool
    def shout(text: str) -> str:
        return text.upper()

    with Runtime.open(store_path) as rt:
        agents = rt.spawn_many(20, model=ScriptedModel.echo(), tools=[shout], system="be brief")
        for agent in agents:
            agent.followup(f"hi {agent.id}")
        for agent in agents:
            assert agent.wait_idle(WAIT)
            assert agent.session.messages()[-1].content[0].text == f"hi {agent.id}"
        rt.flush()
        ids = [a.id for a in agents]
    with Store.open(store_path) as store:
        assert [h.id for h in store.sessions()] == ids
        for agent_id in ids:
            types = [e.type for e in store.read(agent_id)]
            assert types[1] == "turn/start" and types[-1] == "turn/end"
    check_store(store_path)


def test_spawn_many_of_zero_makes_none_and_a_bad_count_is_refused(rt: Runtime) -> None:
    assert rt.spawn_many(0, model=ScriptedModel.echo()) == []
    for count in (-1, 2.0, True):
        with pytest.raises(ValueError, match="count is the number of agents"):
            rt.spawn_many(count, model=ScriptedModel.echo())  # type: ignore[arg-type]
    assert rt.agents() == []


def test_spawn_many_with_bad_settings_fails_before_anything_is_created(rt: Runtime) -> None:
    with pytest.raises(TypeError, match="a tool is a Tool or a typed function"):
        rt.spawn_many(3, model=ScriptedModel.echo(), tools=[object()])  # type: ignore[list-item]
    assert rt.agents() == []
    assert rt.store.sessions() == []


def test_spawn_many_from_a_listener_spawns_one_at_a_time_and_finishes(rt: Runtime) -> None:
    made: list[Any] = []
    done = threading.Event()
    first: list[str] = []

    def on_created(event: Any) -> None:
        if not first:  # the first agent's announcement (on its actor): spawn three more
            first.append(event.agent.id)
            made.extend(rt.spawn_many(3, model=ScriptedModel.echo()))
            done.set()

    rt.on("agent/created", on_created)
    spawned = rt.spawn(model=ScriptedModel.echo())
    assert done.wait(WAIT)
    assert first == [spawned.id]
    assert len(made) == 3
    assert {a.id for a in rt.agents()} == {spawned.id, *(a.id for a in made)}


def test_a_spawn_many_failing_part_way_keeps_those_announced_and_undoes_the_rest(
    rt: Runtime,
) -> None:
    class AnnounceFailedError(Exception):
        pass

    original = rt._table.announce
    calls = [0]

    def announce(*args: Any) -> None:
        calls[0] += 1
        if calls[0] == 3:
            raise AnnounceFailedError("the third announcement fails")
        original(*args)

    rt._table.announce = announce  # type: ignore[method-assign]
    with pytest.raises(AnnounceFailedError, match="the third announcement fails"):
        rt.spawn_many(5, model=ScriptedModel.echo())
    live = rt.agents()
    assert len(live) == 4
    for agent in live:
        agent.followup("still works")
        assert agent.wait_idle(WAIT)


def test_spawn_many_after_close_is_refused(store_path: Path) -> None:
    rt = Runtime.open(store_path)
    rt.close()
    with pytest.raises(RuntimeClosedError, match="this runtime is closed; open a new one"):
        rt.spawn_many(2, model=ScriptedModel.echo())
