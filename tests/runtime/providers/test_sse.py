"""The event-stream decoder: any split of the bytes gives the same events."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.providers.openai_wire import decode_chunk
from runtime.providers.sse import SseDecoder, SseEvent, SseEventTooLargeError, event_bound

STREAM = (
    b": keep-alive\r\n\r\n"
    b'event: message_start\r\ndata: {"a": 1}\r\n\r\n'
    b"data: line one\ndata: line two\n\n"
    b"data:no-space\n\n"
    b"event: ping\ndata: {}\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SseEvent(b"message_start", b'{"a": 1}'),
    SseEvent(None, b"line one\nline two"),
    SseEvent(None, b"no-space"),
    SseEvent(b"ping", b"{}"),
    SseEvent(None, b"[DONE]"),
]


def decode(pieces: list[bytes]) -> list[SseEvent]:
    decoder = SseDecoder()
    events = [e for piece in pieces for e in decoder.feed(piece)]
    return events + decoder.finish()


def test_events_comments_multiline_data_and_crlf_decode() -> None:
    assert decode([STREAM]) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_of_the_bytes_gives_the_same_events(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    pieces = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    assert decode(pieces) == EXPECTED


def test_an_event_left_open_at_the_end_of_the_stream_is_still_dispatched() -> None:
    assert decode([b"data: last"]) == [SseEvent(None, b"last")]


def test_chunk_decoding_ignores_unknown_fields_and_tolerates_nulls() -> None:
    chunk = decode_chunk(
        b'{"id": "x", "choices": [{"index": null, "delta": {"content": "hi", "audio": {}},'
        b' "logprobs": null, "finish_reason": null}], "usage": null, "system_fingerprint": "f"}'
    )
    assert chunk.choices is not None
    assert chunk.choices[0].delta is not None
    assert chunk.choices[0].delta.content == "hi"


def test_an_event_or_an_unended_line_past_the_bound_is_refused_and_one_at_it_is_not() -> None:
    assert SseDecoder(8).feed(b"data: 12345678\n\n") == [SseEvent(None, b"12345678")]
    with pytest.raises(SseEventTooLargeError, match="more than 8 bytes"):
        SseDecoder(8).feed(b"data: 123")  # a line with no end yet
    decoder = SseDecoder(8)
    assert decoder.feed(b"data: 12\n" * 4) == []  # 8 bytes of data: at the bound
    with pytest.raises(
        SseEventTooLargeError, match="more than 8 bytes"
    ):  # no line is too long, the event is
        decoder.feed(b"data: 12\n")
    assert SseDecoder().feed(b"data: x\n\n") == [SseEvent(None, b"x")]
    assert event_bound(None) == event_bound(4 << 20) > 4 * (4 << 20)


def reference(stream: bytes) -> list[SseEvent]:
    """The event-stream rules read line by line, the plain way."""
    events: list[SseEvent] = []
    data: list[bytes] = []
    name: bytes | None = None
    for raw in stream.replace(b"\r\n", b"\n").split(b"\n"):
        if not raw:
            if data or name is not None:
                events.append(SseEvent(name, b"\n".join(data)))
            data, name = [], None
            continue
        if raw.startswith(b":"):
            continue
        field, _, value = raw.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"data":
            data.append(value)
        elif field == b"event":
            name = value
    if data or name is not None:
        events.append(SseEvent(name, b"\n".join(data)))
    return events


LINES = st.sampled_from(
    [
        b'data: {"a": 1}',
        b"data: x",
        b"data:tight",
        b"data: ",
        b"event: ping",
        b"event: m",
        b": keep-alive",
        b"",
        b"id: 7",
        b"retry: 10",
        b"data: [DONE]",
    ]
)


@given(
    st.lists(LINES, max_size=30),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    st.booleans(),
)
def test_the_decoder_agrees_with_the_plain_rules_for_any_lines_and_any_split(
    lines: list[bytes], cuts: list[int], crlf: bool
) -> None:
    stream = (b"\r\n" if crlf else b"\n").join(lines)
    points = [0, *sorted(c for c in cuts if c <= len(stream)), len(stream)]
    pieces = [stream[a:b] for a, b in itertools.pairwise(points)]
    assert decode(pieces) == reference(stream)


def test_a_whole_event_past_the_bound_is_refused_in_either_shape() -> None:
    with pytest.raises(SseEventTooLargeError, match="more than 8 bytes"):
        SseDecoder(8).feed(b"data: 123456789\n\n")
    with pytest.raises(SseEventTooLargeError, match="more than 8 bytes"):
        SseDecoder(8).feed(b"event: delta\ndata: 123456789\n\n")
    assert SseDecoder(8).feed(b"event: delta\ndata: 12345678\n\n") == [
        SseEvent(b"delta", b"12345678")
    ]


def test_a_read_of_the_usual_shapes_with_another_between_decodes_as_the_rules_say() -> None:
    # One read made only of the usual shapes is decoded in one piece; one with anything
    # else between them (here a comment, an id, a data line with no space) is not, and
    # both give what the rules give.
    usual = b'event: m\ndata: {"a": 1}\n\nevent: n\ndata: 2\n\n'
    mixed = b"event: m\ndata: 1\n\n: keep-alive\n\nid: 7\ndata:2\n\nevent: n\ndata: 3\n\n"
    for stream in (usual, mixed, b"data: a\n\ndata: b\n\n", b"data: a\n\nevent: e\ndata: b\n\n"):
        assert SseDecoder().feed(stream) == reference(stream)
