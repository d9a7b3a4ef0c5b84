"""Races at the edges of an agent's life: a ``close()`` that gives up on spawns under way,
and a passivation whose stop outlasts its timeout (RELIABILITY section 7)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runtime import Agent, Runtime, RuntimeClosedError, ScriptedModel

from .conftest import WAIT, HeldActor, check_store


@pytest.mark.parametrize("threads", [None, 1, 2], ids=lambda t: f"threads={t}")
def test_a_close_that_gives_up_on_spawns_under_way_leaves_no_agent_running(
    tmp_path: Path, threads: int | None
) -> None:
    # Before, a start the close gave up waiting for went on after it: its agent was
    # announced (agent/created) once close() had returned, never disposed, and its actor
    # kept running.
    path = tmp_path / "store"
    rt = Runtime.open(path, threads=threads)
    seen: Counter[tuple[str, str]] = Counter()
    lock = threading.Lock()

    def record(kind: str) -> Any:
        def on(event: Any) -> None:
            with lock:
                seen[(event.agent.id, kind)] += 1

        return on

    rt.on("agent/created", record("created"))
    rt.on("agent/disposed", record("disposed"))
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
    for spawner in spawners:
        spawner.join(WAIT)
    assert [type(e) for e in errors] == [RuntimeClosedError] * 3
    ids = {agent_id for agent_id, _ in seen}
    assert all(seen[(i, "created")] == 1 and seen[(i, "disposed")] == 1 for i in ids), seen
    assert {a.id for a in started} <= ids
    assert not [a for a in started if a._ref is not None and a._ref.is_alive()]
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
        ref = agent._ref
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
