"""Runtime verbs that wait for other actors (``rt.spawn``, another agent's ``wait_idle`` or
``dispose``), called from sync listeners, which run on the dispatcher's workers. However
few the workers (``threads=1``; ``None`` is one worker plus a standby one) and however
many such listeners wait at once, the dispatcher lends a worker for each wait, so the
registry and the new actors they wait for still run; ``rt.close(timeout)`` returns.
Also: an agent is handed out (``rt.get``, ``rt.agents()``) only once it is live, and
``dispose()`` from the agent's own ``agent/disposed`` listener does not wait for itself
(RELIABILITY section 7)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import Agent, Runtime, ScriptedModel

from .conftest import WAIT, HeldActor, check_store

LONG = 3 * WAIT  # what a wait for itself would wait: past every WAIT of the test


@pytest.fixture
def rt(threaded_rt: Runtime) -> Runtime:
    return threaded_rt


def test_sync_settled_listeners_that_each_spawn_an_agent_at_once_keep_the_runtime_going(
    rt: Runtime,
) -> None:
    lock, spawned, done = threading.Lock(), [], threading.Event()
    wanted = 40

    def spawn_next(event: Any) -> None:
        with lock:
            if len(spawned) >= wanted:
                done.set()
                return
            spawned.append(None)
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup(f"from {event.agent.id}")

    rt.on("agent/settled", spawn_next)
    for _ in range(3):  # three chains of spawns, whose listeners meet on the workers
        rt.spawn(model=ScriptedModel.echo()).followup("start")
    assert done.wait(WAIT), f"only {len(spawned)} of {wanted} spawns happened"
    for agent in rt.agents():
        assert agent.wait_idle(WAIT)
    settled = [a for a in rt.agents() if a.session.messages()]
    assert len(settled) >= wanted + 3


def test_a_spawn_from_a_sync_agent_created_listener_returns_a_live_agent(rt: Runtime) -> None:
    children: list[Agent] = []

    def spawn_child(event: Any) -> None:
        if not children and event.agent.id == "parent":
            children.append(rt.spawn(model=ScriptedModel.echo(), session_id="child"))
            children[0].followup("hello")

    rt.on("agent/created", spawn_child)
    rt.spawn(model=ScriptedModel.echo(), session_id="parent")
    assert [c.id for c in children] == ["child"]
    assert children[0].wait_idle(WAIT)
    assert [m.role for m in children[0].session.messages()] == ["user", "assistant"]


def test_a_sync_listener_waits_for_and_disposes_of_another_agent(rt: Runtime) -> None:
    watcher = rt.spawn(model=ScriptedModel.echo())
    other = rt.spawn(model=ScriptedModel.echo(latency=0.05))
    outcome: list[bool] = []
    done = threading.Event()

    def stop_other(event: Any) -> None:
        outcome.append(other.wait_idle(WAIT))
        outcome.append(other.dispose(WAIT))
        done.set()

    watcher.on("agent/settled", stop_other)
    other.followup("a slow reply")
    watcher.followup("go")
    assert done.wait(2 * WAIT)
    assert outcome == [True, True]
    assert other.disposed


def test_dispose_from_the_agents_own_agent_disposed_listener_does_not_wait_for_itself(
    rt: Runtime,
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    inner: list[bool] = []

    def dispose_again(event: Any) -> None:
        inner.append(event.agent.dispose(LONG))  # would wait for this very listener

    agent.on("agent/disposed", dispose_again)
    assert agent.dispose(WAIT)
    assert inner == [False]  # the disposal ends once its listeners return


def test_a_listener_of_a_crashed_agents_disposal_may_spawn_its_replacement(
    rt: Runtime,
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo(), session_id="crashing")
    replaced: list[Agent] = []
    done = threading.Event()

    def replace(event: Any) -> None:
        replaced.append(rt.resume(event.agent.id, model=ScriptedModel.echo()))
        done.set()

    agent.on("agent/disposed", replace)
    agent.kill("on purpose")
    assert done.wait(WAIT)
    assert replaced[0].id == "crashing" and rt.get("crashing") is replaced[0]
    replaced[0].followup("again")
    assert replaced[0].wait_idle(WAIT)


def test_an_agent_still_starting_is_not_handed_out_by_get_or_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    with Runtime.open(path, threads=1) as rt:
        busy = rt.spawn(model=ScriptedModel.echo())
        held = HeldActor(busy)  # the one worker waits in a listener: nothing else runs
        created = threading.Event()
        create_session = rt.store.create_session

        def observed(session_id: str | None = None) -> Any:
            session = create_session(session_id)
            created.set()  # the spawn goes on to the registry, which cannot run yet
            return session

        monkeypatch.setattr(rt.store, "create_session", observed)
        started: list[Agent] = []
        spawner = threading.Thread(
            target=lambda: started.append(rt.spawn(model=ScriptedModel.echo(), session_id="new"))
        )
        spawner.start()
        assert created.wait(WAIT)
        with pytest.raises(KeyError, match="no live agent 'new'"):
            rt.get("new")
        assert "new" not in [a.id for a in rt.agents()]
        held.release()
        spawner.join(WAIT)
        assert [a.id for a in started] == ["new"]
        assert rt.get("new") is started[0]
        started[0].followup("hi")
        assert started[0].wait_idle(WAIT)
    check_store(path)


def test_disposed_listeners_that_spawn_never_run_on_the_registrys_worker(rt: Runtime) -> None:
    # Before, a dispose whose agent stopped before the registry registered its death
    # watch had agent/disposed announced inline, on the registry's worker: a listener's
    # spawn then asked the registry that was running it, for good. A short switch
    # interval opens that window (the probe: 5 hangs in 6 runs of 200 disposals).
    replaced: list[str] = []
    lock = threading.Lock()

    def replace(event: Any) -> None:
        if event.agent.id.startswith("orig-"):
            agent = rt.spawn(model=ScriptedModel.echo(), session_id="re-" + event.agent.id)
            with lock:
                replaced.append(agent.id)

    rt.on("agent/disposed", replace)
    agents = [rt.spawn(model=ScriptedModel.echo(), session_id=f"orig-{i}") for i in range(120)]
    outcomes: list[bool] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [
            threading.Thread(
                target=lambda part: outcomes.extend(a.dispose(WAIT) for a in part),
                args=(agents[i::4],),
            )
            for i in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(2 * WAIT)
    finally:
        sys.setswitchinterval(interval)
    assert outcomes == [True] * len(agents)
    assert sorted(replaced) == sorted("re-" + a.id for a in agents)


def test_passivating_another_agent_from_a_sync_listener_gets_a_lent_worker(
    rt: Runtime,
) -> None:
    other = rt.spawn(model=ScriptedModel.echo())
    other.followup("warm up")
    assert other.wait_idle(WAIT)
    me = rt.spawn(model=ScriptedModel.echo())
    outcome: list[bool] = []
    done = threading.Event()

    def passivate_other(event: Any) -> None:
        outcome.append(other.passivate(timeout=WAIT))  # its stop needs a worker
        done.set()

    me.on("agent/settled", passivate_other)
    me.followup("go")
    assert done.wait(2 * WAIT)
    assert outcome == [True] and other.passive
    other.followup("back")
    assert other.wait_idle(WAIT)


def test_resume_from_the_disposed_listener_of_an_agent_that_crashed_while_it_was_resumed(
    rt: Runtime,
) -> None:
    # The crash came before the resume that started it returned: its id was still held
    # for that resume, and the second resume was refused as "already in this runtime".
    rt.spawn(model=ScriptedModel.echo(), session_id="a").dispose(WAIT)
    kills: list[None] = []
    resumed: list[object] = []
    done = threading.Event()

    def crash_once(event: Any) -> None:
        if not kills:
            kills.append(None)
            event.agent.kill("crash on purpose")

    def resume_again(event: Any) -> None:
        if kills and not resumed:
            try:
                resumed.append(rt.resume("a", model=ScriptedModel.echo()))
            except Exception as err:
                resumed.append(err)
            done.set()

    rt.on("agent/created", crash_once)
    rt.on("agent/disposed", resume_again)
    rt.resume("a", model=ScriptedModel.echo())
    assert done.wait(WAIT)
    assert isinstance(resumed[0], Agent) and rt.get("a") is resumed[0]
    resumed[0].followup("after the crash")
    assert resumed[0].wait_idle(WAIT)
