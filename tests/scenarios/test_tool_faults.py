"""Scenario tests of faults in the tool pipeline (CONTRACT section 6): whatever a tool,
its argument conversion or a tool listener raises, the call gets a ``tool/result`` and
the log stays valid."""

from __future__ import annotations

from typing import Any

import pytest

from runtime import Runtime, ScriptedModel, ToolCall, tool

from .conftest import WAIT


def results(agent: Any) -> list[Any]:
    return [e.data for e in agent.session.events() if e.type == "tool/result"]


def _find(name: str) -> str:
    return next(user for user in ["alice", "bob"] if user == name)  # StopIteration: no match


def _passing_sync(event: Any, next_: Any) -> Any:
    return next_()


async def _passing_async(event: Any, next_: Any) -> Any:
    return await next_()


def _stopping(event: Any, next_: Any) -> Any:
    raise StopIteration


STOP_ITERATIONS = {
    "body, sync middleware": (None, [_passing_sync], False),
    "body, async middleware": (None, [_passing_async], False),
    "body with a timeout": (WAIT / 2, [], False),
    "body with a timeout, sync middleware": (WAIT / 2, [_passing_sync], False),
    "sync listener, sync body": (None, [_stopping], False),
    "sync listener, async body": (None, [_stopping], True),
    "sync listener inside an async one": (None, [_passing_async, _stopping], False),
}


@pytest.mark.parametrize("case", list(STOP_ITERATIONS))
def test_a_stop_iteration_from_a_tool_body_or_execute_listener_is_that_calls_failure(
    rt: Runtime, case: str
) -> None:
    # Before, an asyncio future refused the StopIteration and was never settled: the
    # agent hung for good (cancel and dispose could not end it), or, with a timeout,
    # the call was reported TOOL_TIMEOUT.
    timeout, listeners, is_async = STOP_ITERATIONS[case]

    if is_async:

        async def find_user(name: str) -> str:
            return "never reached"

    else:

        def find_user(name: str) -> str:
            return _find(name)

    agent = rt.spawn(
        model=ScriptedModel([[ToolCall(name="find_user", arguments={"name": "carol"})], "ok"]),
        tools=[tool(timeout=timeout)(find_user)],
    )
    for listener in listeners:
        agent.on("tools/execute", listener)
    agent.followup("find carol")
    assert agent.wait_idle(WAIT)
    (result,) = results(agent)
    assert result.error is not None and result.error.code == "TOOL_FAILED"
    assert "StopIteration" in result.error.message
