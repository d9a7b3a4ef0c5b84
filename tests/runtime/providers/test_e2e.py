"""Real agents on the runtime, streaming from the loopback server through real providers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime import Retry, RetryPolicy, Runtime, UsageLimits
from runtime.providers import HttpProvider, OpenAICompatModel
from storage import check_invariants
from storage.events import (
    AssistantMessage,
    AssistantMessageData,
    TextBlock,
    ToolCallBlock,
    TurnEnd,
    TurnStart,
)

from .support import KEY
from .test_failures import OPENAI, VENDORS, Vendor
from .wire_formats import (
    anthropic_frames,
    anthropic_reply,
    openai_chunk,
    openai_frames,
    openai_text_reply,
    openai_tool_reply,
    openai_usage,
)
from .wire_server import JsonReply, Sse, WireServer

FAST_RETRY = RetryPolicy(base_s=0.01, cap_s=0.05)


@contextmanager
def runtime_with(path: Path, model: HttpProvider[Any], **options: Any) -> Iterator[Runtime]:
    """A runtime; closing it closes the provider's pooled connections on its I/O loop."""
    with Runtime.open(path / "store", **options) as rt:
        yield rt


def facts(agent: Any, type_: str) -> list[Any]:
    return [e.data for e in agent.session.events() if e.type == type_]


def settled_turns(rt: Runtime) -> list[Any]:
    settled: list[Any] = []
    rt.on("agent/settled", settled.append)
    return settled


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(
    ("header", "retry_after"),
    [({"retry-after-ms": "10"}, 0.01), ({"retry-after": "inf"}, None)],
    ids=["retry-after-ms", "an infinite retry-after is ignored"],
)
def test_a_429_then_success_is_two_turns_and_one_settled(
    tmp_path: Path,
    wire: WireServer,
    vendor: Vendor,
    header: dict[str, str],
    retry_after: float | None,
) -> None:
    # An infinite Retry-After made the failure malformed: an unretried UNKNOWN.
    limited = JsonReply(429, {"error": {"message": "slow down"}}, header)
    wire.script(limited, Sse(vendor.frames()))
    model = vendor.model(wire.url)
    with runtime_with(tmp_path, model, retry_policy=FAST_RETRY) as rt:
        settled = settled_turns(rt)
        agent = rt.spawn(model=model)
        agent.followup("hi")
        assert agent.wait_idle(timeout=20)
        starts = facts(agent, "turn/start")
        ends = facts(agent, "turn/end")
        retries = facts(agent, "llm/retry")
        messages = agent.session.derive_messages()
    assert [s.trigger.kind for s in starts] == ["message", "retry"]
    assert [e.reason.kind for e in ends] == ["error", "completed"]
    assert ends[0].reason.error.code == "RATE_LIMIT"
    assert [r.failure.retry_after_s for r in retries] == [retry_after]
    assert len(settled) == 1
    assert settled[0].reason.kind == "completed"
    assert messages[-1] == AssistantMessage(content=(TextBlock(text="Hello there"),))
    assert len(wire.requests) == 2


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_stream_dropped_mid_reply_is_a_transport_failure_retried_by_the_policy(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    wire.script(Sse(vendor.frames()[:3], then="drop"), Sse(vendor.frames()))
    model = vendor.model(wire.url)
    with runtime_with(tmp_path, model, retry_policy=FAST_RETRY) as rt:
        settled = settled_turns(rt)
        agent = rt.spawn(model=model)
        agent.followup("hi")
        assert agent.wait_idle(timeout=20)
        ends = facts(agent, "turn/end")
        retries = facts(agent, "llm/retry")
    assert [e.reason.kind for e in ends] == ["error", "completed"]
    assert ends[0].reason.error.code == "TRANSPORT"
    assert [r.failure.code for r in retries] == ["TRANSPORT"]
    assert [s.reason.kind for s in settled] == ["completed"]


def test_without_retries_a_dropped_stream_ends_the_turn_with_its_error(
    tmp_path: Path, wire: WireServer
) -> None:
    vendor = VENDORS[0].values[0]
    wire.script(Sse(vendor.frames()[:3], then="drop"))
    model = vendor.model(wire.url)
    with runtime_with(tmp_path, model, retry_policy=None) as rt:
        errors: list[Any] = []
        rt.on("agent/error", errors.append)
        agent = rt.spawn(model=model)
        agent.followup("hi")
        assert agent.wait_idle(timeout=20)
        ends = facts(agent, "turn/end")
    assert [e.reason.kind for e in ends] == ["error"]
    assert [e.error.code for e in errors] == ["TRANSPORT"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_cancelling_an_agent_mid_stream_closes_the_connection_at_the_server(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    wire.script(Sse(vendor.frames()[:4], then="stall"))
    model = vendor.model(wire.url)
    with runtime_with(tmp_path, model) as rt:
        agent = rt.spawn(model=model)
        streaming = threading.Event()

        def on_event(live: Any) -> None:
            if live.event.type == "assistant/chunk":
                streaming.set()

        agent.on("session/event", on_event)
        agent.followup("hi")
        assert streaming.wait(20), "no chunk arrived"
        agent.cancel()
        assert wire.requests[0].disconnected.wait(10), "the server did not see the close"
        assert agent.wait_idle(timeout=20)
        ends = facts(agent, "turn/end")
        messages = facts(agent, "assistant/message")
    assert [e.reason.kind for e in ends] == ["aborted"]
    assert all(isinstance(m, AssistantMessageData) for m in messages)
    assert [m.interrupted for m in messages] == [True]


def test_an_agent_runs_a_tool_loop_over_a_real_provider(tmp_path: Path, wire: WireServer) -> None:
    calls = [("call_1", "add", ['{"a": 2,', ' "b": 3}'])]
    wire.script(
        Sse(openai_frames(openai_tool_reply(calls))),
        Sse(openai_frames(openai_text_reply("The sum is 5."))),
    )

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    model = OpenAICompatModel("m", base_url=wire.url + "/v1", api_key=KEY)
    with runtime_with(tmp_path, model) as rt:
        agent = rt.spawn(model=model, tools=[add])
        agent.followup("what is 2 + 3?")
        assert agent.wait_idle(timeout=20)
        messages = agent.session.derive_messages()
        starts = [e for e in agent.session.events() if e.type == "turn/start"]
        ends = facts(agent, "turn/end")
    assert isinstance(starts[0].data, TurnStart)
    assert all(isinstance(e, TurnEnd) for e in ends)
    assert [e.reason.kind for e in ends] == ["completed"]
    assert messages[1] == AssistantMessage(
        content=(ToolCallBlock(call_id="call_1", name="add", arguments='{"a": 2, "b": 3}'),)
    )
    assert messages[-1] == AssistantMessage(content=(TextBlock(text="The sum is 5."),))
    second = wire.requests[1].body
    assert second["tools"][0]["function"]["name"] == "add"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}


def _two_calls_sharing_an_id(vendor: Vendor) -> list[bytes]:
    """A reply whose two calls of ``add`` the model gave one id."""
    if vendor.name == "openai":
        calls = [("call_X", "add", ['{"a": 1, "b": 2}']), ("call_X", "add", ['{"a": 3, "b": 4}'])]
        return openai_frames(openai_tool_reply(calls))
    blocks = [{"tool": ("call_X", "add", ['{"a": 1, "b": 2}'])}]
    blocks.append({"tool": ("call_X", "add", ['{"a": 3, "b": 4}'])})
    return anthropic_frames(anthropic_reply(blocks, stop_reason="tool_use"))


def _echoed_call_ids(body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The call ids and the answered ids a request sends back, in either vendor's shape."""
    calls: list[str] = []
    answered: list[str] = []
    for message in body["messages"]:
        calls += [c["id"] for c in message.get("tool_calls") or []]
        if message["role"] == "tool":
            answered.append(message["tool_call_id"])
        if isinstance(message["content"], list):
            calls += [b["id"] for b in message["content"] if b["type"] == "tool_use"]
            answered += [b["tool_use_id"] for b in message["content"] if b["type"] == "tool_result"]
    return calls, answered


@pytest.mark.parametrize("vendor", VENDORS)
def test_two_calls_streamed_with_one_id_are_logged_and_echoed_with_distinct_ids(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    wire.script(Sse(_two_calls_sharing_an_id(vendor)), Sse(vendor.frames()))

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    model = vendor.model(wire.url)
    with runtime_with(tmp_path, model) as rt:
        agent = rt.spawn(model=model, tools=[add])
        agent.followup("what are 1 + 2 and 3 + 4?")
        assert agent.wait_idle(timeout=20)
        events = list(agent.session.events())
        results = facts(agent, "tool/result")
        ends = facts(agent, "turn/end")
    assert [e.reason.kind for e in ends] == ["completed"]
    assert check_invariants(events) == []
    assert [(r.message.call_id, r.message.content[0].text) for r in results] == [
        ("call_X", "3"),
        ("call_X_1", "7"),
    ]
    calls, answered = _echoed_call_ids(wire.requests[1].body)
    assert calls == answered == ["call_X", "call_X_1"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_one_provider_shared_by_two_runtimes_keeps_one_connection_in_each_and_each_close_closes_its_own(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    wire.default = Sse(vendor.frames())
    model = vendor.model(wire.url)
    first = Runtime.open(tmp_path / "first")
    with Runtime.open(tmp_path / "second") as second:
        try:
            agents = [first.spawn(model=model), second.spawn(model=model)]
            for _ in range(3):  # the two runtimes' I/O loops take turns with the one model
                for agent in agents:
                    agent.followup("hi")
                    assert agent.wait_idle(timeout=20)
            assert len({r.peer for r in wire.requests}) == 2  # one kept-alive each
        finally:
            first.close()
        assert wire.wait_for_open_connections(1), f"{wire.open_connections} open"
        agents[1].followup("still there?")  # the second runtime's client was not closed
        assert agents[1].wait_idle(timeout=20)
        ends = facts(agents[1], "turn/end")
    assert [e.reason.kind for e in ends] == ["completed"] * 4
    assert len({r.peer for r in wire.requests}) == 2
    assert wire.wait_for_open_connections(0), f"{wire.open_connections} open after both closes"


def _reply_using(vendor: Vendor, input_tokens: int, output_tokens: int) -> Sse:
    if vendor.name == "openai":
        usage = openai_usage(input_tokens, output_tokens)
        return Sse(openai_frames(openai_text_reply("ok", usage=usage)))
    reply = anthropic_reply(
        [{"text": ["ok"]}], input_tokens=input_tokens, output_tokens=output_tokens
    )
    return Sse(anthropic_frames(reply))


@pytest.mark.parametrize("vendor", VENDORS)
def test_negative_token_counts_do_not_lower_the_usage_meter_under_a_token_limit(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    wire.script(
        _reply_using(vendor, 40, 20),
        _reply_using(vendor, -1_000_000, -5),
        _reply_using(vendor, 40, 20),
        _reply_using(vendor, 40, 20),
    )
    model = vendor.model(wire.url)
    with runtime_with(tmp_path, model) as rt:
        agent = rt.spawn(model=model, limits=UsageLimits(max_tokens=100))
        for n in range(4):
            agent.followup(f"question {n}")
            assert agent.wait_idle(timeout=20)
        ends = facts(agent, "turn/end")
        usages = [m.usage for m in facts(agent, "assistant/message")]
    assert [e.reason.kind for e in ends] == ["completed"] * 3 + ["limit"]  # 60 + ~0 + 60
    assert all(min(u.input_tokens, u.output_tokens) >= 0 for u in usages)


def test_a_reply_the_server_ended_with_finish_reason_error_is_retried_not_taken_as_complete(
    tmp_path: Path, wire: WireServer
) -> None:
    # OpenRouter ends a reply its upstream failed with ``finish_reason: "error"``.
    truncated = Sse(openai_frames(openai_text_reply("partial ", finish="error")))
    wire.script(truncated, Sse(openai_frames(openai_text_reply("whole reply"))))
    model = OPENAI.model(wire.url)
    offered: list[BaseException] = []

    def retry(event: Any, next_: Any) -> Any:
        offered.append(event.error)
        return Retry()

    with runtime_with(tmp_path, model, retry_policy=None) as rt:
        rt.on("agent/request-error", retry)
        agent = rt.spawn(model=model)
        agent.followup("hi")
        assert agent.wait_idle(timeout=20)
        ends = facts(agent, "turn/end")
        replies = [m.message for m in facts(agent, "assistant/message") if not m.interrupted]
    assert [e.reason.kind for e in ends] == ["error", "completed"]
    assert ends[0].reason.error.code == "SERVER"
    assert replies == [AssistantMessage(content=(TextBlock(text="whole reply"),))]
    # The error offered to listeners carries no SDK exception (it holds the key).
    assert [(e.__cause__, e.__context__) for e in offered] == [(None, None)]


def _max_tokens_with_nothing_visible(vendor: Vendor) -> list[bytes]:
    """A reply whose whole budget went on hidden reasoning: no text, no call, cut off."""
    if vendor.name == "openai":
        chunks = [openai_chunk({"role": "assistant", "content": ""})]
        chunks.append(openai_chunk({}, finish="length"))
        chunks.append(openai_chunk(usage=openai_usage(5, 256, reasoning=256)))
        return openai_frames(chunks)
    return anthropic_frames(anthropic_reply([], stop_reason="max_tokens", output_tokens=256))


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_max_tokens_finish_with_nothing_visible_ends_the_turn_max_tokens_without_a_retry(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    # It was an EMPTY_RESPONSE, retried five times by the default policy.
    wire.script(Sse(_max_tokens_with_nothing_visible(vendor)))
    wire.default = Sse(vendor.frames())  # what a retry, or the next turn, gets
    model = vendor.model(wire.url)
    with runtime_with(tmp_path, model, retry_policy=FAST_RETRY) as rt:
        settled = settled_turns(rt)
        agent = rt.spawn(model=model)
        agent.followup("hi")
        assert agent.wait_idle(timeout=20)
        assert len(wire.requests) == 1
        agent.followup("go on")  # the empty, cut-off reply is sent back as it was logged
        assert agent.wait_idle(timeout=20)
        events = list(agent.session.events())
        ends = facts(agent, "turn/end")
        messages = facts(agent, "assistant/message")
        retries = facts(agent, "llm/retry")
    assert [e.reason.kind for e in ends] == ["max-tokens", "completed"]
    assert [s.reason.kind for s in settled] == ["max-tokens", "completed"]
    assert retries == []
    assert [m.finish_reason for m in messages] == ["max-tokens", "stop"]
    assert messages[0].message == AssistantMessage(content=())
    assert len(wire.requests) == 2
    assert check_invariants(events) == []
