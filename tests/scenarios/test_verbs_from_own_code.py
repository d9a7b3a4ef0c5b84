"""Blocking verbs called from code the runtime runs for an agent: its tool bodies (sync in
the blocking pool, async on the I/O loop, and threads an async body starts), its
``tools/execute`` listeners and the sync listeners of its deferred chains. None of them
waits for the agent that is waiting for it, and nothing blocks the I/O loop: ``dispose()``
starts the disposal and returns, ``wait_idle()`` is refused, ``rt.close()`` is refused
(RELIABILITY section 7; README, the ``Agent`` verbs)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from actors.errors import AgentStateError
from runtime import Agent, Runtime, ScriptedModel, ToolCall, tool

from .conftest import WAIT
from .models import GateModel

KINDS = [
    "sync body",
    "async body",
    "thread of an async body",
    "sync tools/execute listener",
    "sync listener of a deferred chain",
]
LONG = 20.0  # what a verb that waits for itself would wait: past WAIT


class Acting:
    """An agent whose own code (of ``kind``) calls ``verb(agent)`` once, recording what
    it returned or raised in ``outcome`` and setting ``done``."""

    def __init__(self, rt: Runtime, kind: str, verb: Callable[[Agent], object]) -> None:
        self.outcome: list[object] = []
        self.done = threading.Event()
        script: list[Any] = [[ToolCall(name="act")], "done"]
        if kind == "sync body":

            @tool(name="act")
            def act_sync() -> str:
                self._act(verb)
                return "acted"

            tools = [act_sync]
        elif kind in ("async body", "thread of an async body"):

            @tool(name="act")
            async def act_async() -> str:
                if kind == "async body":
                    self._act(verb)
                else:
                    await asyncio.to_thread(self._act, verb)
                return "acted"

            tools = [act_async]
        else:

            @tool(name="act")
            def plain() -> str:
                return "acted"

            tools = [plain]
            if kind == "sync listener of a deferred chain":
                script = ["done"]
        self.agent = rt.spawn(model=ScriptedModel(script), tools=tools)
        if kind == "sync tools/execute listener":

            def around(event: Any, next_: Callable[[], Any]) -> Any:
                self._act(verb)
                return next_()

            self.agent.on("tools/execute", around)
        elif kind == "sync listener of a deferred chain":

            async def first(event: Any) -> None:
                return None  # an async listener defers the chain: the next runs in the pool

            def second(event: Any) -> None:
                if not self.done.is_set():
                    self._act(verb)

            self.agent.on("agent/turn-stopping", first)
            self.agent.on("agent/turn-stopping", second)

    def _act(self, verb: Callable[[Agent], object]) -> None:
        try:
            self.outcome.append(verb(self.agent))
        except Exception as err:  # recorded for the test to look at
            self.outcome.append(err)
        finally:
            self.done.set()


def ends(agent: Agent) -> list[str]:
    return [e.data.reason.kind for e in agent.session.events() if e.type == "turn/end"]


@pytest.mark.parametrize("kind", KINDS)
def test_dispose_from_code_the_agent_runs_starts_the_disposal_without_waiting_for_itself(
    rt: Runtime, kind: str
) -> None:
    acting = Acting(rt, kind, lambda agent: agent.dispose(timeout=LONG))
    acting.agent.followup("go")
    assert acting.done.wait(WAIT), "dispose() waited for the code the disposal waits for"
    assert acting.outcome == [False], "it returned at once, the disposal under way"
    assert acting.agent.dispose(WAIT)  # shares the disposal the agent's code started
    assert ends(acting.agent)[-1] == "aborted"


@pytest.mark.parametrize("kind", KINDS)
def test_wait_idle_from_code_the_agent_runs_is_refused_instead_of_waiting_for_itself(
    rt: Runtime, kind: str
) -> None:
    acting = Acting(rt, kind, lambda agent: agent.wait_idle(timeout=LONG))
    acting.agent.followup("go")
    assert acting.done.wait(WAIT), "wait_idle() waited for itself"
    assert acting.agent.wait_idle(WAIT)
    [refusal] = acting.outcome
    assert isinstance(refusal, AgentStateError), refusal
    assert "wait for itself" in str(refusal)
    assert ends(acting.agent) == ["completed"]


@pytest.mark.parametrize("kind", ["sync body", "async body", "sync tools/execute listener"])
def test_rt_close_from_a_tool_body_is_refused_and_the_runtime_goes_on(
    rt: Runtime, kind: str
) -> None:
    acting = Acting(rt, kind, lambda agent: rt.close(timeout=5.0))
    acting.agent.followup("go")
    assert acting.done.wait(WAIT)
    [refusal] = acting.outcome
    assert isinstance(refusal, RuntimeError), refusal  # a sync body's close used to run
    assert "tool body" in str(refusal)
    assert acting.agent.wait_idle(WAIT)
    acting.agent.followup("still open")
    assert acting.agent.wait_idle(WAIT)
    assert ends(acting.agent) == ["completed", "completed"]


def test_blocking_verbs_of_another_agent_from_async_code_never_freeze_the_io_loop(
    rt: Runtime,
) -> None:
    gate = GateModel()
    streaming = rt.spawn(model=gate)  # its stream, parked at the gate, lives on the loop
    streaming.followup("stream")
    assert gate.wait_reached(1)
    outcome: dict[str, object] = {}
    done = threading.Event()

    async def on_settled(event: Any) -> None:
        verbs = {
            "wait_idle": lambda: streaming.wait_idle(LONG),
            "dispose": lambda: streaming.dispose(LONG),
        }
        for name, verb in verbs.items():
            try:
                outcome[name] = verb()
            except Exception as err:  # recorded for the test to look at
                outcome[name] = err
        done.set()

    other = rt.spawn(model=ScriptedModel.echo())
    other.on("agent/settled", on_settled)
    other.followup("go")
    assert done.wait(WAIT), "a blocking verb froze the I/O loop"
    assert isinstance(outcome["wait_idle"], AgentStateError), outcome
    assert "asyncio.to_thread" in str(outcome["wait_idle"])
    assert outcome["dispose"] is False
    assert streaming.dispose(WAIT)  # the disposal cancels the stream: on the loop
    assert gate.cancelled.is_set()
    assert ends(streaming) == ["aborted"]


def test_a_sync_tool_body_may_still_wait_for_and_dispose_another_agent(rt: Runtime) -> None:
    gate = GateModel()
    other = rt.spawn(model=gate)
    other.followup("stream")
    assert gate.wait_reached(1)

    @tool
    def wait_for_other() -> str:
        gate.release()
        return f"{other.wait_idle(WAIT)} {other.dispose(WAIT)}"

    agent = rt.spawn(
        model=ScriptedModel([[ToolCall(name="wait_for_other")], "done"]), tools=[wait_for_other]
    )
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    [result] = [e.data for e in agent.session.events() if e.type == "tool/result"]
    assert result.message.content[0].text == "True True"
    assert other.disposed
