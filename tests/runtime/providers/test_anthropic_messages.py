"""AnthropicModel against the loopback server: event mapping and request mapping."""

from __future__ import annotations

from typing import Any

import pytest

from actors.errors import ModelError
from actors.model import Model
from runtime.providers import AnthropicModel
from runtime.providers.anthropic_wire import message_params
from storage.events import (
    AssistantMessage,
    FinishChunk,
    ImageBlock,
    ReasoningBlock,
    ReasoningDelta,
    TextBlock,
    ToolCallBlock,
    ToolMessage,
    ToolSpec,
    Usage,
    UsageChunk,
    UserMessage,
)

from .support import (
    ANTHROPIC_KEY,
    collect,
    failure_of,
    reasoning_of,
    request,
    run,
    tail_of,
    text_of,
    tool_calls_of,
    user,
)
from .wire_formats import anthropic_frames, anthropic_reply
from .wire_server import Sse, WireServer

MODEL = "claude-sonnet-4-6"


def model_for(wire: WireServer, **options: Any) -> AnthropicModel:
    return AnthropicModel(MODEL, base_url=wire.url, api_key=ANTHROPIC_KEY, **options)


def stream_from(wire: WireServer, events: list[dict[str, Any]], **options: Any) -> list[Any]:
    wire.script(Sse(anthropic_frames(events)))

    async def body() -> list[Any]:
        async with model_for(wire, **options) as model:
            return await collect(model, request(model=MODEL, provider="anthropic"))

    return run(body)


def test_the_provider_implements_the_model_protocol() -> None:
    model = AnthropicModel(MODEL, api_key=ANTHROPIC_KEY)
    assert isinstance(model, Model)
    assert (model.provider, model.name) == ("anthropic", MODEL)


def test_thinking_text_and_usage_stream_then_one_finish(wire: WireServer) -> None:
    events = anthropic_reply(
        [{"thinking": ["Let me ", "see"], "signature": "sig-1"}, {"text": ["Hel", "lo"]}],
        input_tokens=20,
        output_tokens=9,
        cache_read=100,
        cache_write=30,
        thinking_tokens=4,
    )
    chunks = stream_from(wire, events)
    assert reasoning_of(chunks) == "Let me see"
    assert text_of(chunks) == "Hello"
    assert tail_of(chunks) == ["UsageChunk", "FinishChunk"]
    assert chunks[-2] == UsageChunk(
        usage=Usage(
            input_tokens=150,
            output_tokens=9,
            cache_read_tokens=100,
            cache_write_tokens=30,
            reasoning_tokens=4,
        )
    )
    assert chunks[-1] == FinishChunk(reason="stop")


def test_a_negative_usage_count_is_malformed_and_keeps_the_earlier_count(
    wire: WireServer,
) -> None:
    events = anthropic_reply(
        [{"text": ["ok"]}],
        input_tokens=20,
        output_tokens=-9,  # message_delta's: message_start's 1 stands
        cache_read=-100,
        cache_write=30,
        thinking_tokens=-4,
    )
    chunks = stream_from(wire, events)
    assert chunks[-2] == UsageChunk(
        usage=Usage(input_tokens=50, output_tokens=1, cache_write_tokens=30)
    )


def test_a_thinking_signature_arrives_as_a_reasoning_delta(wire: WireServer) -> None:
    reply = anthropic_reply([{"thinking": ["x"], "signature": "sig-1"}, {"text": ["ok"]}])
    chunks = stream_from(wire, reply)
    signed = [c for c in chunks if isinstance(c, ReasoningDelta) and c.signature]
    assert [c.signature for c in signed] == ["sig-1"]


def test_parallel_tool_use_blocks_become_numbered_tool_call_deltas(wire: WireServer) -> None:
    events = anthropic_reply(
        [
            {"text": ["Reading."]},
            {"tool": ("toolu_1", "read", ['{"pa', 'th": "x"}'])},
            {"tool": ("toolu_2", "list", [])},
        ],
        stop_reason="tool_use",
    )
    chunks = stream_from(wire, events)
    assert tool_calls_of(chunks) == {
        0: ("toolu_1", "read", '{"path": "x"}'),
        1: ("toolu_2", "list", "{}"),
    }
    assert chunks[-1] == FinishChunk(reason="tool-calls")


def test_malformed_tool_input_json_is_passed_through_raw(wire: WireServer) -> None:
    events = anthropic_reply([{"tool": ("t1", "f", ['{"a": ', "oops"])}], stop_reason="tool_use")
    assert tool_calls_of(stream_from(wire, events))[0] == ("t1", "f", '{"a": oops')


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "max-tokens"),
        ("model_context_window_exceeded", "max-tokens"),
    ],
)
def test_stop_reasons_map_to_finish_reasons(wire: WireServer, stop: str, finish: str) -> None:
    chunks = stream_from(wire, anthropic_reply([{"text": ["x"]}], stop_reason=stop))
    assert chunks[-1] == FinishChunk(reason=finish)  # type: ignore[arg-type]


def test_redacted_thinking_alone_is_an_empty_response(wire: WireServer) -> None:
    wire.script(Sse(anthropic_frames(anthropic_reply([{"redacted": "opaque"}]))))

    async def body() -> Any:
        async with model_for(wire) as model:
            return await failure_of(model, request(model=MODEL))

    assert run(body).code == "EMPTY_RESPONSE"


def test_a_stream_ending_before_message_stop_fails_as_transport(wire: WireServer) -> None:
    events = anthropic_reply([{"text": ["partial"]}], complete=False)
    wire.script(Sse(anthropic_frames(events)))

    async def body() -> Any:
        async with model_for(wire) as model:
            return await failure_of(model, request(model=MODEL))

    assert run(body).code == "TRANSPORT"


def test_the_request_maps_history_to_blocks_and_merges_same_role_turns(
    wire: WireServer,
) -> None:
    wire.script(Sse(anthropic_frames(anthropic_reply([{"text": ["ok"]}]))))
    history = [
        UserMessage(
            id="u1",
            content=[TextBlock(text="look"), ImageBlock(data="QUJD", media_type="image/jpeg")],
        ),
        AssistantMessage(
            content=[
                ReasoningBlock(text="hm", signature="sig-1"),
                ReasoningBlock(text="unsigned"),
                TextBlock(text="calling"),
                ToolCallBlock(call_id="t1", name="read", arguments='{"p": 1}'),
                ToolCallBlock(call_id="t2", name="list", arguments="not json"),
            ]
        ),
        ToolMessage(call_id="t1", name="read", content=[TextBlock(text="data")]),
        ToolMessage(call_id="t2", name="list", content=[TextBlock(text="boom")], is_error=True),
        user("and now?", "u2"),
        AssistantMessage(content=[TextBlock(text="")]),  # interrupted, nothing visible
        user("hello?", "u3"),
    ]
    tool = ToolSpec(name="read", description="Read", parameters={"type": "object"})
    req = request(
        *history,
        model=MODEL,
        system="be brief",
        tools=[tool],
        temperature=0.5,
        max_tokens=300,
        stop=["END"],
    )

    async def body() -> None:
        async with model_for(wire) as model:
            await collect(model, req)

    run(body)
    sent = wire.requests[0]
    assert sent.path == "/v1/messages"
    sent_body = sent.body
    assert (sent_body["model"], sent_body["max_tokens"], sent_body["stream"]) == (MODEL, 300, True)
    assert (sent_body["system"], sent_body["temperature"]) == ("be brief", 0.5)
    assert sent_body["stop_sequences"] == ["END"]
    assert "thinking" not in sent_body
    assert sent_body["tools"] == [
        {"name": "read", "description": "Read", "input_schema": {"type": "object"}}
    ]
    image = {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"}
    assert sent_body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "look"}, {"type": "image", "source": image}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "sig-1"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": 1}},
                {"type": "tool_use", "id": "t2", "name": "list", "input": {"_raw": "not json"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "data"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": [{"type": "text", "text": "boom"}],
                    "is_error": True,
                },
                {"type": "text", "text": "and now?"},
                {"type": "text", "text": "hello?"},
            ],
        },
    ]


def test_the_default_max_tokens_applies_when_the_config_sets_none(wire: WireServer) -> None:
    wire.script(Sse(anthropic_frames(anthropic_reply([{"text": ["ok"]}]))))

    async def body() -> None:
        async with model_for(wire, max_tokens=1234) as model:
            await collect(model, request(model=MODEL))

    run(body)
    assert wire.requests[0].body["max_tokens"] == 1234


def test_reasoning_effort_turns_on_adaptive_thinking_by_default() -> None:
    params = message_params(
        request(model=MODEL, reasoning_effort="minimal"), default_max_tokens=4096
    )
    assert params["thinking"] == {"type": "adaptive"}
    assert params["output_config"] == {"effort": "low"}


def test_budget_thinking_stays_below_max_tokens() -> None:
    params = message_params(
        request(model=MODEL, reasoning_effort="high", max_tokens=5000),
        default_max_tokens=4096,
        thinking="budget",
    )
    assert params["thinking"] == {"type": "enabled", "budget_tokens": 4999}


def test_budget_thinking_with_too_few_max_tokens_is_an_invalid_request() -> None:
    with pytest.raises(ModelError) as caught:
        message_params(
            request(model=MODEL, reasoning_effort="low", max_tokens=500),
            default_max_tokens=4096,
            thinking="budget",
        )
    assert caught.value.failure.code == "INVALID_REQUEST"


def test_reasoning_effort_none_sends_no_thinking() -> None:
    params = message_params(request(model=MODEL, reasoning_effort="none"), default_max_tokens=10)
    assert "thinking" not in params
