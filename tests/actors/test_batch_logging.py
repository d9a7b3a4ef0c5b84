"""A read's deltas are logged with one ``Session.extend`` when each would be logged one
by one anyway (``actors.turn.reply._log_direct``): the log is the same as with one
``append_fact`` per delta, for every shape of batch, and where a batch crosses the
point where deltas are gathered, or where the reply grows too large to log."""

from __future__ import annotations

from typing import Any

import pytest

from actors.effects import NextBatch, OpenStream, StreamEnd
from actors.testing import TurnHarness
from actors.turn import reply
from storage import assert_invariants
from storage.events import (
    FinishChunk,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)


def _words(n: int, start: int = 0) -> list[Any]:
    return [TextDelta(text=f"w{i:05d} ") for i in range(start, start + n)]


MIXED = [
    ReasoningDelta(text="think"),
    ReasoningDelta(text="ing", signature="sig"),
    *_words(5),
    ToolCallDelta(index=0, call_id="c0", name="f", arguments_delta='{"a": 1}'),
    *_words(3, 5),
    UsageChunk(usage=Usage(input_tokens=3, output_tokens=9)),
]
SHAPES = {
    # one read of a whole reply, its finish and its end
    "whole": [[*_words(50), FinishChunk(reason="stop"), StreamEnd()]],
    # reads of a few deltas each, the end alone
    "reads": [_words(3), _words(7, 3), _words(1, 10), _words(2, 11), [StreamEnd()]],
    # text, reasoning and other chunks mixed in one read: the run before a tool call
    "mixed": [MIXED, [FinishChunk(reason="tool-calls"), StreamEnd()]],
    # ~13,000 deltas: past the citation share (64 KiB at the default limit) they are
    # gathered; the batch that crosses it is logged one by one
    "gathering": [_words(400, n) for n in range(0, 13_200, 400)] + [[StreamEnd()]],
}


def _log(shape: list[list[Any]], *, max_event_bytes: int | None = None) -> list[Any]:
    harness = (
        TurnHarness() if max_event_bytes is None else TurnHarness(max_event_bytes=max_event_bytes)
    )
    harness.insert("go")
    harness.start()
    harness.send()  # checkpoint passed
    assert isinstance(harness.send(), OpenStream)
    effect = harness.send("stream")
    for batch in shape:
        assert isinstance(effect, NextBatch), effect
        effect = harness.send(batch)
    # The turn's own effects after the stream (flushes, checkpoints, the unknown tool's
    # result), up to its end or its next request.
    while effect is not None and not isinstance(effect, OpenStream):
        effect = harness.send()
    events = harness.session.events()
    assert_invariants(events, allow_open_tail=effect is not None)  # (at a next request)
    # Not the times: the harness's clock counts its readings (one a batch, one an append).
    return [(e.type, e.seq, e.data) for e in events]


def _one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reply, "_log_direct", lambda *args: 0)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_batch_logs_what_one_append_a_delta_logs(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batched = _log(SHAPES[name])
    with monkeypatch.context() as patch:
        _one_by_one(patch)
        assert _log(SHAPES[name]) == batched
    chunks = [e for e in batched if e[0] == "assistant/chunk"]
    assert len(chunks) > 1


def test_the_fast_path_logs_the_deltas_of_a_read_in_one_extend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It is taken: one extend for the read's 50 deltas (not 50 appends).
    calls: list[int] = []
    original = reply._log_direct

    def spy(*args: Any) -> int:
        calls.append(original(*args))
        return calls[-1]

    monkeypatch.setattr(reply, "_log_direct", spy)
    _log(SHAPES["whole"])
    assert calls == [50]


def test_a_reply_that_grows_too_large_within_a_read_stops_where_one_by_one_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 4 KiB limit: a read of 5 long deltas crosses it (their citations stay few, under
    # the share logged one by one); the fast path must not log past the delta at which
    # the one-by-one loop stops the call.
    shape = [_words(2), [TextDelta(text=f"{i}" + "x" * 999) for i in range(5)]]
    batched = _log(shape, max_event_bytes=4096)
    with monkeypatch.context() as patch:
        _one_by_one(patch)
        assert _log(shape, max_event_bytes=4096) == batched
    ends = [e for e in batched if e[0] == "turn/end"]
    assert ends and "cannot be logged" in ends[0][2].reason.error.message
