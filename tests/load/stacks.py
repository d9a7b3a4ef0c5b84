"""A real agent stack for the load tests: ``corral bench --agent tests.load.stacks:factory``.

A tool (``weather``), a system prompt, a simulated model that calls the tool on every
turn, and two listeners registered on the runtime: an ``agent/request`` waterfall that
sets the temperature (so its work shows in every logged ``request/header``) and an
``agent/turn-stopping`` listener that takes a little time (so the breakdown's hooks
part has something to measure).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from runtime import RequestConfig, Runtime, tool
from runtime.load import AgentStack, Dist, SimulatedModel

TEMPERATURE = 0.25
SYSTEM = "You answer weather questions in one sentence."
HOOK_WAIT_S = 0.005

calls = {"request": 0, "stopping": 0}
_lock = threading.Lock()
_pause = threading.Event()  # never set: a hook's wait is bounded by its timeout


@tool(concurrency_safe=True)
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"sunny in {city}"


def factory(rt: Runtime) -> AgentStack:
    def on_request(event: Any, next_: Callable[[], RequestConfig]) -> RequestConfig:
        with _lock:
            calls["request"] += 1
        config = next_()
        return RequestConfig(provider=config.provider, model=config.model, temperature=TEMPERATURE)

    def on_stopping(event: Any) -> None:
        with _lock:
            calls["stopping"] += 1
        _pause.wait(HOOK_WAIT_S)  # a listener doing a little work

    rt.on("agent/request", on_request)
    rt.on("agent/turn-stopping", on_stopping)
    model = SimulatedModel(
        ttft_s=Dist(0.02, 0.01),
        tokens_per_s=Dist(400.0, 100.0),
        reply_tokens=Dist(12.0, 4.0),
        tool_probability=1.0,
        seed=7,
    )
    return AgentStack(model=model, tools=[weather], system=SYSTEM)


def not_a_stack(rt: Runtime) -> dict[str, object]:
    return {"model": "scripted:echo"}


REQUEST_WAIT_S = 0.03
GATE_WAIT_S = 0.01
CHECKPOINT_WAIT_S = 0.01


def slow_hooks(rt: Runtime) -> AgentStack:
    """A stack whose ``agent/request`` listener takes 30 ms, whose ``tools/pre-execute``
    gate and ``session/flush`` checkpoint listener 10 ms each, over a model that answers its first chunk in 10 ms and calls the tool
    on each turn's first step: the listeners' time must show under hooks, not in the
    time to first chunk or the tools."""

    def on_request(event: Any, next_: Callable[[], RequestConfig]) -> RequestConfig:
        _pause.wait(REQUEST_WAIT_S)
        return next_()

    def gate(event: Any, next_: Callable[[], Any]) -> Any:
        _pause.wait(GATE_WAIT_S)
        return next_()

    def checkpoint(event: Any) -> None:
        _pause.wait(CHECKPOINT_WAIT_S)

    rt.on("agent/request", on_request)
    rt.on("tools/pre-execute", gate)
    rt.on("session/flush", checkpoint)
    model = SimulatedModel(
        ttft_s=Dist(0.01, 0.0),
        tokens_per_s=Dist(1000.0, 0.0),
        reply_tokens=Dist(4.0, 0.0),
        tool_probability=1.0,
    )
    return AgentStack(model=model, tools=[weather])
