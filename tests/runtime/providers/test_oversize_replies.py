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
from storage import check_invariants

from .test_failures import VENDORS, Vendor
from .wire_formats import anthropic_frames, anthropic_reply, openai_chunk, openai_frames
from .wire_server import Sse, WireServer


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

