"""Hostile tool calls and tool returns: malformed call arguments, returns that are not
JSON, too big, or ill-typed each become an error result the model sees; the turn goes on
and the log reads back."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from runtime import (
    Deny,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolReturn,
    tool,
)

from .hostile_support import LIMIT, Opaque, assert_alive, cycle, facts, nested, probe, run_turn

# --------------------------------------------------------------------------- tool calls


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        "[1, 2]",
        '{"x": NaN}',
        '{"x": 1}',
        '{"y": "unknown field"}',
        "[" * 100_000 + "]" * 100_000,
    ],
    ids=["broken", "an array", "NaN", "a wrong type", "an unknown field", "100,000 deep"],
)
def test_malformed_tool_call_arguments_get_an_invalid_arguments_result_and_the_turn_goes_on(
    rt: Runtime, raw: str
) -> None:
    model = ScriptedModel([[ToolCall(name="probe", raw_arguments=raw)], "done"])
    agent = run_turn(rt, model, [probe])
    (result,) = facts(agent, "tool/result")
    assert result.error is not None and result.error.code == "INVALID_ARGUMENTS"
    assert [e.reason.kind for e in facts(agent, "turn/end")] == ["completed"]
    assert model.requests == 2  # the model saw the error result and answered
    assert_alive(rt, agent)


TOOL_RETURNS: dict[str, Callable[[], Any]] = {
    "NaN": lambda: math.nan,
    "Infinity": lambda: {"score": math.inf},
    "a custom object": Opaque,
    "a list nested 100,000 deep": lambda: nested(100_000),
    "a cycle": cycle,
    "5 MiB of text": lambda: "x" * (5 << 20),
    "a lone surrogate": lambda: "bad \ud800 text",
}


@pytest.mark.parametrize("name", list(TOOL_RETURNS))
def test_a_tool_return_that_is_not_json_or_too_big_becomes_an_error_result(
    rt: Runtime, name: str
) -> None:
    make = TOOL_RETURNS[name]

    @tool
    def hostile() -> Any:
        """Return something hostile."""
        return make()

    agent = run_turn(rt, ScriptedModel([[ToolCall(name="hostile")], "done"]), [hostile])
    (result,) = facts(agent, "tool/result")
    assert result.error is not None and result.error.code == "TOOL_FAILED", result
    assert len(result.message.content[0].text) < LIMIT
    assert [e.reason.kind for e in facts(agent, "turn/end")] == ["completed"]
    assert_alive(rt, agent)


@pytest.mark.parametrize("value", [{1, 2}, b"bytes", (1, 2)], ids=["a set", "bytes", "a tuple"])
def test_a_tool_return_msgspec_can_encode_reaches_the_model_as_json_text(
    rt: Runtime, value: Any
) -> None:
    @tool
    def lossy() -> Any:
        """Return a set, bytes or a tuple."""
        return value

    agent = run_turn(rt, ScriptedModel([[ToolCall(name="lossy")], "done"]), [lossy])
    (result,) = facts(agent, "tool/result")
    assert result.error is None
    json.loads(result.message.content[0].text)
    assert_alive(rt, agent)


ILL_TYPED: dict[str, tuple[str | None, Any, str]] = {
    # case: (the hook that returns it, or None for the body; what it returns; the code)
    "pre-execute Deny(reason=123)": ("tools/pre-execute", Deny(reason=123), "TOOL_DENIED"),
    "pre-execute Deny(reason=None)": ("tools/pre-execute", Deny(reason=None), "TOOL_DENIED"),
    "body ToolReturn(concludes_turn=1)": (None, ToolReturn("x", 1), "TOOL_FAILED"),
    "execute ToolReturn(concludes_turn=1)": ("tools/execute", ToolReturn("x", 1), "TOOL_FAILED"),
    "post-execute ToolReturn(concludes_turn='yes')": (
        "tools/post-execute",
        ToolReturn("x", "yes"),
        "TOOL_FAILED",
    ),
}


@pytest.mark.parametrize("case", list(ILL_TYPED))
def test_an_ill_typed_deny_or_tool_return_becomes_an_error_result_and_the_log_reads_back(
    rt: Runtime, case: str
) -> None:
    hook, returned, code = ILL_TYPED[case]

    @tool
    def answer() -> Any:
        """Answer, or return the ill-typed value."""
        return returned if hook is None else "fine"

    if hook is not None:
        rt.on(hook, lambda event, next_: returned)
    agent = run_turn(rt, ScriptedModel([[ToolCall(name="answer")], "done"]), [answer])
    (result,) = facts(agent, "tool/result")  # the session reads back
    assert result.error is not None and result.error.code == code, result
    assert result.concludes_turn is False
    assert [e.reason.kind for e in facts(agent, "turn/end")] == ["completed"]
    events = rt.store.read(agent.id)
    assert [e.type for e in events].count("tool/result") == 1
    assert_alive(rt, agent)
