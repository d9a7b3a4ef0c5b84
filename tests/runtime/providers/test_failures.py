"""Every failure, through both real SDK clients, normalized to a CONTRACT 5 code."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from runtime.providers import AnthropicModel, OpenAICompatModel, classify, retry_after_seconds
from runtime.providers.base import HttpProvider
from storage.events import FinishChunk, LlmFailure

from .support import ANTHROPIC_KEY, KEY, collect, failure_of, request, run
from .wire_formats import (
    anthropic_frames,
    anthropic_reply,
    openai_chunk,
    openai_frames,
    openai_text_reply,
)
from .wire_server import Hangup, JsonReply, Reply, Sse, Stall, WireServer


@dataclass(frozen=True)
class Vendor:
    name: str
    make: Callable[..., HttpProvider[Any]]
    frames: Callable[[], list[bytes]]
    id_header: str
    context_error: dict[str, Any]

    def model(self, url: str, **options: Any) -> HttpProvider[Any]:
        return self.make(url, **options)


OPENAI = Vendor(
    "openai",
    lambda url, **kw: OpenAICompatModel("m", base_url=url + "/v1", **{"api_key": KEY, **kw}),
    lambda: openai_frames(openai_text_reply("Hello", " there")),
    "x-request-id",
    {
        "error": {
            "message": "This model's maximum context length is 128000 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    },
)
ANTHROPIC = Vendor(
    "anthropic",
    lambda url, **kw: AnthropicModel(
        "claude-sonnet-4-6", base_url=url, **{"api_key": ANTHROPIC_KEY, **kw}
    ),
    lambda: anthropic_frames(anthropic_reply([{"text": ["Hello", " there"]}])),
    "request-id",
    {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 210000 tokens > 200000 maximum",
        },
    },
)
VENDORS = [pytest.param(OPENAI, id="openai"), pytest.param(ANTHROPIC, id="anthropic")]


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def fail(wire: WireServer, vendor: Vendor, reply: Reply, **options: Any) -> LlmFailure:
    wire.script(reply)

    async def body() -> LlmFailure:
        async with vendor.model(wire.url, **options) as model:
            return await failure_of(model, request())

    return run(body)


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_429_is_a_rate_limit_with_retry_after_and_the_request_id(
    wire: WireServer, vendor: Vendor
) -> None:
    headers = {"retry-after": "7", vendor.id_header: "req_429"}
    failure = fail(wire, vendor, JsonReply(429, error_body("rate_limit_error", "slow"), headers))
    assert (failure.code, failure.status) == ("RATE_LIMIT", 429)
    assert failure.retry_after_s == 7.0
    assert failure.request_id == "req_429"


@pytest.mark.parametrize("vendor", VENDORS)
def test_retry_after_ms_takes_precedence(wire: WireServer, vendor: Vendor) -> None:
    headers = {"retry-after-ms": "1500", "retry-after": "9"}
    failure = fail(wire, vendor, JsonReply(429, error_body("rate_limit_error", "slow"), headers))
    assert failure.retry_after_s == 1.5


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (500, "api_error", "SERVER"),
        (503, "api_error", "SERVER"),
        (529, "overloaded_error", "SERVER"),
        (401, "authentication_error", "AUTH"),
        (403, "permission_error", "AUTH"),
        (400, "invalid_request_error", "INVALID_REQUEST"),
        (404, "not_found_error", "INVALID_REQUEST"),
    ],
)
def test_http_statuses_map_to_failure_codes(
    wire: WireServer, vendor: Vendor, status: int, kind: str, code: str
) -> None:
    headers = {vendor.id_header: f"req_{status}"}
    failure = fail(wire, vendor, JsonReply(status, error_body(kind, "nope"), headers))
    assert (failure.code, failure.status, failure.request_id) == (code, status, f"req_{status}")
    assert "nope" in failure.message
    assert failure.retry_after_s is None


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(
    ("status", "kind"), [(503, "api_error"), (529, "overloaded_error"), (500, "api_error")]
)
@pytest.mark.parametrize(
    ("headers", "seconds"),
    [({"retry-after": "2"}, 2.0), ({"retry-after-ms": "250", "retry-after": "9"}, 0.25)],
)
def test_a_server_error_with_retry_after_is_a_server_failure_that_carries_it(
    wire: WireServer,
    vendor: Vendor,
    status: int,
    kind: str,
    headers: dict[str, str],
    seconds: float,
) -> None:
    failure = fail(wire, vendor, JsonReply(status, error_body(kind, "busy"), headers))
    assert (failure.code, failure.status) == ("SERVER", status)
    assert failure.retry_after_s == seconds


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "inf"}, None),
        ({"retry-after": "1e400"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after-ms": "inf", "retry-after": "3"}, 3.0),
        ({"retry-after": "10000000000"}, 1e10),  # huge but finite: the policy bounds it
    ],
)
def test_a_retry_after_that_is_not_finite_is_ignored_and_a_huge_one_kept(
    wire: WireServer, vendor: Vendor, headers: dict[str, str], seconds: float | None
) -> None:
    failure = fail(wire, vendor, JsonReply(429, error_body("rate_limit_error", "slow"), headers))
    assert (failure.code, failure.status) == ("RATE_LIMIT", 429)
    assert failure.retry_after_s == seconds


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_context_length_400_is_context_window_exceeded(wire: WireServer, vendor: Vendor) -> None:
    failure = fail(wire, vendor, JsonReply(400, vendor.context_error))
    assert (failure.code, failure.status) == ("CONTEXT_WINDOW_EXCEEDED", 400)


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_connection_dropped_mid_stream_is_transport_and_keeps_the_request_id(
    wire: WireServer, vendor: Vendor
) -> None:
    frames = vendor.frames()[:3]
    reply = Sse(frames, then="drop", headers={vendor.id_header: "req_drop"})
    failure = fail(wire, vendor, reply)
    assert failure.code == "TRANSPORT"
    assert failure.request_id == "req_drop"


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_connection_closed_without_a_response_is_transport(
    wire: WireServer, vendor: Vendor
) -> None:
    assert fail(wire, vendor, Hangup()).code == "TRANSPORT"


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_refused_connection_is_transport(vendor: Vendor) -> None:
    with socket.socket() as sock:  # a loopback port that nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def body() -> LlmFailure:
        async with vendor.model(f"http://127.0.0.1:{port}") as model:
            return await failure_of(model, request())

    failure = run(body)
    assert failure.code == "TRANSPORT"
    assert failure.status is None


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_stalled_stream_times_out(wire: WireServer, vendor: Vendor) -> None:
    reply = Sse(vendor.frames()[:2], then="stall")
    failure = fail(wire, vendor, reply, timeout=0.3)
    assert failure.code == "TIMEOUT"
    assert wire.requests[0].disconnected.wait(5), "the client did not close the stalled stream"


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_server_that_never_answers_times_out(wire: WireServer, vendor: Vendor) -> None:
    assert fail(wire, vendor, Stall(), timeout=0.3).code == "TIMEOUT"


def test_an_openai_error_chunk_mid_stream_is_classified_by_its_type(wire: WireServer) -> None:
    chunks = [openai_chunk({"content": "Hi"})]
    chunks.append({"error": {"message": "The server had an error", "type": "server_error"}})
    failure = fail(wire, OPENAI, Sse(openai_frames(chunks, done=False)))
    assert (failure.code, failure.status) == ("SERVER", None)


def test_an_anthropic_overloaded_event_mid_stream_is_a_server_failure(wire: WireServer) -> None:
    events = anthropic_reply([{"text": ["Hi"]}], complete=False)
    events.append(error_body("overloaded_error", "Overloaded"))
    failure = fail(wire, ANTHROPIC, Sse(anthropic_frames(events), headers={"request-id": "r1"}))
    assert (failure.code, failure.request_id) == ("SERVER", "r1")
    assert "overloaded_error" in failure.message


def test_an_openai_stream_without_a_finish_reason_is_transport(wire: WireServer) -> None:
    frames = openai_frames([openai_chunk({"content": "Hi"})])
    assert fail(wire, OPENAI, Sse(frames)).code == "TRANSPORT"


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_provider_recovers_after_a_failure(wire: WireServer, vendor: Vendor) -> None:
    wire.script(JsonReply(500, error_body("api_error", "x")), Sse(vendor.frames()))

    async def body() -> list[Any]:
        async with vendor.model(wire.url) as model:
            await failure_of(model, request())
            return await collect(model, request())

    assert len(run(body)) >= 3


def test_retry_after_accepts_an_http_date() -> None:
    headers = {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}
    now = 1445412480.0 - 30  # 30 s before that date
    assert retry_after_seconds(headers, now=lambda: now) == 30.0


def test_retry_after_ignores_garbage_and_never_goes_negative() -> None:
    assert retry_after_seconds({"retry-after": "soon"}) is None
    for not_finite in ("inf", "-inf", "nan", "1e400", "Infinity"):
        assert retry_after_seconds({"retry-after": not_finite}) is None
        assert retry_after_seconds({"retry-after-ms": not_finite}) is None
    assert retry_after_seconds({"retry-after": "1e300"}) == 1e300
    assert retry_after_seconds({"retry-after": "-4"}) == 0.0
    assert retry_after_seconds({}) is None


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TimeoutError(), "TIMEOUT"),
        (ConnectionResetError("reset by peer"), "TRANSPORT"),
        (ValueError("bug"), "UNKNOWN"),
    ],
)
def test_plain_exceptions_are_classified_too(error: BaseException, code: str) -> None:
    assert classify(error, vendor="x").code == code


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ({"message": "Rate limit exceeded", "code": 429}, "RATE_LIMIT"),
        ({"message": "Provider returned error", "code": 502}, "SERVER"),
        ({"message": "Gateway timeout", "code": "504"}, "SERVER"),
        ({"message": "Invalid model", "code": 400}, "INVALID_REQUEST"),
        ("model is overloaded, please retry", "SERVER"),
        ("rate limit reached for this model", "RATE_LIMIT"),
        ("something odd happened", "UNKNOWN"),
    ],
    ids=["code 429", "code 502", "code '504'", "code 400", "overloaded text", "rate text", "odd"],
)
def test_an_openai_error_event_mid_stream_with_an_http_style_code_or_only_a_text_is_classified(
    wire: WireServer, error: object, code: str
) -> None:
    chunks = [openai_chunk({"content": "partial "}), {"error": error}]
    failure = fail(wire, OPENAI, Sse(openai_frames(chunks, done=False)))
    assert (failure.code, failure.status) == (code, None)


@pytest.mark.parametrize("reason", ["error", "abort", "insufficient_system_resource"])
def test_an_openai_finish_reason_saying_the_server_failed_is_a_server_failure_not_a_reply(
    wire: WireServer, reason: str
) -> None:
    frames = openai_frames(openai_text_reply("truncated", finish=reason))
    failure = fail(wire, OPENAI, Sse(frames, headers={"x-request-id": "req_fin"}))
    assert (failure.code, failure.request_id) == ("SERVER", "req_fin")
    assert repr(reason) in failure.message


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_finish_reason_corral_does_not_know_fails_the_request_instead_of_reading_as_stop(
    wire: WireServer, vendor: Vendor
) -> None:
    if vendor is OPENAI:
        frames = openai_frames(openai_text_reply("maybe cut", finish="brand_new_reason"))
    else:
        events = anthropic_reply([{"text": ["maybe cut"]}], stop_reason="brand_new_reason")
        frames = anthropic_frames(events)
    failure = fail(wire, vendor, Sse(frames))
    assert failure.code == "UNKNOWN"
    assert "'brand_new_reason'" in failure.message


@pytest.mark.parametrize(("reason", "finish"), [("eos", "stop"), ("model_length", "max-tokens")])
def test_finish_reasons_of_other_compatible_servers_are_known(
    wire: WireServer, reason: str, finish: str
) -> None:
    wire.script(Sse(openai_frames(openai_text_reply("done", finish=reason))))

    async def body() -> list[Any]:
        async with OPENAI.model(wire.url) as model:
            return await collect(model, request())

    assert run(body)[-1] == FinishChunk(reason=finish)  # type: ignore[arg-type]


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_stalled_stream_says_it_stalled_and_after_how_long(
    wire: WireServer, vendor: Vendor
) -> None:
    failure = fail(wire, vendor, Sse(vendor.frames()[:2], then="stall"), timeout=0.3)
    assert failure.code == "TIMEOUT"
    assert "no data from the server for 0.3 s (the stream stalled)" in failure.message


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_server_that_never_answers_is_a_timeout_that_says_so(
    wire: WireServer, vendor: Vendor
) -> None:
    failure = fail(wire, vendor, Stall(), timeout=0.3)
    assert failure.code == "TIMEOUT"
    assert "no data from the server for 0.3 s (no response to the request)" in failure.message
