"""A 200 answer to a streaming request that is not an event stream (``bodies``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from storage.events import FinishChunk, UsageChunk

from .support import ANTHROPIC_KEY, KEY, collect, failure_of, request, run, text_of, tool_calls_of
from .test_failures import ANTHROPIC, OPENAI, VENDORS, Vendor
from .wire_formats import openai_frames, openai_text_reply
from .wire_server import JsonReply, RawReply, Reply, WireServer


def answer(wire: WireServer, vendor: Vendor, reply: Reply) -> list[Any]:
    wire.script(reply)

    async def body() -> list[Any]:
        async with vendor.model(wire.url) as model:
            return await collect(model, request())

    return run(body)


def failure(wire: WireServer, vendor: Vendor, reply: Reply, **options: Any) -> Any:
    wire.script(reply)

    async def body() -> Any:
        async with vendor.model(wire.url, **options) as model:
            return await failure_of(model, request())

    return run(body)


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("invalid_request_error", "INVALID_REQUEST"),
        ("rate_limit_error", "RATE_LIMIT"),
        ("overloaded_error", "SERVER"),
    ],
)
def test_a_200_whose_body_is_a_json_error_fails_as_that_error_with_its_message(
    wire: WireServer, vendor: Vendor, kind: str, code: str
) -> None:
    body = {"error": {"type": kind, "message": "model gpt-x does not exist"}}
    got = failure(wire, vendor, JsonReply(200, body, {vendor.id_header: "req_json"}))
    assert (got.code, got.status, got.request_id) == (code, None, "req_json")
    assert "model gpt-x does not exist" in got.message
    assert len(wire.requests) == 1


def test_a_server_ignoring_stream_true_has_its_plain_openai_completion_read(
    wire: WireServer,
) -> None:
    completion = {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "hello",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    chunks = answer(wire, OPENAI, JsonReply(200, completion))
    assert text_of(chunks) == "hello"
    assert tool_calls_of(chunks) == {0: ("c1", "f", "{}")}
    usage = next(c for c in chunks if isinstance(c, UsageChunk)).usage
    assert (usage.input_tokens, usage.output_tokens) == (3, 2)
    assert chunks[-1] == FinishChunk(reason="tool-calls")


def test_a_server_ignoring_stream_true_has_its_plain_anthropic_message_read(
    wire: WireServer,
) -> None:
    message = {
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "hello"},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 4},
    }
    chunks = answer(wire, ANTHROPIC, JsonReply(200, message))
    assert text_of(chunks) == "hello"
    assert tool_calls_of(chunks) == {0: ("t1", "f", json.dumps({"x": 1}))}
    usage = next(c for c in chunks if isinstance(c, UsageChunk)).usage
    assert (usage.input_tokens, usage.output_tokens) == (5, 4)
    assert chunks[-1] == FinishChunk(reason="tool-calls")


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_200_html_page_fails_at_once_quoting_the_start_of_the_page_without_the_key(
    wire: WireServer, vendor: Vendor
) -> None:
    key = (KEY if vendor is OPENAI else ANTHROPIC_KEY).replace("sk-", "")  # not key-shaped
    page = f"<html><body>Please log in. token={key}</body></html>" + "x" * 5000
    got = failure(wire, vendor, RawReply(page.encode(), "text/html"), api_key=key)
    assert (got.code, got.status) == ("UNKNOWN", None)
    assert "text/html" in got.message
    assert "Please log in. token=***" in got.message
    assert key not in got.message
    assert len(got.message) < 500
    assert len(wire.requests) == 1


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_json_body_that_is_neither_an_error_nor_a_reply_fails_naming_its_start(
    wire: WireServer, vendor: Vendor
) -> None:
    got = failure(wire, vendor, JsonReply(200, {"status": "maintenance"}))
    assert got.code == "UNKNOWN"
    assert "maintenance" in got.message


def test_an_event_stream_with_a_wrong_or_missing_content_type_is_still_read(
    wire: WireServer,
) -> None:
    frames = b"".join(openai_frames(openai_text_reply("Hel", "lo")))
    for content_type in ("text/plain", "application/json", ""):
        assert text_of(answer(wire, OPENAI, RawReply(frames, content_type))) == "Hello"
