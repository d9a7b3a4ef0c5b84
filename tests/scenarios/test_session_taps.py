"""``rt.tap_sessions``: every append of every live agent's session, handed over as it is
(the cheap way ``runtime.telemetry`` sees the facts), before the session/event listeners."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from runtime import Runtime, ScriptedModel
from storage import Event

from .conftest import WAIT


def _by_agent(seen: list[tuple[Any, Event]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for agent, event in seen:
        out.setdefault(agent.id, []).append(event.seq)
    return out


def test_a_tap_sees_every_later_append_of_agents_live_before_and_after_it(rt: Runtime) -> None:
    before = rt.spawn(model=ScriptedModel.echo())
    before.followup("before the tap")
    assert before.wait_idle(WAIT)
    first_new = before.session.last_seq + 1
    seen: list[tuple[Any, Event]] = []
    rt.tap_sessions(lambda agent, event: seen.append((agent, event)))
    after = rt.spawn(model=ScriptedModel.echo())
    for agent in (before, after):
        agent.followup("after")
        assert agent.wait_idle(WAIT)
    by_agent = _by_agent(seen)
    assert by_agent[before.id] == list(range(first_new, before.session.last_seq + 1))
    assert by_agent[after.id] == list(range(after.session.last_seq + 1))
    # The events are the committed ones themselves, and the handle is the agent's.
    assert all(agent is rt.get(agent.id) for agent, _ in seen)
    logged = {e.seq: e for e in after.session.events()}
    assert all(event == logged[event.seq] for agent, event in seen if agent is after)


def test_a_tap_runs_before_the_session_event_listeners(rt: Runtime) -> None:
    order: list[tuple[str, int]] = []
    rt.on("session/event", lambda e: order.append(("listener", e.event.seq)))
    rt.tap_sessions(lambda agent, event: order.append(("tap", event.seq)))
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    seqs = range(agent.session.last_seq + 1)
    assert order == [(who, seq) for seq in seqs for who in ("tap", "listener")]


def test_a_raising_tap_is_contained_and_the_others_and_listeners_still_see_the_fact(
    rt: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(agent: Any, event: Event) -> None:
        raise RuntimeError("tap broke")

    tapped: list[int] = []
    heard: list[int] = []
    rt.tap_sessions(broken)
    rt.tap_sessions(lambda agent, event: tapped.append(event.seq))
    rt.on("session/event", lambda e: heard.append(e.event.seq))
    agent = rt.spawn(model=ScriptedModel.echo())
    with caplog.at_level(logging.ERROR, logger="corral.runtime"):
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
    every = list(range(agent.session.last_seq + 1))
    assert tapped == every and heard == every
    assert [e.type for e in agent.session.events()][-1] == "turn/end"  # the turn went on
    failures = [r for r in caplog.records if "session tap" in r.getMessage()]
    assert len(failures) == len(every)
    assert all(r.exc_info is not None and "tap broke" in str(r.exc_info[1]) for r in failures)


def test_a_disposed_tap_sees_nothing_more(rt: Runtime) -> None:
    seen: list[int] = []
    dispose = rt.tap_sessions(lambda agent, event: seen.append(event.seq))
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("one")
    assert agent.wait_idle(WAIT)
    count = len(seen)
    assert count == agent.session.last_seq + 1
    dispose()
    dispose()  # idempotent
    agent.followup("two")
    assert agent.wait_idle(WAIT)
    assert len(seen) == count


def test_a_tap_keeps_seeing_an_agent_after_it_is_passivated(rt: Runtime) -> None:
    seen: list[tuple[Any, Event]] = []
    rt.tap_sessions(lambda agent, event: seen.append((agent, event)))
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("one")
    assert agent.wait_idle(WAIT)
    assert agent.passivate()
    agent.followup("two")  # rehydrates the agent over a new session object
    assert agent.wait_idle(WAIT)
    assert _by_agent(seen)[agent.id] == list(range(agent.session.last_seq + 1))


def test_tap_sessions_refuses_what_is_not_callable_and_a_closed_runtime(rt: Runtime) -> None:
    with pytest.raises(TypeError, match="callable"):
        rt.tap_sessions("not a function")  # type: ignore[arg-type]
    rt.close()
    with pytest.raises(RuntimeError, match="closed"):
        rt.tap_sessions(lambda agent, event: None)
