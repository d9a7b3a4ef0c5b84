"""Replies too large to log, streamed over loopback HTTP by real providers.

A reply fails as soon as it can no longer be logged (one delta over the event limit, a
running total of the reply past it, its text with the citations of its chunks past it,
one server-sent event or unended line past four times it), and the model call stops
there: its connection is closed at the server and its limiter slot is free for the
agent's next request. Each stream below stalls after its frames, so a call that was
left running would never end by itself. A reply whose text fits is logged however many
deltas it streamed in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.providers.sse import event_bound
from storage import check_invariants

from .test_failures import VENDORS, Vendor
from .wire_formats import (
    anthropic_frames,
    anthropic_reply,
    openai_chunk,
    openai_frames,
    openai_text_reply,
)
from .wire_server import Sse, WireServer

LIMIT = 64 * 1024  # the runtime's max_event_bytes here: small, so the tests stay fast
SMALL = 16 * 1024  # for replies of one-character deltas: one frame each


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
) -> tuple[Any, list[Any], int, int]:
    """Run a turn on ``frames`` (then a stall) with one provider slot, check that its
    call is closed at the server, then run a second turn; the first turn's error, the
    agent's turn ends, and what the first turn's chunks logged: their characters of
    text, and the bytes its ``assistant/message`` would have taken to cite them."""
    wire.script(Sse(frames, then="stall"), Sse(vendor.frames()))
    model = vendor.model(wire.url, max_concurrency=1)
    with Runtime.open(tmp_path / "store", retry_policy=None, **options) as rt:
        errors: list[Any] = []
        rt.on("agent/error", errors.append)
        agent = rt.spawn(model=model)
        agent.followup("hi")
        assert agent.wait_idle(timeout=20), "the oversize reply did not end the turn"
        assert wire.requests[0].disconnected.wait(10), "the abandoned call streams on"
        chunks = [e for e in agent.session.events() if e.type == "assistant/chunk"]
        logged = sum(len(e.data.chunk.text) for e in chunks)
        cited = sum(len(str(e.seq)) + 1 for e in chunks)
        agent.followup("again")  # with one slot, this waited for the abandoned call
        assert agent.wait_idle(timeout=20), "the next request waited for the old one"
        ends = _facts(agent, "turn/end")
        assert check_invariants(list(agent.session.events())) == []
    assert [e.reason.kind for e in ends] == ["error", "completed"]
    assert [e.error for e in errors] == [ends[0].reason.error]
    assert len(wire.requests) == 2
    return ends[0].reason.error, ends, logged, cited


@pytest.mark.parametrize("vendor", VENDORS)
def test_one_delta_over_the_event_limit_ends_the_turn_and_stops_the_call(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    # The call streamed on with no reader (28 MB in 3 s) and kept its limiter slot: the
    # agent's next request waited until that stream ended; cancel()/dispose() left it.
    frames = _opening(vendor, "x", "B" * (5 << 20)) + _opening(vendor, "y" * 1000)[-1:] * 20
    error, _, _, _ = _abandoned_then_next(tmp_path, wire, vendor, frames)
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
    error, _, logged, cited = _abandoned_then_next(
        tmp_path, wire, vendor, frames, max_event_bytes=LIMIT
    )
    assert error.message.startswith("the model's reply cannot be logged: it is too large")
    assert f"(the limit is {LIMIT} bytes)" in error.message
    # It stopped at the first delta past it, counting the chunks' citations.
    assert LIMIT < logged + cited <= LIMIT + len(delta)


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
    error, _, _, _ = _abandoned_then_next(tmp_path, wire, vendor, frames, max_event_bytes=LIMIT)
    assert error.message.startswith(f"the model's reply cannot be logged: {vendor.name} sent")
    assert f"more than {event_bound(LIMIT)} bytes" in error.message
    assert error.code == "UNKNOWN"


def _whole(vendor: Vendor, *deltas: str) -> list[bytes]:
    """The frames of a whole text reply streamed in ``deltas``."""
    if vendor.name == "openai":
        return openai_frames(openai_text_reply(*deltas))
    return anthropic_frames(anthropic_reply([{"text": list(deltas)}]))


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_reply_whose_text_fits_the_event_limit_is_logged_however_many_deltas_it_came_in(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    # Its assistant/message cited one chunk event per delta: 15,000 one-character deltas
    # took ~90 KB of sourceEventSeqs, and the reply failed at its end, "cannot be logged".
    text = "".join(chr(ord("a") + i % 26) for i in range(15_000))
    wire.script(Sse(_whole(vendor, *text)))
    with Runtime.open(tmp_path / "store", retry_policy=None, max_event_bytes=SMALL) as rt:
        agent = rt.spawn(model=vendor.model(wire.url))
        agent.followup("hi")
        assert agent.wait_idle(timeout=20)
        events = list(agent.session.events())
    (end,) = [e.data for e in events if e.type == "turn/end"]
    assert end.reason.kind == "completed"
    (message,) = [e.data for e in events if e.type == "assistant/message"]
    assert message.message.content[0].text == text
    chunks = {e.seq: e.data.chunk for e in events if e.type == "assistant/chunk"}
    assert message.source_event_seqs == tuple(sorted(chunks))  # it cites every chunk event
    assert "".join(c.text for c in chunks.values() if c.kind == "text") == text
    assert len(chunks) < len(text) // 10  # the deltas were gathered
    with Runtime.open(tmp_path / "store", max_event_bytes=SMALL) as rt:  # read back whole
        resumed = rt.resume(agent.id, model=vendor.model(wire.url))
        assert check_invariants(list(resumed.session.events())) == []
        assert resumed.session.derive_messages()[-1].content[0].text == text


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_reply_too_large_with_the_citations_of_its_chunks_fails_while_it_streams(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    # Only its characters were counted while it streamed: a reply of fewer characters
    # than the limit, in one-character deltas, streamed to its end and then failed
    # "cannot be logged" (its assistant/message, with the citations, over the limit);
    # one that stalls there was never stopped.
    frames = _opening(vendor, *"z" * (SMALL - 200))
    error, _, logged, cited = _abandoned_then_next(
        tmp_path, wire, vendor, frames, max_event_bytes=SMALL
    )
    assert error.message.startswith("the model's reply cannot be logged: it is too large")
    assert f"(the limit is {SMALL} bytes)" in error.message
    assert error.code == "UNKNOWN"  # not retried
    assert logged < SMALL - 200  # it stopped before the deltas' end
    # At the first delta past the limit (then the deltas held with it were logged: one
    # more citation of at most 12 bytes).
    assert SMALL < logged + cited <= SMALL + 1 + 12
    assert cited <= SMALL // 16  # the deltas were gathered
