"""What the hostile-input tests share: a probe tool, one-turn runs, the facts of a log,
and the check that an agent (and a new one) still works after a hostile input."""

from __future__ import annotations

from typing import Any

from runtime import (
    Agent,
    Runtime,
    ScriptedModel,
    tool,
)

from .conftest import WAIT

LIMIT = 4 << 20  # the default max_event_bytes


@tool
def probe(x: str = "") -> str:
    """Answer ok."""
    return "ok"


def run_turn(rt: Runtime, model: Any, tools: Any = (), text: str = "go") -> Agent:
    agent = rt.spawn(model=model, tools=list(tools))
    agent.followup(text)
    assert agent.wait_idle(WAIT)
    return agent


def facts(agent: Agent, kind: str) -> list[Any]:
    return [e.data for e in agent.session.events() if e.type == kind]


def assert_alive(rt: Runtime, agent: Agent) -> None:
    """The agent did not crash and still does work; so does a new one."""
    assert agent.crash is None, agent.crash
    agent.followup("still there?")
    assert agent.wait_idle(WAIT)
    assert facts(agent, "turn/end")[-1].reason.kind == "completed"
    fresh = run_turn(rt, ScriptedModel.echo())
    assert facts(fresh, "turn/end")[-1].reason.kind == "completed"


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


class Opaque:
    """An object no JSON encoder knows."""


def cycle() -> list[Any]:
    """A list that holds itself."""
    loop: list[Any] = []
    loop.append(loop)
    return loop
