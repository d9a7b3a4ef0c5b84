"""A 200 answer to a streaming request that is not an event stream (``bodies``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from runtime import Runtime
from runtime.providers.sse import event_bound
from storage import check_invariants
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


LIMIT = 64 * 1024  # a small event limit: a reply over four times it stays small


def _plain_text_reply(vendor: Vendor, text: str) -> dict[str, Any]:
    """``vendor``'s non-streamed reply holding ``text`` (a server ignoring ``stream``)."""
    if vendor is OPENAI:
        return {
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        }
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 5, "output_tokens": 4},
    }


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_json_reply_too_large_to_log_fails_as_too_large_naming_its_size_and_the_limit(
    wire: WireServer, vendor: Vendor
) -> None:
    # Before, a JSON body was read up to a fixed 8 MiB, whatever the log's limit: this
    # one (~400 KB, over four times a 64 KiB limit) was read and handed on whole, and
    # one over 8 MiB was refused as "neither an error nor a reply of this API".
    wire.script(JsonReply(200, _plain_text_reply(vendor, "x" * (5 * LIMIT))))

    async def body() -> Any:
        async with vendor.model(wire.url) as model:
            limited = msgspec.structs.replace(request(), max_reply_bytes=LIMIT)
            return await failure_of(model, limited)

    got = run(body)
    assert (got.code, got.status) == ("UNKNOWN", None)  # not retried, as a streamed one
    assert got.message.startswith(
        f"the model's reply cannot be logged: {vendor.name} sent a JSON reply too large to log"
    )
    assert f"more than {event_bound(LIMIT)} bytes" in got.message
    assert f"event limit of {LIMIT} bytes" in got.message
    assert "neither an error nor a reply" not in got.message
    assert len(wire.requests) == 1


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_json_reply_over_8_mib_is_refused_by_the_log_limit_not_as_neither_error_nor_reply(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    # The bound is now the log's (four times max_event_bytes, 16 MiB by default): a
    # 9 MB reply is read, and the turn fails it as over the 4 MiB event limit.
    wire.script(JsonReply(200, _plain_text_reply(vendor, "x" * 9_000_000)))
    with Runtime.open(tmp_path / "store") as rt:  # the default retry policy
        errors: list[Any] = []
        rt.on("agent/error", errors.append)
        agent = rt.spawn(model=vendor.model(wire.url))
        agent.followup("hi")
        assert agent.wait_idle(timeout=20)
        events = list(agent.session.events())
    (end,) = [e.data for e in events if e.type == "turn/end"]
    assert end.reason.kind == "error"
    message = end.reason.error.message
    assert message.startswith("the model's reply cannot be logged")
    assert "over the limit of 4194304 bytes" in message
    assert "neither an error nor a reply" not in message
    assert [e.error for e in errors] == [end.reason.error]
    assert len(wire.requests) == 1  # not retried
    assert check_invariants(events) == []


def _parts(*parts: bytes) -> Any:
    async def body() -> Any:
        for part in parts:
            yield part

    return body()


@pytest.mark.parametrize(
    "parts",
    [
        lambda big: (b'{"x": "' + b"a" * big + b'"}',),  # in one part
        lambda big: (b" " * (big // 2), b" " * (big // 2), b"  {}"),  # white space first
    ],
    ids=["one part", "white space"],
)
def test_a_json_body_over_the_bound_is_refused_however_its_bytes_arrive(parts: Any) -> None:
    # Before, a body that came in one part was never measured, and white space before
    # the JSON was gathered without a bound (re-stripped at each part: quadratic, on
    # the I/O loop every agent shares).
    import asyncio

    from runtime.providers.bodies import open_body
    from runtime.providers.failures import JsonReplyTooLargeError

    limit = 4096
    big = event_bound(limit) + 8
    with pytest.raises(JsonReplyTooLargeError, match="too large"):
        asyncio.run(open_body("application/json", _parts(*parts(big)), limit))
