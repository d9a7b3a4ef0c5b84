"""Scenario tests of the verbs' ``timeout`` argument: every verb checks it with one
checker (``storage.timeouts.check_timeout``) before it does anything: before, ``nan``
made ``rt.close`` give up on every agent at once and ``flush`` time out at once."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runtime import Agent, Runtime, ScriptedModel

from .conftest import WAIT

VERBS: dict[str, Callable[[Runtime, Agent, Any], object]] = {
    "dispose": lambda rt, agent, t: agent.dispose(t),
    "passivate": lambda rt, agent, t: agent.passivate(t),
    "wait_idle": lambda rt, agent, t: agent.wait_idle(t),
    "passivate_idle": lambda rt, agent, t: rt.passivate_idle(t),
    "remove": lambda rt, agent, t: agent.remove("pending", timeout=t),
    "flush": lambda rt, agent, t: rt.flush(t),
    "session.flush": lambda rt, agent, t: agent.session.flush(t),
    "close": lambda rt, agent, t: rt.close(t),  # refused: the runtime stays open
}
BAD: dict[str, tuple[object, type[Exception]]] = {
    "'5'": ("5", TypeError),
    "nan": (math.nan, TypeError),
    "True": (True, TypeError),
    "-1": (-1, ValueError),
}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("verb", list(VERBS))
def test_a_bad_timeout_is_refused_before_the_verb_does_anything(
    rt: Runtime, verb: str, bad: str
) -> None:
    value, error = BAD[bad]
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.inject("waiting", id="pending")
    with pytest.raises(error, match="timeout is a number of seconds"):
        VERBS[verb](rt, agent, value)
    # nothing was done: no disposal began, the message was not removed, and the agent
    # goes on (its next turn takes the message still pending)
    agent.followup("go on", id="next")
    assert agent.wait_idle(WAIT)
    events = agent.session.events()
    assert [e.type for e in events].count("turn/end") == 1
    assert [e.data.message.id for e in events if e.type == "user/message"] == ["next", "pending"]


@pytest.mark.parametrize("verb", ["dispose", "wait_idle", "passivate"])
def test_an_infinite_timeout_waits_as_long_as_it_takes(rt: Runtime, verb: str) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    assert VERBS[verb](rt, agent, math.inf) is True


TOO_LONG = {
    "9e9 s": 9e9,  # under threading.TIMEOUT_MAX, over what one poll() of the log writer takes
    "TIMEOUT_MAX": threading.TIMEOUT_MAX,
    "1e10 s": 1e10,  # over it
}


@pytest.mark.parametrize("where", ["main thread", "other thread"])
@pytest.mark.parametrize("value", list(TOO_LONG))
@pytest.mark.parametrize("verb", list(VERBS))
def test_a_timeout_too_long_for_the_platform_waits_as_long_as_it_takes(
    store_path: Path, verb: str, value: str, where: str
) -> None:
    # Before, a finite timeout over threading.TIMEOUT_MAX passed the check and raised
    # OverflowError from deep inside the verb after it acted (remove() removed, close()
    # stopped the agents and left the store open for good); rt.flush(9e9) overflowed
    # the log writer's poll().
    rt = Runtime.open(store_path)
    try:
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
        agent.inject("waiting", id="pending")
        outcome: list[object] = []

        def call() -> None:
            try:
                outcome.append(VERBS[verb](rt, agent, TOO_LONG[value]))
            except BaseException as err:
                outcome.append(err)

        if where == "main thread":
            call()
        else:
            thread = threading.Thread(target=call)
            thread.start()
            thread.join(WAIT)
        assert len(outcome) == 1
        assert not isinstance(outcome[0], BaseException), repr(outcome[0])
    finally:
        rt.close()
    with Runtime.open(store_path):  # the store was let go of: it opens again
        pass
