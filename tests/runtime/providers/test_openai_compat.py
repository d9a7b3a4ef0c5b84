"""OpenAICompatModel against the loopback server: chunk mapping and request mapping."""

from __future__ import annotations

from typing import Any

import pytest

from actors.errors import ModelError
from actors.model import Model
from runtime.providers import OpenAICompatModel
from storage.events import (
    AssistantMessage,
    FinishChunk,
    ImageBlock,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolCallDelta,
    ToolMessage,
    ToolResultBlock,
    ToolSpec,
    Usage,
    UsageChunk,
    UserMessage,
)

from .support import (
    KEY,
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
from .wire_formats import (
    openai_chunk,
    openai_frames,
    openai_text_reply,
    openai_tool_reply,
    openai_usage,
)
from .wire_server import Sse, WireServer


def model_for(wire: WireServer, **options: Any) -> OpenAICompatModel:
    return OpenAICompatModel("test-model", base_url=wire.url + "/v1", api_key=KEY, **options)


def stream_from(wire: WireServer, chunks: list[dict[str, Any]], **options: Any) -> list[Any]:
    wire.script(Sse(openai_frames(chunks)))

    async def body() -> list[Any]:
        async with model_for(wire, **options) as model:
            return await collect(model, request())

    return run(body)


def test_the_provider_implements_the_model_protocol() -> None:
    model = OpenAICompatModel("gpt-x", base_url="http://127.0.0.1:9/v1")
    assert isinstance(model, Model)
    assert (model.provider, model.name) == ("openai", "gpt-x")


def test_text_and_reasoning_stream_as_deltas_then_usage_then_one_finish(wire: WireServer) -> None:
    usage = openai_usage(11, 7, cached=5, reasoning=3)
    chunks = stream_from(
        wire, openai_text_reply("Hel", "lo", reasoning=["Let me ", "think"], usage=usage)
    )
    assert reasoning_of(chunks) == "Let me think"
    assert text_of(chunks) == "Hello"
    assert tail_of(chunks) == ["UsageChunk", "FinishChunk"]
    assert chunks[-2] == UsageChunk(
        usage=Usage(input_tokens=11, output_tokens=7, cache_read_tokens=5, reasoning_tokens=3)
    )
    assert chunks[-1] == FinishChunk(reason="stop")


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_both_reasoning_delta_spellings_are_read(wire: WireServer, field: str) -> None:
    chunks = stream_from(wire, openai_text_reply("ok", reasoning=["hmm"], reasoning_field=field))
    assert reasoning_of(chunks) == "hmm"


def test_parallel_tool_calls_split_across_deltas_keep_their_vendor_indexes(
    wire: WireServer,
) -> None:
    calls = [("call_a", "read", ['{"pa', 'th": "x"}']), ("call_b", "list", ["{", "}"])]
    chunks = stream_from(wire, openai_tool_reply(calls, interleave=True))
    assert tool_calls_of(chunks) == {
        0: ("call_a", "read", '{"path": "x"}'),
        1: ("call_b", "list", "{}"),
    }
    indexes = [c.index for c in chunks if isinstance(c, ToolCallDelta)]
    assert indexes == [0, 1, 0, 1, 0, 1]
    assert chunks[-1] == FinishChunk(reason="tool-calls")


def test_malformed_tool_call_json_is_passed_through_raw(wire: WireServer) -> None:
    chunks = stream_from(wire, openai_tool_reply([("c1", "f", ['{"a": ', "oops"])]))
    assert tool_calls_of(chunks)[0] == ("c1", "f", '{"a": oops')


def test_a_stop_finish_after_tool_calls_is_read_as_tool_calls(wire: WireServer) -> None:
    chunks = stream_from(wire, openai_tool_reply([("c1", "f", ["{}"])], finish="stop"))
    assert chunks[-1] == FinishChunk(reason="tool-calls")


def test_a_length_finish_maps_to_max_tokens(wire: WireServer) -> None:
    chunks = stream_from(wire, openai_text_reply("trunc", finish="length"))
    assert chunks[-1] == FinishChunk(reason="max-tokens")


def test_a_server_reusing_a_tool_index_for_a_new_call_gets_a_fresh_index(
    wire: WireServer,
) -> None:
    def call(call_id: str, name: str, args: str) -> dict[str, Any]:
        item = {"index": 0, "id": call_id, "type": "function"}
        item["function"] = {"name": name, "arguments": args}
        return openai_chunk({"tool_calls": [item]})

    chunks = stream_from(
        wire, [call("c1", "f", "{}"), call("c2", "g", "{}"), openai_chunk({}, finish="tool_calls")]
    )
    assert tool_calls_of(chunks) == {0: ("c1", "f", "{}"), 1: ("c2", "g", "{}")}


def test_negative_usage_counts_are_malformed_and_read_as_zero(wire: WireServer) -> None:
    usage = openai_usage(-1_000_000, -5, cached=-3, reasoning=-2)
    usage["prompt_cache_hit_tokens"] = 7  # DeepSeek's count stands in for the bad one
    chunks = stream_from(wire, openai_text_reply("hi", usage=usage))
    assert chunks[-2] == UsageChunk(usage=Usage(cache_read_tokens=7))


def test_deepseek_cache_hits_are_reported_as_cache_reads(wire: WireServer) -> None:
    usage = {"prompt_tokens": 50, "completion_tokens": 2, "total_tokens": 52}
    usage["prompt_cache_hit_tokens"] = 40
    chunks = stream_from(wire, openai_text_reply("hi", usage=usage))
    assert chunks[-2] == UsageChunk(
        usage=Usage(input_tokens=50, output_tokens=2, cache_read_tokens=40)
    )


def test_an_empty_completion_fails_as_empty_response(wire: WireServer) -> None:
    wire.script(Sse(openai_frames(openai_text_reply())))

    async def body() -> Any:
        async with model_for(wire) as model:
            return await failure_of(model, request())

    failure = run(body)
    assert failure.code == "EMPTY_RESPONSE"


def test_the_request_maps_config_tools_system_and_history(wire: WireServer) -> None:
    wire.script(Sse(openai_frames(openai_text_reply("ok"))))
    history = [
        UserMessage(
            id="u1",
            content=[
                TextBlock(text="look"),
                ImageBlock(data="QUJD", media_type="image/jpeg"),
                ImageBlock(url="https://img.example/x.png"),
            ],
        ),
        AssistantMessage(
            content=[
                ReasoningBlock(text="thinking"),
                TextBlock(text="calling"),
                ToolCallBlock(call_id="c1", name="read", arguments='{"p": 1}'),
                ToolCallBlock(call_id="c2", name="list", arguments="{}"),
            ]
        ),
        ToolMessage(call_id="c1", name="read", content=[TextBlock(text="data")]),
        ToolMessage(call_id="c2", name="list", content=[TextBlock(text="boom")], is_error=True),
        user("next", "u2"),
    ]
    tool = ToolSpec(name="read", description="Read a file", parameters={"type": "object"})
    req = request(
        *history,
        system="be brief",
        tools=[tool],
        temperature=0.2,
        max_tokens=64,
        stop=["END"],
        reasoning_effort="low",
    )

    async def body() -> None:
        async with model_for(wire) as model:
            await collect(model, req)

    run(body)
    sent = wire.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    body_ = sent.body
    assert body_["model"] == "test-model"
    assert body_["stream"] is True
    assert body_["stream_options"] == {"include_usage": True}
    assert (body_["temperature"], body_["max_tokens"], body_["stop"]) == (0.2, 64, ["END"])
    assert body_["reasoning_effort"] == "low"
    assert "max_completion_tokens" not in body_
    assert body_["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read",
                "description": "Read a file",
                "parameters": {"type": "object"},
            },
        }
    ]
    assert body_["messages"] == [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
                {"type": "image_url", "image_url": {"url": "https://img.example/x.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"p": 1}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "list", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "data"},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: boom"},
        {"role": "user", "content": "next"},
    ]


def test_reasoning_is_echoed_back_only_when_asked(wire: WireServer) -> None:
    wire.script(Sse(openai_frames(openai_text_reply("ok"))))
    history = [user("q"), AssistantMessage(content=[ReasoningBlock(text="r"), TextBlock(text="a")])]

    async def body() -> None:
        async with model_for(wire, send_reasoning=True) as model:
            await collect(model, request(*history, user("again", "m2")))

    run(body)
    assistant = wire.requests[0].body["messages"][1]
    assert assistant == {"role": "assistant", "content": "a", "reasoning_content": "r"}


def test_images_in_tool_results_follow_the_tool_messages_as_a_user_message(
    wire: WireServer,
) -> None:
    wire.script(Sse(openai_frames(openai_text_reply("ok"))))
    history = [
        user("q"),
        AssistantMessage(content=[ToolCallBlock(call_id="c1", name="shot", arguments="{}")]),
        UserMessage(
            id="r1",
            content=[
                ToolResultBlock(
                    call_id="c1", name="shot", content=[ImageBlock(url="https://i.example/a.png")]
                )
            ],
        ),
    ]

    async def body() -> None:
        async with model_for(wire) as model:
            await collect(model, request(*history))

    run(body)
    messages = wire.requests[0].body["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}
        ],
    }
    assert messages[2] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "[image attached below]",
    }
    assert messages[3]["role"] == "user"
    assert messages[3]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "https://i.example/a.png"},
    }


def test_openai_itself_gets_max_completion_tokens(wire: WireServer) -> None:
    wire.script(Sse(openai_frames(openai_text_reply("ok"))))

    async def body() -> None:
        async with model_for(wire, max_tokens_field="max_completion_tokens") as model:
            await collect(model, request(max_tokens=9))

    run(body)
    assert wire.requests[0].body["max_completion_tokens"] == 9
    assert "max_tokens" not in wire.requests[0].body


def test_the_model_in_the_request_config_wins_over_the_provider_default(
    wire: WireServer,
) -> None:
    wire.script(Sse(openai_frames(openai_text_reply("ok"))))

    async def body() -> None:
        async with model_for(wire) as model:
            await collect(model, request(model="override-model"))

    run(body)
    assert wire.requests[0].body["model"] == "override-model"


def test_sequential_requests_reuse_one_pooled_connection(wire: WireServer) -> None:
    wire.script(*(Sse(openai_frames(openai_text_reply("ok"))) for _ in range(3)))

    async def body() -> None:
        async with model_for(wire) as model:
            for _ in range(3):
                await collect(model, request())

    run(body)
    assert len(wire.requests) == 3
    assert len({r.peer for r in wire.requests}) == 1


def test_a_read_of_many_events_is_one_batch_and_stream_yields_the_same_chunks(
    wire: WireServer,
) -> None:
    frames = openai_frames(openai_text_reply("a", "b", "c", usage=openai_usage(3, 3)))
    wire.script(Sse(frames, coalesce=True), Sse(frames, coalesce=True))

    async def body() -> tuple[list[list[Any]], list[Any]]:
        async with model_for(wire) as model:
            batches = [list(b) async for b in model.stream_batches(request())]
            return batches, [c async for c in model.stream(request())]

    batches, chunks = run(body)
    assert [c for batch in batches for c in batch] == chunks
    assert text_of(chunks) == "abc"
    assert tail_of(chunks) == ["UsageChunk", "FinishChunk"]
    assert len(batches) < len(chunks)  # one write, read at once: fewer batches than chunks


def test_the_chunks_read_with_a_failing_event_come_before_its_failure(wire: WireServer) -> None:
    frames = openai_frames([openai_chunk({"content": "a"}), openai_chunk({"content": "b"})])
    frames.insert(2, b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n')
    wire.script(Sse(frames, coalesce=True))

    async def body() -> tuple[list[Any], BaseException | None]:
        seen: list[Any] = []
        async with model_for(wire) as model:
            try:
                async for batch in model.stream_batches(request()):
                    seen += batch
            except ModelError as err:
                return seen, err
        return seen, None

    seen, error = run(body)
    assert text_of(seen) == "ab"
    assert isinstance(error, ModelError)
    assert "overloaded" in error.failure.message
