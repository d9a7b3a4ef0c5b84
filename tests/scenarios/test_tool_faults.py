"""Scenario tests of faults in the tool pipeline (CONTRACT section 6): whatever a tool,
its argument conversion or a tool listener raises, the call gets a ``tool/result`` and
the log stays valid."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.toolphase import RESULT_ROOM
from runtime import Runtime, ScriptedModel, ToolCall, tool
from storage.events import (
    FinishChunk,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
)

from .conftest import WAIT, ScenarioClock, check_store


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


@dataclasses.dataclass
class Span:
    lo: int
    hi: int

    def __post_init__(self) -> None:
        assert self.lo <= self.hi, "lo must be <= hi"


class Positive(msgspec.Struct):
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise KeyError("negative")


@tool
def span(r: Span) -> int:
    return r.hi - r.lo


@tool
def positive(p: Positive) -> int:
    return p.n


class HandTool:
    """A hand-written tool whose argument conversion raises what it happens to raise."""

    spec = ToolSpec(name="hand", description="hand-written", parameters={"type": "object"})
    concurrency_safe = False
    timeout_s = None
    is_async = False

    def prepare(self, arguments: Any) -> int:
        return int(arguments["n"])  # KeyError, ValueError

    def run(self, prepared: int) -> int:
        return prepared * 2


CONVERSIONS = {
    "a dataclass argument asserting": (
        ToolCall(name="span", arguments={"r": {"lo": 5, "hi": 1}}),
        "AssertionError: lo must be <= hi",
    ),
    "a Struct argument raising KeyError": (
        ToolCall(name="positive", arguments={"p": {"n": -1}}),
        "KeyError: 'negative'",
    ),
    "a hand-written prepare raising ValueError": (
        ToolCall(name="hand", arguments={"n": "abc"}),
        "ValueError: invalid literal",
    ),
    "a hand-written prepare raising KeyError": (
        ToolCall(name="hand", arguments={}),
        "KeyError: 'n'",
    ),
}


@pytest.mark.parametrize("case", list(CONVERSIONS))
def test_an_argument_conversion_raising_anything_is_an_invalid_arguments_result_and_the_turn_goes_on(
    rt: Runtime, case: str
) -> None:
    # Before, it crashed the agent, whose turn wrote step/end over the unanswered call:
    # a log the invariant checker refused for good, which no resume could repair.
    call, named = CONVERSIONS[case]
    seen: list[list[Any]] = []

    def reply(request: Any) -> Any:
        seen.append(request.messages)
        return [call] if len(seen) == 1 else "ok"

    agent = rt.spawn(model=ScriptedModel(reply), tools=[span, positive, HandTool()])
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    (result,) = results(agent)
    assert result.error is not None and result.error.code == "INVALID_ARGUMENTS"
    assert named in result.error.message
    assert agent.session.events()[-1].data.reason.kind == "completed"
    kinds = ["UserMessage", "AssistantMessage", "ToolMessage"]
    assert [type(m).__name__ for m in seen[1]] == kinds


class BrokenTool(HandTool):
    """A hand-written tool one of whose properties raises once the call was admitted."""

    def __init__(self, broken: str) -> None:
        self.broken = broken
        self.admitted = False

    def prepare(self, arguments: Any) -> int:
        self.admitted = True
        return super().prepare(arguments)

    def __getattribute__(self, name: str) -> Any:
        get = object.__getattribute__
        if name == get(self, "broken") and get(self, "admitted"):
            raise RuntimeError(f"{name} is broken")
        return get(self, name)


@pytest.mark.parametrize("broken", ["concurrency_safe", "timeout_s"])
def test_a_tool_that_fails_between_its_call_and_its_result_gets_a_result_and_the_turn_ends_error(
    rt: Runtime, broken: str
) -> None:
    # Past its arguments nothing is expected to raise; when something does, the call is
    # answered before its step closes and the turn ends error (before: a crashed agent
    # and a step/end over the unanswered call).
    agent = rt.spawn(
        model=ScriptedModel([[ToolCall(name="hand", arguments={"n": 1})], "ok"]),
        tools=[BrokenTool(broken)],
    )
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    (result,) = results(agent)
    assert result.error is not None and result.error.code == "TOOL_FAILED"
    assert f"{broken} is broken" in result.error.message
    end = agent.session.events()[-1].data
    assert end.reason.kind == "error" and "the tool phase failed" in end.reason.error.message
    agent.followup("again")  # the agent lives on
    assert agent.wait_idle(WAIT)


class CallIdModel:
    """Calls ``echo`` once with the call id it is given, then answers "done"."""

    provider = "test"
    name = "call-id"

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.requests = 0

    async def stream(self, request: Any) -> AsyncIterator[StreamChunk]:
        self.requests += 1
        if self.requests == 1:
            yield ToolCallDelta(index=0, call_id=self.call_id, name="echo", arguments_delta="{}")
            yield FinishChunk(reason="tool-calls")
        else:
            yield TextDelta(text="done")
            yield FinishChunk(reason="stop")


LIMIT = 20_000


@pytest.mark.parametrize("spare", [400, 350, 300], ids=lambda n: f"{n} bytes spare")
@pytest.mark.parametrize("long", ["name", "call id"])
def test_a_tool_call_whose_id_or_name_leaves_no_room_for_its_result_fails_the_request(
    store_path: Path, long: str, spare: int
) -> None:
    # Before, its tool/call fitted the event limit but no tool/result could (not even
    # the short "could not be logged" one): the agent crashed after the body ran, and
    # the resume's repair could not log one either.
    ran: list[int] = []

    @tool
    def echo() -> str:
        ran.append(1)
        return "echo"

    model: Any
    if long == "name":  # an unknown tool, whose result names it
        model = ScriptedModel([[ToolCall(name="n" * (LIMIT - spare), raw_arguments="")], "x"])
    else:
        model = CallIdModel("i" * (LIMIT - spare))
    rt = Runtime.open(store_path, max_event_bytes=LIMIT)
    try:
        agent = rt.spawn(model=model, tools=[echo])
        agent.followup("go")
        assert agent.wait_idle(WAIT)
        types = [e.type for e in agent.session.events()]
        assert "tool/call" not in types and not ran
        end = agent.session.events()[-1].data
        assert end.reason.kind == "error"
        assert "no result for it could be logged" in end.reason.error.message
        agent.followup("again")  # the agent lives on
        assert agent.wait_idle(WAIT)
    finally:
        rt.close()
    check_store(store_path)


def test_a_tool_call_that_leaves_just_enough_room_for_its_result_is_answered(
    store_path: Path,
) -> None:
    # The guard of the test above: the refusal takes only calls nothing could answer.
    name = "n" * (LIMIT - RESULT_ROOM - len('""') * 2 - len('"call-0-1"'))
    rt = Runtime.open(store_path, max_event_bytes=LIMIT)
    try:
        agent = rt.spawn(model=ScriptedModel([[ToolCall(name=name, raw_arguments="")], "ok"]))
        agent.followup("go")
        assert agent.wait_idle(WAIT)
        (result,) = results(agent)
        assert result.error is not None and result.error.code == "UNKNOWN_TOOL"
        assert agent.session.events()[-1].data.reason.kind == "completed"
    finally:
        rt.close()
    check_store(store_path)


def test_a_timed_out_call_goes_through_post_execute_which_may_replace_its_result(
    rt: Runtime, scenario_clock: ScenarioClock
) -> None:
    # CONTRACT 6: post-execute may replace the result. Before, a timeout skipped it
    # (a body that raised did reach it).
    release = threading.Event()
    seen: list[str | None] = []

    @tool(timeout=0.05)
    def slow() -> str:
        release.wait(WAIT)
        return "late"

    def post(event: Any, next_: Any) -> Any:
        seen.append(event.error)
        return "replaced" if event.call_id == first_call else next_()

    first_call = "call-0-1"  # ScriptedModel's id of its first call
    agent = rt.spawn(model=ScriptedModel([[ToolCall(name="slow")] * 2, "ok"]), tools=[slow])
    agent.on("tools/post-execute", post)
    agent.followup("go")
    for _ in range(2):  # one call after the other (not concurrency_safe)
        scenario_clock.elapse(rt, 0.05)
    assert agent.wait_idle(WAIT)
    release.set()
    assert seen == ["ToolTimeout: the tool timed out"] * 2
    first, second = results(agent)
    assert first.error is None and first.message.content[0].text == "replaced"
    assert second.error is not None and second.error.code == "TOOL_TIMEOUT"


def test_a_tool_with_positional_only_parameters_gets_them_by_position(rt: Runtime) -> None:
    # Before, @tool accepted it and advertised the parameter, and every call failed.
    @tool
    def scale(value: int, /, factor: int = 2) -> int:
        return value * factor

    calls = [
        ToolCall(name="scale", arguments={"value": 3}),
        ToolCall(name="scale", arguments={"value": 3, "factor": 5}),
    ]
    agent = rt.spawn(model=ScriptedModel([calls, "ok"]), tools=[scale])
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert [(r.error, r.message.content[0].text) for r in results(agent)] == [
        (None, "6"),
        (None, "15"),
    ]


@pytest.mark.parametrize("event", ["tools/pre-execute", "tools/execute", "tools/post-execute"])
def test_a_listener_cannot_rewrite_the_arguments_the_log_holds_and_the_body_runs(
    rt: Runtime, event: str
) -> None:
    # Before, a pre-execute listener's edit reached the later listeners but not the body
    # or the log: what listeners saw was neither what ran nor what the log said.
    ran: list[Any] = []
    seen: list[Any] = []
    refused: list[str] = []

    @tool
    def echo(x: int, tags: list[str]) -> int:
        ran.append((x, tags))
        return x

    def edit(payload: Any, next_: Any) -> Any:
        seen.append(payload.arguments)
        for change in (
            lambda: payload.arguments.__setitem__("x", 999),
            lambda: payload.arguments.update(x=999),
            lambda: payload.arguments.pop("x"),
            lambda: payload.arguments["tags"].append("evil"),
        ):
            try:
                change()
            except (TypeError, AttributeError) as err:
                refused.append(type(err).__name__)
        return next_()

    call = ToolCall(name="echo", arguments={"x": 1, "tags": ["a"]})
    agent = rt.spawn(model=ScriptedModel([[call], "ok"]), tools=[echo])
    agent.on(event, edit)
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert len(refused) == 4
    assert ran == [(1, ["a"])]
    assert seen == [{"x": 1, "tags": ("a",)}]
    assert json.loads(json.dumps(seen[0])) == {"x": 1, "tags": ["a"]}  # still JSON
    (result,) = results(agent)
    assert result.error is None and result.message.content[0].text == "1"


@pytest.mark.parametrize("number", ["1e400", "-1e400", "[1e999]"])
def test_a_number_out_of_the_float_range_in_the_arguments_is_invalid_arguments(
    rt: Runtime, number: str
) -> None:
    # Before, 1e400 reached the body as inf, though Infinity itself was refused.
    ran: list[Any] = []

    @tool
    def take(v: Any) -> str:
        ran.append(v)
        return "ran"

    call = ToolCall(name="take", raw_arguments=f'{{"v": {number}}}')
    agent = rt.spawn(model=ScriptedModel([[call], "ok"]), tools=[take])
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    (result,) = results(agent)
    assert result.error is not None and result.error.code == "INVALID_ARGUMENTS"
    assert "1e" in result.error.message and not ran
