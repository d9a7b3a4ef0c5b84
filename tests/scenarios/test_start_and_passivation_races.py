"""Races at the edges of an agent's life: a ``close()`` that gives up on spawns under way,
and a passivation whose stop outlasts its timeout (RELIABILITY section 7)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pykka import ActorRegistry

from runtime import Agent, Runtime, RuntimeClosedError, ScriptedModel
from runtime.close import Deadline, Stage

from .conftest import WAIT, HeldActor, check_store


def registered() -> set[str]:
    """The urns of the actors pykka has registered (running, or never stopped)."""
    return {ref.actor_urn for ref in ActorRegistry.get_all()}


@pytest.mark.parametrize("threads", [None, 1, 2], ids=lambda t: f"threads={t}")
def test_a_close_that_gives_up_on_spawns_under_way_announces_none_of_them_after_it(
    tmp_path: Path, threads: int | None
) -> None:
    # Before, a start the close gave up waiting for went on after it: its agent was
    # announced (agent/created) once close() had returned, never disposed, and its actor
    # kept running. Now close claims it: its spawn raises RuntimeClosedError and nothing
    # of it is announced. (What close(timeout=0) does with the agents it did sweep is
    # its documented best effort: disposals not ended in time are left.)
    path = tmp_path / "store"
    before = registered()
    rt = Runtime.open(path, threads=threads)
    created: list[tuple[str, bool]] = []
    returned = threading.Event()
    rt.on("agent/created", lambda event: created.append((event.agent.id, returned.is_set())))
    started: list[Agent] = []
    errors: list[BaseException] = []
    running = threading.Semaphore(0)

    def spawn_until_closed() -> None:
        try:
            while True:
                started.append(rt.spawn(model=ScriptedModel.echo()))
                running.release()  # one more spawn done: the next is under way
        except BaseException as err:
            errors.append(err)

    spawners = [threading.Thread(target=spawn_until_closed) for _ in range(3)]
    for spawner in spawners:
        spawner.start()
    for _ in range(10):
        assert running.acquire(timeout=WAIT), errors
    rt.close(timeout=0)
    returned.set()
    for spawner in spawners:
        spawner.join(WAIT)
    assert [type(e) for e in errors] == [RuntimeClosedError] * 3
    assert [agent_id for agent_id, late in created if late] == []
    assert sorted(agent_id for agent_id, _ in created) == sorted(a.id for a in started)
    # A claimed start whose stop came after the dispatcher shut down was left registered
    # with pykka for good (an actor that could never run again).
    assert registered() - before == set()
    check_store(path)


def test_a_spawn_that_a_close_gave_up_waiting_for_is_never_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Deterministic: the one worker is held, so a spawn waits for the registry while
    # close() gives up on it; close's own sweep (a passivated agent's agent/disposed,
    # emitted on close's thread) then frees the worker. Before, the start went on:
    # agent/created for an agent close never disposed, its actor left running.
    path = tmp_path / "store"
    before = registered()
    rt = Runtime.open(path, threads=1)
    parked = rt.spawn(model=ScriptedModel.echo(), session_id="parked")
    parked.followup("warm up")
    assert parked.wait_idle(WAIT)
    assert parked.passivate(timeout=WAIT)
    held = HeldActor(rt.spawn(model=ScriptedModel.echo(), session_id="busy"))
    parked.on("agent/disposed", lambda event: held.release())
    created: list[str] = []
    rt.on("agent/created", lambda event: created.append(event.agent.id))
    reached = threading.Event()
    create_session = rt.store.create_session

    def observed(session_id: str | None = None) -> Any:
        session = create_session(session_id)
        reached.set()  # from here the spawn waits for the registry, which cannot run
        return session

    monkeypatch.setattr(rt.store, "create_session", observed)
    outcome: list[object] = []

    def spawn_late() -> None:
        try:
            outcome.append(rt.spawn(model=ScriptedModel.echo(), session_id="late"))
        except BaseException as err:
            outcome.append(err)

    spawner = threading.Thread(target=spawn_late)
    spawner.start()
    assert reached.wait(WAIT)
    rt.close(timeout=0.5)
    spawner.join(WAIT)
    assert [type(o) for o in outcome] == [RuntimeClosedError]
    assert "late" not in created
    assert registered() - before == set()  # nothing left that could never run again
    check_store(path)


def test_a_passivation_whose_stop_outlasts_its_timeout_still_passivates_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, pykka's Timeout escaped passivate() and left the handle neither live nor
    # passive: every later send raised "agent ... is no longer running".
    with Runtime.open(tmp_path / "store", threads=1) as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("warm up")
        assert agent.wait_idle(WAIT)
        other = rt.spawn(model=ScriptedModel.echo())
        held: list[HeldActor] = []
        ref = agent._slot.ref
        assert ref is not None
        ask = ref.ask

        def quiescent_then_busy(message: Any, **options: Any) -> Any:
            answer = ask(message, **options)
            if not held:  # the Quiescent ask (the stop asks too): the one worker is
                held.append(HeldActor(other))  # taken before the stop is handled
            return answer

        monkeypatch.setattr(ref, "ask", quiescent_then_busy)
        assert agent.passivate(timeout=0.2)
        assert agent.passive
        held[0].release()
        agent.followup("after")
        assert agent.wait_idle(WAIT)
        texts = [m.content[0].text for m in agent.session.messages() if m.role == "user"]
        assert texts == ["warm up", "after"]


def test_a_start_not_yet_pending_when_close_gives_up_on_the_starts_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Deterministic: the spawn is held while it builds its agent (before it is pending),
    # close(timeout=0) gives up on the starts under way, and the spawn goes on before
    # close stops the registry. Before, it was announced and returned a live agent that
    # close never disposed (and whose actor pykka kept registered for good).
    path = tmp_path / "store"
    before = registered()
    rt = Runtime.open(path, threads=1)
    building, go, spawned = threading.Event(), threading.Event(), threading.Event()
    assemble = rt._table.assemble

    def held_assemble(*args: Any) -> Any:
        building.set()
        assert go.wait(WAIT)
        return assemble(*args)

    run_stage = rt._closing.stages.run_stage

    def stage(closing: Stage, deadline: Deadline) -> None:
        run_stage(closing, deadline)
        if closing.name == "starts":  # gave up on the starts: let the held one go on now
            go.set()
            assert spawned.wait(WAIT)

    monkeypatch.setattr(rt._table, "assemble", held_assemble)
    monkeypatch.setattr(rt._closing.stages, "run_stage", stage)
    created: list[str] = []
    rt.on("agent/created", lambda event: created.append(event.agent.id))
    outcome: list[object] = []

    def spawn() -> None:
        try:
            outcome.append(rt.spawn(model=ScriptedModel.echo(), session_id="held"))
        except BaseException as err:
            outcome.append(err)
        spawned.set()

    spawner = threading.Thread(target=spawn)
    spawner.start()
    assert building.wait(WAIT)
    rt.close(timeout=0)
    spawner.join(WAIT)
    assert [type(o) for o in outcome] == [RuntimeClosedError]
    assert created == []
    assert registered() - before == set()
    check_store(path)
