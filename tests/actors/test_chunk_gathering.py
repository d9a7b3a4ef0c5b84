"""A reply of very many deltas has them gathered into few chunk events (``HeldChunks``),
so that its ``assistant/message`` cites few seqs; the gathered chunks assemble to the
same message, and a cancel keeps every delta taken before it, logged and cited."""

from __future__ import annotations

from typing import Any

from actors.effects import Checkpoint, Flush, NextBatch, OpenStream
from actors.testing import TurnHarness
from actors.turn.assembly import Assembler, HeldChunks
from storage import assert_invariants
from storage.events import (
    FinishChunk,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
    UserCause,
)


def _deltas() -> list[Any]:
    """Interleaved text, reasoning (signatures on some pieces), two tool calls whose id
    and name come on their first pieces (a later id wins, a later name does not), usage
    twice and a finish."""
    return [
        ReasoningDelta(text="thi"),
        TextDelta(text="he"),
        ReasoningDelta(text="nk", signature="s1"),
        ToolCallDelta(index=1, call_id="c1", name="second", arguments_delta='{"a"'),
        ToolCallDelta(index=0, name="first", arguments_delta="{"),
        UsageChunk(usage=Usage(input_tokens=1, output_tokens=1)),
        TextDelta(text="llo"),
        ToolCallDelta(index=1, name="renamed", arguments_delta=": 1}"),
        ToolCallDelta(index=0, call_id="c0", arguments_delta="}"),
        ReasoningDelta(text="!"),
        UsageChunk(usage=Usage(input_tokens=3, output_tokens=2)),
        FinishChunk(reason="tool-calls"),
    ]


def test_gathered_chunks_assemble_to_the_same_message_as_the_deltas_they_hold() -> None:
    direct = Assembler(1, 1)
    for seq, delta in enumerate(_deltas()):
        direct.add(delta, seq)
    held = HeldChunks()
    for delta in _deltas():
        held.hold(delta)
    assert held.chars == len("think!hello") + len('{"a": 1}{}')
    gathered = Assembler(1, 1)
    released = held.release()
    for seq, chunk in enumerate(released):
        gathered.add(chunk, seq)
    assert not held and held.chars == 0
    # One chunk per run, in the order the runs began.
    assert [type(c).__name__ for c in released] == [
        "ReasoningDelta",
        "TextDelta",
        "ToolCallDelta",
        "ToolCallDelta",
        "UsageChunk",
        "FinishChunk",
    ]
    assert gathered.message(with_calls=True) == direct.message(with_calls=True)
    assert [(c.call_id, c.name) for c in gathered.calls()] == [("c0", "first"), ("c1", "second")]
    assert (gathered.usage, gathered.finish) == (direct.usage, direct.finish)
    assert gathered.streamed == direct.streamed


def test_citations_are_counted_as_the_bytes_their_seqs_take_in_json() -> None:
    assembler = Assembler(1, 1)
    for seq in (7, 42, 999, 1000, 123_456):
        assembler.cite(seq)
    assert assembler.cited == len("7,42,999,1000,123456,")
    assert assembler.chunk_seqs == [7, 42, 999, 1000, 123_456]


def test_a_cancel_while_deltas_are_held_logs_them_and_keeps_them_in_the_visible_prefix() -> None:
    # The harness's event limit is the default 4 MiB: deltas are logged one by one until
    # their citations take 64 KiB (~12,800 chunk events), then gathered.
    harness = TurnHarness()
    harness.insert("go")
    harness.start()
    harness.send()  # checkpoint passed
    assert isinstance(harness.send(), OpenStream)  # flushed: the request is sent
    assert isinstance(harness.send("stream"), NextBatch)
    text = "a" * 13_000 + "b" * 300
    assert isinstance(harness.send([TextDelta(text=c) for c in text]), NextBatch)
    logged = "".join(
        e.data.chunk.text for e in harness.session.events() if e.type == "assistant/chunk"
    )
    assert len(logged) < len(text)  # the last deltas are held, not logged yet
    assert isinstance(harness.cancel(UserCause()), Flush)
    assert isinstance(harness.send(), Checkpoint)  # after settled: what it sent lands
    assert harness.send() is None
    events = harness.session.events()
    chunks = {e.seq: e.data.chunk for e in events if e.type == "assistant/chunk"}
    (message,) = [e.data for e in events if e.type == "assistant/message"]
    assert message.interrupted
    assert message.message.content[0].text == text
    assert message.source_event_seqs == tuple(sorted(chunks))
    assert "".join(chunks[seq].text for seq in message.source_event_seqs) == text
    assert events[-1].data.reason.kind == "aborted"
    assert_invariants(events)
