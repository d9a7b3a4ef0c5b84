"""spawn(restart=RestartPolicy(...)): a crashed agent is resumed from its log, within a
limit, after a backoff on the runtime's scheduler; past the limit it stays down."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from runtime import (
    AgentDisposedError,
    AgentRestart,
    Interrupted,
    RestartPolicy,
    Runtime,
    ScriptedModel,
    TurnEnd,
)

from .conftest import WAIT, ScenarioClock
from .models import GateModel


class Restarts:
    """Records ``agent/restart`` events; waits for a count of them."""

    def __init__(self, rt: Runtime) -> None:
        self.events: list[AgentRestart] = []
        self._changed = threading.Condition()
        rt.on("agent/restart", self._record)

    def _record(self, event: AgentRestart) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    def wait(self, count: int) -> list[AgentRestart]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.events) >= count, WAIT), self.events
            return list(self.events)


def test_a_supervised_agent_killed_three_times_restarts_three_times_then_gives_up(
    rt: Runtime, scenario_clock: ScenarioClock
) -> None:
    restarts = Restarts(rt)
    disposed: list[Any] = []
    rt.on("agent/disposed", lambda e: disposed.append((e.agent, e.agent.crash)))
    policy = RestartPolicy(max_restarts=3, within_s=60, backoff_s=0.01, jitter=0.5, seed=1)
    agent = rt.spawn(model=ScriptedModel.echo(), restart=policy)
    agent_id = agent.id
    assert agent.ask("before", timeout=WAIT).text == "before"
    handles = [agent]
    for n in range(1, 4):
        handles[-1].kill(f"crash {n}")
        scenario_clock.elapse(rt, 0.1)  # past the jittered back-off
        event = restarts.wait(n)[-1]
        assert (event.kind, event.restarts) == ("restarted", n)
        assert f"crash {n}" in event.error
        assert event.agent is rt.get(agent_id) and event.agent is not handles[-1]
        handles.append(event.agent)
        # the new handle works and continues the same log
        assert handles[-1].ask(f"after {n}", timeout=WAIT).text == f"after {n}"
    with pytest.raises(AgentDisposedError, match="is disposed"):
        handles[0].followup("the crashed handle stays disposed")
    handles[-1].kill("crash 4")
    gave_up = restarts.wait(4)[-1]
    assert gave_up.kind == "gave-up" and gave_up.restarts == 3 and "crash 4" in gave_up.error
    with pytest.raises(KeyError, match="no live agent"):
        rt.get(agent_id)  # it stays down
    assert [crash is not None for _, crash in disposed] == [True] * 4
    resumed = rt.resume(agent_id, model=ScriptedModel.echo())
    assert len(resumed.session.messages()) == 8  # 4 asks, 4 answers: one log throughout
    resumed.dispose(WAIT)


def test_the_turn_a_crash_cut_short_is_reported_interrupted_not_run_again(
    rt: Runtime, scenario_clock: ScenarioClock
) -> None:
    restarts = Restarts(rt)
    model = GateModel()
    agent = rt.spawn(model=model, restart=RestartPolicy(backoff_s=0.01))
    pending = agent.submit("in flight")
    assert model.wait_reached(1)
    agent.kill("mid-turn")
    assert pending.result(WAIT).status == "crashed"
    scenario_clock.elapse(rt, 0.02)
    event = restarts.wait(1)[0]
    assert event.kind == "restarted" and event.interrupted_turn == 1
    ends = [e.data for e in event.agent.session.events() if isinstance(e.data, TurnEnd)]
    assert [type(end.reason) for end in ends] == [Interrupted]
    assert len(model.requests) == 1  # not re-run
    event.agent.dispose(WAIT)


def test_a_disposed_supervised_agent_is_not_restarted(
    rt: Runtime, scenario_clock: ScenarioClock
) -> None:
    restarts = Restarts(rt)
    agent = rt.spawn(model=ScriptedModel.echo(), restart=RestartPolicy(backoff_s=0.01))
    assert agent.dispose(WAIT)
    other = rt.spawn(model=ScriptedModel.echo(), restart=RestartPolicy(backoff_s=0.01))
    other.kill("crash")
    scenario_clock.elapse(rt, 0.02)
    assert [e.agent.id for e in restarts.wait(1)] == [other.id]  # only the crashed one
    with pytest.raises(KeyError, match="no live agent"):
        rt.get(agent.id)


def test_the_backoff_waits_on_the_scheduler_and_grows(
    rt: Runtime, scenario_clock: ScenarioClock
) -> None:
    policy = RestartPolicy(max_restarts=5, backoff_s=0.05, factor=3, jitter=0)
    restarts = Restarts(rt)
    agent = rt.spawn(model=ScriptedModel.echo(), restart=policy)
    before = rt.scheduler.statistics().fired
    agent.kill("crash")
    scenario_clock.elapse(rt, 0.05)
    restarts.wait(1)[0].agent.kill("crash again")
    scenario_clock.elapse(rt, 0.2)  # past 0.05 * 3
    restarts.wait(2)
    assert rt.scheduler.statistics().fired - before >= 2  # each restart was a timer


def test_a_restart_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="jitter"):
        RestartPolicy(jitter=1.5)
    with pytest.raises(ValueError, match="max_restarts"):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(ValueError, match="backoff_s"):
        RestartPolicy(backoff_s=0)
