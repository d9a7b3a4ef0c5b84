"""Hostile and broken input: each gets a clear, typed error; nothing invalid is written;
no other session's data is lost; the runtime stays usable (or a damaged store is
refused with one clear message).

Inputs: malformed tool-call JSON, tool returns and model replies that are not JSON or
too big, messages over the 4 MiB event limit, deeply nested payloads, non-JSON plugin
event data, wrong types to every public verb, and stores that are damaged (unknown
event types written with raw LMDB, a truncated or bit-flipped ``data.mdb``, a future
schema version, a writer lock held by another process). Whatever might kill the
process (LMDB reads pages through a memory map) runs in a child interpreter.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import pytest

from runtime import (
    Agent,
    Deny,
    Enter,
    InvalidMessageError,
    LlmFailure,
    ModelError,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolCall,
    ToolReturn,
    UnknownMessageError,
    UserMessage,
    tool,
)
from storage import (
    InvalidEventError,
    InvalidSessionIdError,
    SchemaVersionError,
    StorageError,
    Store,
    UnknownEventTypeError,
    UnknownSessionError,
)
from storage.events import FinishChunk, TextDelta, ToolCallDelta, ToolSpec, Usage, UsageChunk
from storage.lmdb import layout as layout_module
from storage.lmdb.layout import SCHEMA_VERSION, decode_row, encode_row, event_key

from .conftest import FAST_RETRY, WAIT, check_whole_store, corral, one_error_line, python

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


class _Opaque:
    pass


def _cycle() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


TOOL_RETURNS: dict[str, Callable[[], Any]] = {
    "NaN": lambda: math.nan,
    "Infinity": lambda: {"score": math.inf},
    "a custom object": _Opaque,
    "a list nested 100,000 deep": lambda: nested(100_000),
    "a cycle": _cycle,
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


# --------------------------------------------------------------------------- model replies


@pytest.mark.parametrize("chunks", [1, 8], ids=["one chunk", "eight chunks"])
def test_a_model_reply_over_the_event_limit_ends_the_turn_as_error_and_the_agent_lives_on(
    rt: Runtime, chunks: int
) -> None:
    agent = run_turn(rt, ScriptedModel(["z" * (5 << 20)], chunks=chunks))
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "error"
    assert "limit" in end.reason.error.message
    assert_alive(rt, agent)


def test_a_model_reply_with_a_lone_surrogate_ends_the_turn_as_error(rt: Runtime) -> None:
    agent = run_turn(rt, ScriptedModel(["bad \ud800 reply"]))
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "error"
    assert "encoded" in end.reason.error.message
    assert_alive(rt, agent)


# --------------------------------------------------------------------------- model output
# msgspec does not check field types when a struct is built: a chunk or a failure a model
# builds by hand could reach the log as a record it cannot read back, which would make
# the whole session unreadable. The rt fixture re-reads every log after each test.


class Emits:
    """A hand-written model: each request streams the next of ``replies`` (chunks, or an
    exception raised at that point), then answers "fine" once they are used up."""

    provider = "custom"
    name = "emits"

    def __init__(self, *replies: list[Any]) -> None:
        self.replies = list(replies)

    def _next(self) -> list[Any]:
        if self.replies:
            return self.replies.pop(0)
        return [TextDelta(text="fine"), FinishChunk(reason="stop")]

    async def stream(self, request: Any) -> Any:
        for item in self._next():
            if isinstance(item, BaseException):
                raise item
            yield item


class EmitsInline(Emits):
    """:class:`Emits` answering inline (an ``ImmediateModel``, as ``ScriptedModel``)."""

    def answer_now(self, request: Any) -> list[Any]:
        reply = self._next()
        for item in reply:
            if isinstance(item, BaseException):
                raise item
        return reply


MODEL_KINDS = pytest.mark.parametrize("kind", [Emits, EmitsInline], ids=["streamed", "inline"])


@MODEL_KINDS
@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (TextDelta(text=5), "Expected `str`, got `int` - at `$.text`"),  # type: ignore[arg-type]
        ("hello", "Expected `object`, got `str`"),
        (None, "Expected `object`, got `null`"),
        (FinishChunk(reason="done"), "Invalid enum value 'done'"),  # type: ignore[arg-type]
        (UsageChunk(usage=Usage(input_tokens="many")), "$.usage.inputTokens"),  # type: ignore[arg-type]
        (ToolCallDelta(index=0, call_id="c", name=5), "at `$.name`"),  # type: ignore[arg-type]
    ],
    ids=["text not a str", "a plain str", "None", "unknown finish", "usage a str", "name an int"],
)
def test_a_malformed_chunk_ends_the_turn_as_error_naming_it_and_keeps_the_chunks_before(
    rt: Runtime, kind: type[Emits], bad: Any, said: str
) -> None:
    model = kind(
        [TextDelta(text="before "), bad, TextDelta(text="after"), FinishChunk(reason="stop")]
    )
    agent = run_turn(rt, model)
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "error" and end.reason.error.code == "UNKNOWN"
    assert "malformed stream chunk" in end.reason.error.message
    assert said in end.reason.error.message
    assert [c.chunk for c in facts(agent, "assistant/chunk")] == [TextDelta(text="before ")]
    assert facts(agent, "llm/retry") == []  # UNKNOWN: the model is broken, not busy
    assert_alive(rt, agent)


@MODEL_KINDS
def test_a_model_that_raises_a_plain_exception_ends_the_turn_as_error_not_the_agent(
    rt: Runtime, kind: type[Emits]
) -> None:
    agent = run_turn(rt, kind([TextDelta(text="partial"), RuntimeError("the adapter broke")]))
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "error" and end.reason.error.code == "UNKNOWN"
    assert "the adapter broke" in end.reason.error.message
    assert_alive(rt, agent)


@MODEL_KINDS
@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (LlmFailure(message="slow down", code="rate_limit"), "Invalid enum value 'rate_limit'"),  # type: ignore[arg-type]
        (LlmFailure(message=5, code="SERVER"), "Expected `str`, got `int` - at `$.message`"),  # type: ignore[arg-type]
        (LlmFailure(message="x", code="SERVER", status="500"), "at `$.status`"),  # type: ignore[arg-type]
        (LlmFailure(message="x", code="RATE_LIMIT", retry_after_s=math.nan), "retry_after_s"),
    ],
    ids=["unknown code", "message an int", "status a str", "retry after NaN"],
)
def test_a_malformed_model_failure_is_logged_as_unknown_naming_the_problem(
    rt: Runtime, kind: type[Emits], failure: LlmFailure, said: str
) -> None:
    agent = run_turn(rt, kind([ModelError(failure)]))
    (end,) = facts(agent, "turn/end")  # not retried: UNKNOWN, whatever the code said
    assert end.reason.kind == "error" and end.reason.error.code == "UNKNOWN"
    assert "malformed failure" in end.reason.error.message
    assert said in end.reason.error.message
    assert_alive(rt, agent)


@pytest.mark.parametrize(
    ("script", "error", "said"),
    [
        ([b"bytes"], TypeError, "replies[0]: a script item is a str"),
        (["fine", 42], TypeError, "replies[1]: a script item is a str"),
        ([[]], ValueError, "replies[0]: an empty list of tool calls"),
        ([["add"]], TypeError, "replies[0][0]: expected a ToolCall, got str"),
        ([[ToolCall(name=5)]], ValueError, "replies[0][0]: a tool call's name"),  # type: ignore[arg-type]
        ([[ToolCall(name="add", arguments=[1])]], TypeError, "arguments is a dict"),  # type: ignore[arg-type]
        ([[ToolCall(name="add", arguments={"a": object()})]], TypeError, "cannot be encoded"),
        ([[ToolCall(name="add", raw_arguments=b"{}")]], TypeError, "raw_arguments is a str"),  # type: ignore[arg-type]
        ([LlmFailure(message="x", code="rate_limit")], ValueError, "Invalid enum value"),  # type: ignore[arg-type]
    ],
    ids=[
        "bytes",
        "an int after a str",
        "no tool calls",
        "a name for a call",
        "a call's name an int",
        "arguments a list",
        "arguments not JSON",
        "raw arguments bytes",
        "an unknown failure code",
    ],
)
def test_a_malformed_script_is_refused_when_the_scripted_model_is_built_naming_the_item(
    script: list[Any], error: type[Exception], said: str
) -> None:
    with pytest.raises(error) as caught:
        ScriptedModel(script)
    assert said in str(caught.value)


@pytest.mark.parametrize("latency", [0.0, 0.001], ids=["inline", "with latency"])
def test_a_reply_function_returning_a_malformed_item_fails_that_request_only(
    rt: Runtime, latency: float
) -> None:
    answers = iter([42, "fine"])
    agent = run_turn(rt, ScriptedModel(lambda request: next(answers), latency=latency))
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "error" and end.reason.error.code == "UNKNOWN"
    assert "the reply function's result" in end.reason.error.message
    assert_alive(rt, agent)  # the next request gets "fine"


BAD_SCRIPTED: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "chunks=1.5": ({"chunks": 1.5}, TypeError, "chunks must be an int"),
    "chunks='2'": ({"chunks": "2"}, TypeError, "chunks must be an int"),
    "chunks=True": ({"chunks": True}, TypeError, "chunks must be an int"),
    "chunks=0": ({"chunks": 0}, ValueError, "chunks must be at least 1"),
    "latency='0.5'": ({"latency": "0.5"}, TypeError, "latency must be a number"),
    "latency=True": ({"latency": True}, TypeError, "latency must be a number"),
    "latency=-1": ({"latency": -1}, ValueError, "latency must be a finite number"),
    "latency=nan": ({"latency": math.nan}, ValueError, "latency must be a finite number"),
    "latency=inf": ({"latency": math.inf}, ValueError, "latency must be a finite number"),
    "name=5": ({"name": 5}, TypeError, "name must be a str"),
}


@pytest.mark.parametrize("case", list(BAD_SCRIPTED))
def test_a_scripted_model_setting_of_the_wrong_type_or_value_is_refused_when_it_is_built(
    case: str,
) -> None:
    # Before, chunks=1.5 was accepted and every turn ended error; chunks="2" and
    # latency="0.5" raised bare TypeErrors from a comparison.
    options, expected, match = BAD_SCRIPTED[case]
    with pytest.raises(expected, match=match):
        ScriptedModel(["hello"], **options)


@pytest.mark.parametrize(
    "latency",
    [Fraction(1, 50), Decimal("0.02"), lambda: Fraction(1, 50)],
    ids=["a Fraction", "a Decimal", "a function returning a Fraction"],
)
def test_a_scripted_latency_may_be_any_real_number_of_seconds(rt: Runtime, latency: Any) -> None:
    # The check of the wrong types refused a Fraction, which worked before it.
    agent = run_turn(rt, ScriptedModel.echo(latency=latency))
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "completed"


@pytest.mark.parametrize(
    "arguments",
    [{"x": math.nan}, {"x": [1.0, -math.inf]}, {"x": {1: "one"}}],
    ids=["NaN", "-Infinity in a list", "an int key"],
)
def test_scripted_tool_call_arguments_that_are_not_lossless_json_are_refused(
    rt: Runtime, arguments: dict[str, Any]
) -> None:
    # Before, msgspec wrote NaN as null (and 1 as "1"): the call was sent with other
    # arguments than the script said, silently.
    call = ToolCall(name="probe", arguments=arguments)
    with pytest.raises(ValueError, match=r"replies\[0\]\[0\]: arguments are not lossless JSON"):
        ScriptedModel([[call]])
    answers = iter([[call], "fine"])  # a reply function's: that request fails, naming it
    agent = run_turn(rt, ScriptedModel(lambda request: next(answers)), [probe])
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "error"
    assert "arguments are not lossless JSON" in end.reason.error.message
    assert facts(agent, "tool/call") == []
    assert_alive(rt, agent)


# --------------------------------------------------------------------------- verbs


@pytest.mark.parametrize("verb", ["followup", "steer", "inject", "replace"])
def test_a_message_over_the_event_limit_is_refused_at_the_verb_and_nothing_is_written(
    rt: Runtime, verb: str
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    pending = agent.inject("keep me")
    assert agent.wait_idle(WAIT)
    before = agent.session.last_seq
    huge = "x" * LIMIT

    def call() -> Any:
        return agent.replace(pending, huge) if verb == "replace" else getattr(agent, verb)(huge)

    with pytest.raises(InvalidMessageError, match="event limit"):
        call()
    assert agent.wait_idle(WAIT)
    assert agent.session.last_seq == before
    assert agent.inbox.ids() == [pending]
    assert_alive(rt, agent)


SMALL_LIMIT = 4096  # max_event_bytes of the runtimes that probe the band under the limit
MARGIN = 256  # documented: a message this far under the limit is always taken


def _send_near_limit(agent: Agent, verb: str, message: UserMessage) -> str | None:
    """Send ``message`` with ``verb`` so that a turn claims it; the refusal if any."""
    try:
        if verb in ("followup", "steer"):
            getattr(agent, verb)(message)
        elif verb == "inject":
            agent.inject(message)
            agent.followup("go")
        elif verb == "replace":
            pending = agent.inject("to be replaced")
            try:
                agent.replace(pending, message)
            except InvalidMessageError:
                agent.remove(pending)
                raise
            agent.followup("go")
        else:
            agent.splice("next-step", 0, 0, [message])
            agent.followup("go")
    except InvalidMessageError as err:
        return str(err)
    return None


@pytest.mark.parametrize("verb", ["followup", "steer", "inject", "replace", "splice"])
def test_a_message_just_under_the_event_limit_is_refused_at_the_verb_or_logged_never_dropped(
    tmp_path: Path, verb: str
) -> None:
    # The verb measured the bare message; the records that carry it (its insert splice,
    # its user/message) are ~100-140 bytes bigger: a message up to 112 bytes under the
    # limit was accepted and then dropped by the actor (nothing logged), one 116-140
    # bytes under was claimed and crashed the agent on its user/message.
    path = tmp_path / "store"
    empty = len(msgspec.json.encode(UserMessage(id="big00000", content=[TextBlock(text="")])))
    sizes = range(SMALL_LIMIT - 2 * MARGIN, SMALL_LIMIT + 1, 3)  # a message's encoded size
    with Runtime.open(path, max_event_bytes=SMALL_LIMIT) as rt:
        agent = rt.spawn(model=ScriptedModel(lambda request: "ok"))
        accepted: list[int] = []
        for size in sizes:
            message = UserMessage(
                id=f"big{size:05d}", content=[TextBlock(text="x" * (size - empty))]
            )
            assert len(msgspec.json.encode(message)) == size
            refused = _send_near_limit(agent, verb, message)
            if refused is not None:
                assert "event limit" in refused
                continue
            assert agent.wait_idle(WAIT), f"{size}: the agent did not go idle"
            assert agent.crash is None, f"{size}: {agent.crash!r}"
            accepted.append(size)
        logged = [e.message.id for e in facts(agent, "user/message")]
        assert [i for i in logged if i.startswith("big")] == [f"big{s:05d}" for s in accepted]
        ends = facts(agent, "turn/end")
        assert [e.reason.kind for e in ends] == ["completed"] * len(accepted)
        assert agent.inbox.ids() == []
        assert accepted, "every message of the band was refused"
        assert accepted == [s for s in sizes if s <= accepted[-1]], "refused one, took a bigger"
        assert accepted[-1] >= SMALL_LIMIT - MARGIN, f"refused {SMALL_LIMIT - accepted[-1]} under"
    check_whole_store(path)


def test_a_splice_whose_one_record_would_pass_the_event_limit_is_refused_at_the_verb(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Runtime.open(path, max_event_bytes=SMALL_LIMIT) as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        before = agent.session.last_seq
        half = "y" * (SMALL_LIMIT // 2)  # each fits alone, their one splice record does not
        with pytest.raises(InvalidMessageError, match="event limit"):
            agent.splice("next-step", 0, 0, [half, half])
        assert agent.wait_idle(WAIT)
        assert agent.session.last_seq == before
        assert agent.inbox.ids() == []
        agent.splice("next-step", 0, 0, [half])  # one alone fits
        assert len(agent.inbox) == 1
    check_whole_store(path)


def test_a_pre_step_batch_too_big_to_log_ends_the_turn_as_error_and_the_agent_lives_on(
    rt: Runtime,
) -> None:
    # A user/message the log refuses (here a listener's rewrite over the event limit; a
    # pending message logged under a larger max_event_bytes is another) crashed the
    # agent's actor and left its turn open.
    huge = UserMessage(id="huge", content=[TextBlock(text="h" * LIMIT)])

    def rewrite(event: Any, next_: Any) -> Any:
        if event.messages and event.messages[0].content[0].text == "go":
            return Enter(messages=[huge])
        return next_()

    agent = rt.spawn(model=ScriptedModel.echo())
    agent.on("agent/pre-step", rewrite)
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "error"
    assert "a user message cannot be logged" in end.reason.error.message
    assert "limit" in end.reason.error.message
    assert facts(agent, "user/message") == []
    assert_alive(rt, agent)


def _wrong_calls(rt: Runtime, agent: Agent) -> list[tuple[str, Callable[[], Any], type]]:
    echo = ScriptedModel.echo()
    bad_content = UserMessage(id="bad-content", content="text")
    bad_text = UserMessage(id="bad-text", content=[TextBlock(text=5)])
    no_blocks = UserMessage(id="no-blocks", content=[])
    pending = agent.inbox.ids()[0]
    return [
        ("followup(123)", lambda: agent.followup(123), InvalidMessageError),
        ("followup(None)", lambda: agent.followup(None), InvalidMessageError),
        ("followup(b'x')", lambda: agent.followup(b"x"), InvalidMessageError),
        ("followup([])", lambda: agent.followup([]), InvalidMessageError),
        ("followup(['x'])", lambda: agent.followup(["x"]), InvalidMessageError),
        ("followup(x, id=123)", lambda: agent.followup("x", id=123), InvalidMessageError),
        ("followup(x, source=1)", lambda: agent.followup("x", source=1), InvalidMessageError),
        ("followup(content=str)", lambda: agent.followup(bad_content), InvalidMessageError),
        ("followup(text=int)", lambda: agent.followup(bad_text), InvalidMessageError),
        (
            "inject(UserMessage, source=)",
            lambda: agent.inject(
                UserMessage(id="m", content=[TextBlock(text="x")]), source="plugin"
            ),
            InvalidMessageError,
        ),
        ("followup(surrogate)", lambda: agent.followup("a \udc00"), InvalidMessageError),
        ("steer({})", lambda: agent.steer({}), InvalidMessageError),
        ("inject(1.5)", lambda: agent.inject(1.5), InvalidMessageError),
        ("remove(None)", lambda: agent.remove(None), InvalidMessageError),
        ("remove(123)", lambda: agent.remove(123), InvalidMessageError),
        ("remove('nope')", lambda: agent.remove("nope"), UnknownMessageError),
        ("replace(None, x)", lambda: agent.replace(None, "x"), InvalidMessageError),
        ("replace('nope', x)", lambda: agent.replace("nope", "x"), UnknownMessageError),
        ("replace('nope', 5)", lambda: agent.replace("nope", 5), InvalidMessageError),
        ("cancel('user')", lambda: agent.cancel("user"), InvalidMessageError),
        ("cancel(123)", lambda: agent.cancel(123), InvalidMessageError),
        ("on('nope', f)", lambda: agent.on("nope", print), ValueError),
        ("on(name, 'x')", lambda: agent.on("agent/settled", "x"), TypeError),
        ("rt.on(123, f)", lambda: rt.on(123, print), TypeError),
        ("rt.on(name, None)", lambda: rt.on("agent/status", None), TypeError),
        ("spawn(model=123)", lambda: rt.spawn(model=123), TypeError),
        ("spawn(model='nonsense')", lambda: rt.spawn(model="nonsense"), ValueError),
        ("spawn(tools=[123])", lambda: rt.spawn(model=echo, tools=[123]), TypeError),
        ("spawn(tools='ab')", lambda: rt.spawn(model=echo, tools="ab"), TypeError),
        (
            "spawn(session_id=123)",
            lambda: rt.spawn(model=echo, session_id=123),
            InvalidSessionIdError,
        ),
        (
            "spawn(session_id='')",
            lambda: rt.spawn(model=echo, session_id=""),
            InvalidSessionIdError,
        ),
        (
            "spawn(session_id=ctrl)",
            lambda: rt.spawn(model=echo, session_id="a\x00b"),
            InvalidSessionIdError,
        ),
        ("spawn(system=123)", lambda: rt.spawn(model=echo, system=123), TypeError),
        ("spawn(duplicate id)", lambda: rt.spawn(model=echo, session_id=agent.id), StorageError),
        ("resume('missing')", lambda: rt.resume("missing", model=echo), UnknownSessionError),
        ("resume(123)", lambda: rt.resume(123, model=echo), InvalidSessionIdError),
        ("resume(live id)", lambda: rt.resume(agent.id, model=echo), ValueError),
        ("resume(system=1)", lambda: rt.resume("missing", model=echo, system=1), TypeError),
        ("fork(boundary='3')", lambda: rt.fork(agent.id, "3", model=echo), TypeError),  # type: ignore[arg-type]
        ("fork(boundary=None)", lambda: rt.fork(agent.id, None, model=echo), TypeError),  # type: ignore[arg-type]
        ("fork(system=123)", lambda: rt.fork(agent.id, 0, model=echo, system=123), TypeError),  # type: ignore[arg-type]
        ("fork(5, 0)", lambda: rt.fork(5, 0, model=echo), InvalidSessionIdError),  # type: ignore[arg-type]
        ("spawn(limits=5)", lambda: rt.spawn(model=echo, limits=5), TypeError),  # type: ignore[arg-type]
        ("resume(limits=5)", lambda: rt.resume("missing", model=echo, limits=5), TypeError),  # type: ignore[arg-type]
        ("fork(limits=5)", lambda: rt.fork(agent.id, 0, model=echo, limits=5), TypeError),  # type: ignore[arg-type]
        (
            "splice(messages='abc')",
            lambda: agent.splice("next-turn", 0, 0, "abc"),
            InvalidMessageError,
        ),
        ("splice(messages=5)", lambda: agent.splice("next-turn", 0, 0, 5), InvalidMessageError),  # type: ignore[arg-type]
        ("wait_idle('1')", lambda: agent.wait_idle("1"), TypeError),  # type: ignore[arg-type]
        ("wait_idle(nan)", lambda: agent.wait_idle(math.nan), TypeError),
        ("followup(x, id='')", lambda: agent.followup("x", id=""), InvalidMessageError),
        (
            "followup([block], id='')",
            lambda: agent.followup([TextBlock(text="x")], id=""),
            InvalidMessageError,
        ),
        ("followup(content=[])", lambda: agent.followup(no_blocks), InvalidMessageError),
        ("replace(x, content=[])", lambda: agent.replace(pending, no_blocks), InvalidMessageError),
        (
            "splice(start=True)",
            lambda: agent.splice("next-step", True, 0, ["x"]),
            InvalidMessageError,
        ),
        (
            "splice(removed_count=True)",
            lambda: agent.splice("next-step", 0, True, []),
            InvalidMessageError,
        ),
        (
            "splice(messages=dict)",
            lambda: agent.splice("next-step", 0, 0, {"key": 1}),  # type: ignore[arg-type]
            InvalidMessageError,
        ),
        (
            "splice(messages=set)",
            lambda: agent.splice("next-step", 0, 0, {"a", "b"}),  # type: ignore[arg-type]
            InvalidMessageError,
        ),
        ("cancel(keep_inbox='no')", lambda: agent.cancel(keep_inbox="no"), TypeError),  # type: ignore[arg-type]
        ("cancel(keep_inbox=1)", lambda: agent.cancel(keep_inbox=1), TypeError),  # type: ignore[arg-type]
        ("clear(timeout='1')", lambda: agent.clear(timeout="1"), TypeError),  # type: ignore[arg-type]
        ("remove(p, timeout='1')", lambda: agent.remove(pending, timeout="1"), TypeError),  # type: ignore[arg-type]
        (
            "replace(p, x, timeout=nan)",
            lambda: agent.replace(pending, "x", timeout=math.nan),
            TypeError,
        ),
        (
            "splice(timeout=True)",
            lambda: agent.splice("next-step", 0, 1, [], timeout=True),
            TypeError,
        ),
        ("spawn(tools=[lambda])", lambda: rt.spawn(model=echo, tools=[lambda x: x]), ValueError),
        ("tool(name='a b')", lambda: tool(name="a b")(probe.fn), ValueError),
        ("tool(name='x' * 65)", lambda: tool(name="x" * 65)(probe.fn), ValueError),
        ("tool(name='ns.get')", lambda: tool(name="ns.get")(probe.fn), ValueError),
    ]


def test_every_public_verb_refuses_wrong_types_with_a_typed_error_and_writes_nothing(
    rt: Runtime,
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo(), session_id="target")
    pending = agent.inject("pending")
    assert agent.wait_idle(WAIT)
    before = agent.session.last_seq
    sessions = {h.id for h in rt.store.sessions()}
    wrong: list[str] = []
    for label, call, expected in _wrong_calls(rt, agent):
        try:
            call()
        except expected:
            continue
        except Exception as err:
            wrong.append(f"{label}: {type(err).__name__}: {err}")
        else:
            wrong.append(f"{label}: accepted")
    assert wrong == [], "\n".join(wrong)
    assert agent.wait_idle(WAIT)
    assert agent.session.last_seq == before, "a refused call wrote to the session"
    assert agent.inbox.ids() == [pending]
    assert {h.id for h in rt.store.sessions()} == sessions, "a refused spawn left a session"
    assert_alive(rt, agent)
    # the rt fixture reads every session back from the store when the test ends


def _typed(x: int) -> int:
    """Return x."""
    return x


BAD_TOOL_OPTIONS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "timeout=nan": ({"timeout": math.nan}, TypeError, "timeout is a number of seconds"),
    "timeout=True": ({"timeout": True}, TypeError, "timeout is a number of seconds"),
    "timeout='5'": ({"timeout": "5"}, TypeError, "timeout is a number of seconds"),
    "timeout=-1": ({"timeout": -1}, ValueError, "timeout is a number of seconds >= 0"),
    "timeout=0": ({"timeout": 0}, ValueError, "timeout must be > 0 seconds"),
    "concurrency_safe='no'": (
        {"concurrency_safe": "no"},
        TypeError,
        "concurrency_safe must be True or False",
    ),
    "concurrency_safe=1": (
        {"concurrency_safe": 1},
        TypeError,
        "concurrency_safe must be True or False",
    ),
    "description=123": ({"description": 123}, TypeError, "description must be a str"),
}


@pytest.mark.parametrize("case", list(BAD_TOOL_OPTIONS))
def test_a_tool_option_of_the_wrong_type_or_value_is_refused_when_the_tool_is_made(
    case: str,
) -> None:
    # Before, timeout=nan made every call time out at once, True was taken as 1 s, '5'
    # raised a bare TypeError from a comparison, concurrency_safe="no" was taken as
    # true, and description=123 made every request fail to log its header.
    options, expected, match = BAD_TOOL_OPTIONS[case]
    with pytest.raises(expected, match=f"tool _typed: {match}"):
        tool(**options)(_typed)


@pytest.mark.parametrize("timeout", [math.inf, 1e300], ids=["inf", "1e300"])
def test_an_infinite_tool_timeout_is_no_limit(rt: Runtime, timeout: float) -> None:
    made = tool(timeout=timeout)(_typed)
    assert made.timeout_s is None
    call = ToolCall(name="_typed", arguments={"x": 1})
    agent = run_turn(rt, ScriptedModel([[call], "done"]), [made])
    (result,) = facts(agent, "tool/result")
    assert result.error is None
    assert result.message.content[0].text == "1"


class _Calc:
    base = 10

    def add(self, x: int) -> int:
        """Add to base."""
        return self.base + x

    @staticmethod
    def double(x: int) -> int:
        """Double x."""
        return 2 * x

    def __call__(self, x: int) -> int:
        return x


def _dunder(x: int, __y: int = 0) -> int:
    return x


def _nan_default(x: float = math.nan) -> float:
    return x


def _inf_default(x: float = -math.inf) -> float:
    return x


UNDESCRIBABLE: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "a method in its class body": (
        lambda: tool(_Calc.add),
        TypeError,
        r"tool add: _Calc.add is a method: its 'self' .*tool\(obj.add\)",
    ),
    "a parameter named __y": (lambda: tool(_dunder), TypeError, "tool _dunder: .*'__y'.* rename"),
    "a functools.partial": (
        lambda: tool(functools.partial(_typed, x=1)),
        TypeError,
        "tool partial: .*decorate a typed function that calls it",
    ),
    "a callable object": (
        lambda: tool(_Calc()),
        TypeError,
        "tool _Calc: .*decorate a typed function that calls it",
    ),
    "a NaN default": (lambda: tool(_nan_default), ValueError, "tool _nan_default: .*NaN"),
    "a -Infinity default": (lambda: tool(_inf_default), ValueError, "finite default"),
}


@pytest.mark.parametrize("case", list(UNDESCRIBABLE))
def test_a_function_a_model_cannot_be_told_about_is_refused_naming_the_tool_and_the_fix(
    case: str,
) -> None:
    # Before, a method decorated in its class body advertised `self` to the model, a
    # NaN default was advertised in the schema but logged as null, and __y, a partial
    # or a callable object failed with msgspec's or typing's own words.
    make, expected, match = UNDESCRIBABLE[case]
    with pytest.raises(expected, match=match):
        make()


def test_a_bound_method_and_a_staticmethod_make_tools_that_run(rt: Runtime) -> None:
    add, double = tool(_Calc().add), tool(_Calc.double)
    assert add.spec.parameters["required"] == ["x"] == double.spec.parameters["required"]
    calls = [ToolCall(name="add", arguments={"x": 1}), ToolCall(name="double", arguments={"x": 4})]
    agent = run_turn(rt, ScriptedModel([calls, "done"]), [add, double])
    assert [r.message.content[0].text for r in facts(agent, "tool/result")] == ["11", "8"]


class _StrSub(str):
    pass


class _HandWrittenTool:
    """A hand-written ``Tool`` whose spec is not well typed (msgspec does not check
    a struct's field types at construction)."""

    spec = ToolSpec(name="hand", description=123)  # type: ignore[arg-type]
    concurrency_safe = False
    timeout_s = None
    is_async = False

    def prepare(self, arguments: Any) -> Any:
        return arguments

    def run(self, prepared: Any) -> Any:
        return "ok"


class _NumberNamed(ScriptedModel):
    """A model whose name is not a str (``ScriptedModel(name=5)`` is refused itself)."""

    @property
    def name(self) -> Any:
        return 5


UNLOGGABLE_SETTINGS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "system lone surrogate": ({"system": "\ud800"}, ValueError, "not UTF-8"),
    "system str subclass": ({"system": _StrSub("x")}, TypeError, "must be a str"),
    "system 5 MiB": ({"system": "s" * (5 << 20)}, ValueError, "over the store's max_event_bytes"),
    "tool spec description=123": ({"tools": [_HandWrittenTool()]}, TypeError, "'hand'"),
    "model name=5": ({"model": _NumberNamed.echo()}, TypeError, "its name must be a str"),
    "model class": ({"model": ScriptedModel}, TypeError, "got the class ScriptedModel"),
}


@pytest.mark.parametrize("verb", ["spawn", "resume", "fork"])
@pytest.mark.parametrize("case", list(UNLOGGABLE_SETTINGS))
def test_agent_settings_that_cannot_be_logged_are_refused_before_anything_is_written(
    rt: Runtime, case: str, verb: str
) -> None:
    # Before, each was accepted, and every turn of the agent then ended error at its
    # first request: its request/header could not be logged.
    settings, expected, match = UNLOGGABLE_SETTINGS[case]
    settings = {"model": ScriptedModel.echo(), **settings}
    source = run_turn(rt, ScriptedModel.echo())
    assert source.dispose(WAIT)
    sessions = {h.id for h in rt.store.sessions()}
    last = rt.store.open_session(source.id).last_seq
    with pytest.raises(expected, match=match):
        if verb == "spawn":
            rt.spawn(**settings)
        elif verb == "resume":
            rt.resume(source.id, **settings)
        else:
            rt.fork(source.id, last, **settings)
    assert {h.id for h in rt.store.sessions()} == sessions, "a refused start left a session"
    resumed = rt.resume(source.id, model=ScriptedModel.echo())
    assert resumed.session.last_seq == last, "a refused start wrote to the session"
    assert_alive(rt, resumed)


@pytest.mark.parametrize("verb", ["resume", "fork"])
def test_a_logged_system_prompt_that_no_longer_fits_with_the_tools_given_is_refused(
    tmp_path: Path, verb: str
) -> None:
    # The header check at the start counted the system= given, not the one the log
    # recorded: a resume (or fork) without system= adding a tool was accepted, and
    # every turn then ended error ("request/header ... over the limit").
    with Runtime.open(tmp_path / "store", max_event_bytes=4096) as rt:
        source = rt.spawn(model=ScriptedModel.echo(), system="s" * 3_900)
        source.followup("go")  # its first request logs the system prompt
        assert source.wait_idle(WAIT) and source.dispose(WAIT)
        last = source.session.last_seq
        start: Callable[[], Agent] = (
            (lambda: rt.resume(source.id, model=ScriptedModel.echo(), tools=[probe]))
            if verb == "resume"
            else (lambda: rt.fork(source.id, last, model=ScriptedModel.echo(), tools=[probe]))
        )
        with pytest.raises(ValueError, match=r"system prompt (resumed from|forked into)"):
            start()
        again = rt.resume(source.id, model=ScriptedModel.echo(), tools=[probe], system="short")
        again.followup("and now")
        assert again.wait_idle(WAIT)
        assert [e.data.reason.kind for e in again.session.events() if e.type == "turn/end"] == [
            "completed",
            "completed",
        ]
    check_whole_store(tmp_path / "store")


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("threads", "2", ValueError),
        ("threads", 0, ValueError),
        ("blocking_workers", 0, ValueError),
        ("blocking_workers", None, ValueError),
        ("max_steps", "3", ValueError),
        ("max_steps", 0, ValueError),
        ("inbox_limit", -1, ValueError),
        ("inbox_limit", True, ValueError),
        ("limits", 5, TypeError),
        ("agent_limits", {"max_requests": 2}, TypeError),
        ("retry_policy", 5, TypeError),
        ("max_running_turns", 0, ValueError),
        ("map_size", -1, ValueError),
        ("map_size", 0, ValueError),
        ("map_size", 1.5, ValueError),
        ("map_size", "1", ValueError),
        ("max_event_bytes", True, ValueError),
        ("max_event_bytes", 0, ValueError),
        ("tune_gc", "no", TypeError),
        ("tune_gc", None, TypeError),
    ],
)
def test_runtime_options_of_the_wrong_type_are_refused_when_the_runtime_opens(
    tmp_path: Path, option: str, value: Any, expected: type[Exception]
) -> None:
    store_path = tmp_path / "store"
    # Before, most were accepted and crashed every agent at its first turn (max_steps,
    # limits, agent_limits), refused every send (inbox_limit=-1), or failed deep inside
    # with a bare TypeError (threads).
    with pytest.raises(expected, match=option):
        Runtime.open(store_path, **{option: value})
    with Runtime.open(store_path) as rt:  # nothing was left open or locked
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("hi")
        assert agent.wait_idle(WAIT)


# --------------------------------------------------------------------------- plugin events

PLUGIN_VALUES: dict[str, Any] = {
    "NaN": math.nan,
    "-Infinity": -math.inf,
    "a set": {1, 2},
    "bytes": b"raw",
    "a tuple": (1, 2),
    "a custom object": _Opaque(),
    "an int key": {1: "one"},
    "a cycle": _cycle(),
    "100,000 deep": nested(100_000),
    "a lone surrogate": "\ud800",
    "5 MiB": "x" * (5 << 20),
}


@pytest.mark.parametrize("name", list(PLUGIN_VALUES))
def test_plugin_event_data_that_is_not_lossless_json_is_refused_and_nothing_is_written(
    tmp_path: Path, name: str
) -> None:
    with Runtime.open(tmp_path / "store") as rt:
        rt.store.register_event_type("plugin/note")
        agent = rt.spawn(model=ScriptedModel.echo(), session_id="plugged")
        session = agent.session
        before = session.last_seq
        with pytest.raises(InvalidEventError) as caught:
            session.append("plugin/note", {"value": PLUGIN_VALUES[name]})
        assert "'plugin/note' event" in str(caught.value)
        assert session.last_seq == before
        session.append("plugin/note", {"value": "fine"})  # good data is still taken
        assert_alive(rt, agent)
    with Store.open(tmp_path / "store", readonly=True) as store:
        store.register_event_type("plugin/note")
        assert [e.data["value"] for e in store.read("plugged") if e.type == "plugin/note"] == [
            "fine"
        ]


# --------------------------------------------------------------------------- damaged stores


def build_store(path: Path, pad: int = 40) -> dict[str, list[Any]]:
    """Two sessions with enough text to span several LMDB pages; returns their events."""
    with Runtime.open(path, retry_policy=FAST_RETRY) as rt:
        for name in ("victim", "bystander"):
            agent = rt.spawn(model=ScriptedModel.echo(), session_id=name)
            for turn in range(pad):
                agent.followup(f"{name}-marker-{turn:03d} " + "padding " * 40)
            assert agent.wait_idle(WAIT)
    with Store.open(path, readonly=True) as store:
        return {h.id: store.read(h.id) for h in store.sessions()}


def raw_append(path: Path, session_id: str, record: dict[str, Any]) -> int:
    """Append ``record`` to a session with raw LMDB writes; returns its seq."""
    env = lmdb.open(str(path), subdir=True, max_dbs=8)
    try:
        events, sessions = env.open_db(b"events"), env.open_db(b"sessions")
        with env.begin(write=True) as txn:
            raw = txn.get(session_id.encode(), db=sessions)
            row = decode_row(raw)
            seq = row.last_seq + 1
            body = json.dumps({**record, "seq": seq}, separators=(",", ":")).encode()
            txn.put(event_key(row.header.key, seq), body, db=events)
            txn.put(session_id.encode(), encode_row(raw[8:], seq), db=sessions)
    finally:
        env.close()
    return seq


def test_an_unknown_event_type_in_a_store_is_a_clear_error_for_its_session_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    build_store(path, pad=3)
    seq = raw_append(path, "victim", {"type": "alien/thing", "time": 1, "data": {}})
    with Runtime.open(path) as rt:
        with pytest.raises(UnknownEventTypeError, match=rf"alien/thing.*|seq {seq}"):
            rt.resume("victim", model=ScriptedModel.echo())
        agent = rt.resume("bystander", model=ScriptedModel.echo())
        agent.followup("business as usual")
        assert agent.wait_idle(WAIT)
    assert "alien/thing" in one_error_line(corral("log", "show", "--store", path, "victim"))


def test_an_unknown_ignorable_event_is_skipped_and_the_session_resumes_after_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    build_store(path, pad=3)
    alien = {"type": "alien/note", "time": 1, "data": {"x": 1}, "ignorable": True}
    seq = raw_append(path, "victim", alien)
    with Runtime.open(path) as rt:
        agent = rt.resume("victim", model=ScriptedModel.echo())
        agent.followup("and on")
        assert agent.wait_idle(WAIT)
        assert agent.session.events()[-1].seq > seq
    with Store.open(path) as store:
        store.register_event_type("alien/note", ignorable=True)
        seqs = [e.seq for e in store.read("victim")]
        assert seqs == list(range(len(seqs))) and seq in seqs


OPEN_AND_READ = r"""
import json, sys
from runtime import Runtime
from storage import Store
out = {}
try:
    with Store.open(sys.argv[1]) as store:
        for header in store.sessions():
            try:
                out[header.id] = len(store.read(header.id))
            except Exception as err:
                out[header.id] = f"{type(err).__module__}.{type(err).__name__}: {err}"
except Exception as err:
    out["open"] = f"{type(err).__module__}.{type(err).__name__}: {err}"
print(json.dumps(out))
"""


def open_in_child(path: Path) -> dict[str, Any]:
    """Open and read every session in a fresh interpreter: a crash shows as a signal."""
    done = python(OPEN_AND_READ, path)
    assert done.returncode == 0, f"the reader died ({done.returncode}): {done.stderr[-2000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("keep", [0.75, 0.5, 0.1, 8191])
def test_a_truncated_store_file_is_refused_with_a_clear_error_not_a_crash(
    tmp_path: Path, keep: float
) -> None:
    path = tmp_path / "store"
    build_store(path)
    size = (path / "data.mdb").stat().st_size
    os.truncate(path / "data.mdb", int(size * keep) if keep < 1 else int(keep))
    found = open_in_child(path)
    assert list(found) == ["open"], found
    assert found["open"].startswith("storage.errors.LogCorruptError: "), found
    assert "truncated" in found["open"]
    line = one_error_line(corral("log", "ls", "--store", path))
    assert "truncated" in line


def compact_copy(path: Path, to: Path) -> bytes:
    """A compacted copy (only live pages) of the store; returns its data file."""
    to.mkdir(mode=0o700)
    env = lmdb.open(str(path), subdir=True, max_dbs=8, readonly=True)
    try:
        env.copy(str(to), compact=True)
    finally:
        env.close()
    return (to / "data.mdb").read_bytes()


def test_a_record_with_flipped_bytes_is_a_clear_error_for_its_session_only(
    tmp_path: Path,
) -> None:
    built = build_store(tmp_path / "built")
    path = tmp_path / "store"
    data = bytearray(compact_copy(tmp_path / "built", path))
    hits = [m.start() for m in re.finditer(rb"victim-marker-007", data)]
    assert hits
    for offset in hits:
        data[offset] = 0xFF  # not UTF-8: the record no longer decodes
    (path / "data.mdb").write_bytes(data)
    found = open_in_child(path)
    assert found["bystander"] == len(built["bystander"]), found
    assert found["victim"].startswith("storage.errors.LogCorruptError: "), found
    assert "victim" in found["victim"]


def damage_pages(tmp_path: Path, marker: bytes) -> tuple[Path, dict[str, list[Any]]]:
    """A compacted store whose pages holding ``marker`` have invalid page flags.

    A branch or leaf page that holds ``marker`` only in its free space (stale bytes of
    a page it reuses) is left alone: the damage hits where the record lives."""
    built = build_store(tmp_path / "built")
    path = tmp_path / "store"
    data = bytearray(compact_copy(tmp_path / "built", path))
    pages = set()
    for found in re.finditer(marker, data):
        page, offset = divmod(found.start(), 4096)
        flags, lower, upper = struct.unpack_from("<HHH", data, page * 4096 + 10)
        if flags in (0x01, 0x02) and lower <= offset < upper:  # P_BRANCH, P_LEAF: free space
            continue
        pages.add(page)
    assert pages
    for page in pages:
        data[page * 4096 + 10 : page * 4096 + 12] = (0x40).to_bytes(2, "little")  # bad flags
    (path / "data.mdb").write_bytes(data)
    return path, built


@pytest.fixture
def record_per_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Store one record per ``events`` value (blocks of one), as versions 1 and 2 did:
    records then sit in the B-tree's leaf pages, not in a block's overflow pages."""
    monkeypatch.setattr(layout_module, "BLOCK_RECORDS", 1)


@pytest.mark.parametrize("layout", ["blocks", "record-per-value"])
def test_a_damaged_page_a_read_starts_on_is_a_clear_error_for_its_session_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    if layout == "record-per-value":
        monkeypatch.setattr(layout_module, "BLOCK_RECORDS", 1)  # records in leaf pages
    path, built = damage_pages(tmp_path, rb"victim-marker-000")  # the session's first page
    found = open_in_child(path)
    assert found["bystander"] == len(built["bystander"]), found
    assert found["victim"].startswith("storage.errors.LogCorruptError: "), found
    assert "damaged" in found["victim"]


@pytest.mark.xfail(
    strict=True,
    reason="known limit: LMDB asserts (SIGABRT) instead of returning MDB_CORRUPTED when a "
    "cursor steps onto a damaged page mid-iteration; LMDB pages carry no checksum",
)
def test_a_damaged_btree_page_met_mid_iteration_is_a_clear_error(
    tmp_path: Path, record_per_value: None
) -> None:
    """Records in leaf pages (one per value). In blocks, a session's records sit in the
    blocks' overflow pages, which LMDB checks when it reads a value (the test above)."""
    path, _ = damage_pages(tmp_path, rb"victim-marker-020")
    found = open_in_child(path)
    assert found["victim"].startswith("storage.errors.LogCorruptError: "), found


@pytest.mark.soak
@pytest.mark.timeout(6 * 3600)
def test_soak_random_bit_flips_never_kill_a_reader_with_sigbus_or_sigsegv(
    tmp_path: Path,
    rng: random.Random,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    built = build_store(tmp_path / "built")
    counts = {session_id: len(events) for session_id, events in built.items()}
    original = (tmp_path / "built" / "data.mdb").read_bytes()
    tally: dict[str, int] = {}
    for trial in range(int(request.config.getoption("--soak-kills"))):
        path = tmp_path / f"flip-{trial}"
        shutil.copytree(tmp_path / "built", path)
        data = bytearray(original)
        for _ in range(rng.choice([1, 3, 10])):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        (path / "data.mdb").write_bytes(data)
        done = python(OPEN_AND_READ, path)
        if done.returncode != 0:
            outcome = f"signal {-done.returncode}" if done.returncode < 0 else "exit"
        else:
            found = json.loads(done.stdout.strip().splitlines()[-1])
            kinds = {v.split(":")[0] for v in found.values() if isinstance(v, str)}
            if kinds:
                outcome = ", ".join(sorted(kinds))
            elif found == counts:
                outcome = "read fine, every event"
            else:
                outcome = "read without error, but events or sessions missing"
        tally[outcome] = tally.get(outcome, 0) + 1
        shutil.rmtree(path)
    with capsys.disabled():
        print(f"\nrandom bit flips ({sum(tally.values())} stores): {tally}")
    assert not any(k in tally for k in ("signal 7", "signal 11")), tally
    assert "exit" not in tally, tally
    errors = {
        kind
        for outcome in tally
        if not outcome.startswith(("read ", "signal "))
        for kind in outcome.split(", ")
    }
    assert all(kind.startswith("storage.errors.") for kind in errors), tally  # typed


def set_schema_version(path: Path, version: bytes) -> None:
    env = lmdb.open(str(path), subdir=True, max_dbs=8)
    try:
        meta = env.open_db(b"meta")
        with env.begin(write=True) as txn:
            txn.put(b"schema_version", version, db=meta)
    finally:
        env.close()


def test_a_store_of_a_future_schema_version_is_refused_with_one_clear_message(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    before = build_store(path, pad=2)
    future = SCHEMA_VERSION + 1
    set_schema_version(path, str(future).encode())
    for opener in (
        lambda: Store.open(path),
        lambda: Store.open(path, readonly=True),
        lambda: Runtime.open(path),
    ):
        # What it found and what this corral supports (the one test of this refusal).
        refusal = rf"schema version {future}.*supports version {SCHEMA_VERSION}"
        with pytest.raises(SchemaVersionError, match=refusal):
            opener()
    assert f"schema version {future}" in one_error_line(corral("log", "ls", "--store", path))
    set_schema_version(path, str(SCHEMA_VERSION).encode())  # the refusals changed nothing
    with Store.open(path, readonly=True) as store:
        assert {h.id: store.read(h.id) for h in store.sessions()} == before


HOLD_LOCK = r"""
import sys
from storage import Store
store = Store.open(sys.argv[1])
print("locked", flush=True)
sys.stdin.readline()
store.close()
"""


def test_a_store_locked_by_another_process_is_refused_for_writing_and_readable_meanwhile(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    before = build_store(path, pad=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"
        for opener in (lambda: Store.open(path), lambda: Runtime.open(path)):
            match = f"already open for writing by process {holder.pid}"
            with pytest.raises(StorageError, match=match):
                opener()
        with Store.open(path, readonly=True) as store:
            assert {h.id: store.read(h.id) for h in store.sessions()} == before
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(WAIT) == 0
    with Runtime.open(path) as rt:  # the lock went with the process
        agent = rt.resume("victim", model=ScriptedModel.echo())
        agent.followup("mine now")
        assert agent.wait_idle(WAIT)
    check_whole_store(path)


@pytest.mark.parametrize("size", [1_000, 5 << 20], ids=["1 KB", "5 MiB"])
def test_a_model_failure_with_a_hostile_message_ends_the_turn_as_error(
    rt: Runtime, size: int
) -> None:
    failure = LlmFailure(message="\x00\x07" + "y" * size, code="AUTH")
    agent = run_turn(rt, ScriptedModel([failure]))
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "error" and end.reason.error.code == "AUTH"
    assert_alive(rt, agent)
