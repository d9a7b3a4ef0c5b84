"""Hostile model output: replies over the event limit or with lone surrogates, malformed
chunks and failures a model builds by hand, plain exceptions, hostile failure messages,
malformed scripts: each ends that turn (or refuses the script) with a clear error, and the
agent lives on."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from runtime import (
    LlmFailure,
    ModelError,
    Runtime,
    ScriptedModel,
    ToolCall,
)
from storage.events import FinishChunk, TextDelta, ToolCallDelta, Usage, UsageChunk

from .hostile_support import assert_alive, facts, probe, run_turn

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
        (TextDelta(text=b"x"), "Expected `str`, got `bytes` - at `$.text`"),  # type: ignore[arg-type]
        (
            ToolCallDelta(index=0, call_id="c", name="n", arguments_delta=b"{}"),  # type: ignore[arg-type]
            "Expected `str`, got `bytes` - at `$.argumentsDelta`",
        ),
    ],
    ids=[
        "text not a str",
        "a plain str",
        "None",
        "unknown finish",
        "usage a str",
        "name an int",
        "text bytes (not base64 text)",
        "arguments bytes",
    ],
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


@pytest.mark.parametrize("chunks", [1, 2], ids=["one chunk", "two chunks"])
@pytest.mark.parametrize("from_function", [False, True], ids=["script", "reply function"])
def test_a_scripted_call_without_arguments_logs_an_empty_object_and_runs_the_tool(
    rt: Runtime, chunks: int, from_function: bool
) -> None:
    # The scripted model and the tool phase take a short cut for {} (no encoding, no
    # lossless walk, no JSON decoding): what is logged and run must not change.
    calls = [ToolCall(name="probe"), ToolCall(name="probe", arguments={"x": "y"})]
    script: list[Any] = [calls, "done"]
    answers = iter(script)
    model = ScriptedModel((lambda _request: next(answers)) if from_function else script)
    agent = run_turn(rt, model, [probe])
    model_chunks = ScriptedModel(script, chunks=chunks)
    split = run_turn(rt, model_chunks, [probe])
    for each in (agent, split):
        assert [c.arguments for c in facts(each, "tool/call")] == ["{}", '{"x":"y"}']
        results = facts(each, "tool/result")
        assert [r.error for r in results] == [None, None]
        assert [r.message.content[0].text for r in results] == ["ok", "ok"]
        assert facts(each, "turn/end")[-1].reason.kind == "completed"


@pytest.mark.parametrize("raw", ["", "{}"], ids=["empty", "empty object"])
def test_raw_arguments_that_are_empty_run_a_tool_as_no_arguments(rt: Runtime, raw: str) -> None:
    agent = run_turn(rt, ScriptedModel([[ToolCall(name="probe", raw_arguments=raw)], "x"]), [probe])
    (call,) = facts(agent, "tool/call")
    assert call.arguments == raw  # logged as the model sent it
    (result,) = facts(agent, "tool/result")
    assert result.error is None and result.message.content[0].text == "ok"


@pytest.mark.parametrize(
    "raw", ["{} x", " {}", "[]", "{"], ids=["trailing", "leading space", "array", "cut"]
)
def test_raw_arguments_close_to_an_empty_object_are_still_decoded_and_checked(
    rt: Runtime, raw: str
) -> None:
    agent = run_turn(rt, ScriptedModel([[ToolCall(name="probe", raw_arguments=raw)], "x"]), [probe])
    (result,) = facts(agent, "tool/result")
    if raw == " {}":  # valid JSON for an empty object: the decoder runs, and agrees
        assert result.error is None
    else:
        assert result.error is not None and result.error.code == "INVALID_ARGUMENTS"


@pytest.mark.parametrize("size", [1_000, 5 << 20], ids=["1 KB", "5 MiB"])
def test_a_model_failure_with_a_hostile_message_ends_the_turn_as_error(
    rt: Runtime, size: int
) -> None:
    failure = LlmFailure(message="\x00\x07" + "y" * size, code="AUTH")
    agent = run_turn(rt, ScriptedModel([failure]))
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "error" and end.reason.error.code == "AUTH"
    assert_alive(rt, agent)
