"""Replies too large to log, streamed over loopback HTTP by real providers.

A reply fails as soon as it can no longer be logged (one delta over the event limit, a
running total of the reply past it, one server-sent event or unended line past four
times it), and the model call stops there: its connection is closed at the server and
its limiter slot is free for the agent's next request. Each stream below stalls after
its frames, so a call that was left running would never end by itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.providers.sse import event_bound
from storage import check_invariants

from .test_failures import VENDORS, Vendor
from .wire_formats import anthropic_frames, anthropic_reply, openai_chunk, openai_frames
from .wire_server import Sse, WireServer

LIMIT = 64 * 1024  # the runtime's max_event_bytes here: small, so the tests stay fast


def _opening(vendor: Vendor, *deltas: str) -> list[bytes]:
    """The first frames of a text reply with ``deltas``, no finish."""
    if vendor.name == "openai":
        chunks = [openai_chunk({"role": "assistant", "content": ""})]
        chunks += [openai_chunk({"content": d}) for d in deltas]
        return openai_frames(chunks, done=False)
    events = anthropic_reply([{"text": list(deltas)}], complete=False)
    return anthropic_frames(events[:-1])  # without the block's stop


def _facts(agent: Any, type_: str) -> list[Any]:
    return [e.data for e in agent.session.events() if e.type == type_]


def _abandoned_then_next(
    tmp_path: Path, wire: WireServer, vendor: Vendor, frames: list[bytes], **options: Any
) -> tuple[Any, list[Any], int]:
    """Run a turn on ``frames`` (then a stall) with one provider slot, check that its
    call is closed at the server, then run a second turn; the agent's turn ends, its
    error, and the text its chunks logged in the first turn."""
    wire.script(Sse(frames, then="stall"), Sse(vendor.frames()))
    model = vendor.model(wire.url, max_concurrency=1)
    with Runtime.open(tmp_path / "store", retry_policy=None, **options) as rt:
        errors: list[Any] = []
        rt.on("agent/error", errors.append)
        agent = rt.spawn(model=model)
        agent.followup("hi")
        assert agent.wait_idle(timeout=20), "the oversize reply did not end the turn"
        assert wire.requests[0].disconnected.wait(10), "the abandoned call streams on"
        logged = sum(len(c.chunk.text) for c in _facts(agent, "assistant/chunk"))
        agent.followup("again")  # with one slot, this waited for the abandoned call
        assert agent.wait_idle(timeout=20), "the next request waited for the old one"
        ends = _facts(agent, "turn/end")
        assert check_invariants(list(agent.session.events())) == []
    assert [e.reason.kind for e in ends] == ["error", "completed"]
    assert [e.error for e in errors] == [ends[0].reason.error]
    assert len(wire.requests) == 2
    return ends[0].reason.error, ends, logged


@pytest.mark.parametrize("vendor", VENDORS)
def test_one_delta_over_the_event_limit_ends_the_turn_and_stops_the_call(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    # The call streamed on with no reader (28 MB in 3 s) and kept its limiter slot: the
    # agent's next request waited until that stream ended; cancel()/dispose() left it.
    frames = _opening(vendor, "x", "B" * (5 << 20)) + _opening(vendor, "y" * 1000)[-1:] * 20
    error, _, _ = _abandoned_then_next(tmp_path, wire, vendor, frames)
    assert error.message.startswith("the model's reply cannot be logged")
    assert "over the limit of 4194304 bytes" in error.message


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_reply_that_streams_past_the_event_limit_fails_there_and_stops_the_call(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    # Only the assembled message was measured: every chunk was logged (a 100 MB reply:
    # 88,706 chunk events), and an endless one was read until the read timeout.
    delta = "y" * 1024
    frames = _opening(vendor, *[delta] * (4 * LIMIT // len(delta)))
    error, _, logged = _abandoned_then_next(tmp_path, wire, vendor, frames, max_event_bytes=LIMIT)
    assert error.message.startswith("the model's reply cannot be logged")
    assert f"(the limit is {LIMIT} bytes)" in error.message
    assert LIMIT < logged <= LIMIT + len(delta)  # it stopped at the first delta past it


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(
    "shape", ["one unended line", "one event of many data lines"], ids=["line", "event"]
)
def test_a_server_sent_event_past_four_times_the_event_limit_fails_the_call(
    tmp_path: Path, wire: WireServer, vendor: Vendor, shape: str
) -> None:
    # An endless line with no newline was buffered without a bound (200 MB in a probe).
    piece = b"z" * (64 * 1024)
    count = event_bound(LIMIT) // len(piece) + 2
    if shape == "one unended line":
        endless = [b"data: "] + [piece] * count
    else:
        endless = [b"data: " + piece + b"\n"] * count
    frames = _opening(vendor, "x") + endless
    error, _, _ = _abandoned_then_next(tmp_path, wire, vendor, frames, max_event_bytes=LIMIT)
    assert error.message.startswith(f"the model's reply cannot be logged: {vendor.name} sent")
    assert f"more than {event_bound(LIMIT)} bytes" in error.message
    assert error.code == "UNKNOWN"
