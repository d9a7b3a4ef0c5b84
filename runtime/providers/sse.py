"""Server-sent events, decoded incrementally from the bytes of a streaming response.

The providers read a vendor stream's raw bytes and decode them here (then ``msgspec``
decodes each event's JSON into small structs), instead of through the SDKs' per-event
pydantic models: at thousands of concurrent streams that is most of a provider's CPU.

Follows the WHATWG event-stream rules that vendors use: ``\\n`` or ``\\r\\n`` line ends,
``data:`` lines joined with ``\\n``, ``event:`` names, ``:`` comments (keep-alives)
ignored, a blank line dispatches. An event still open at the end of the stream is
dispatched too (some servers omit the final blank line).

An event (or a line still waiting for its end) larger than the decoder's bound raises
:class:`SseEventTooLargeError`: a server that never ends a line must not fill memory.
:func:`event_bound` relates the bound to the log's event limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from itertools import chain, repeat
from typing import Final, Generic, NamedTuple, TypeVar

from storage import DEFAULT_MAX_EVENT_BYTES, StreamChunk

from ..errors import SseEventTooLargeError

__all__ = [
    "DRAIN_TIMEOUT_S",
    "EventChunks",
    "SseDecoder",
    "SseEvent",
    "SseEventTooLargeError",
    "drain",
    "event_bound",
]

DRAIN_TIMEOUT_S: Final = 0.1
M = TypeVar("M")  # a vendor's chunk mapper
_SLACK: Final = 64 * 1024  # an event's fields around the delta (ids, names, usage)


def event_bound(max_reply_bytes: int | None) -> int:
    """The largest server-sent event worth reading for a reply the log takes up to
    ``max_reply_bytes`` (None: the default event limit).

    One event carries one delta. A vendor may escape every character of it (``\\uXXXX``,
    twelve bytes for a four-byte UTF-8 character, which the log writes as is), so an
    event of more than three times the limit cannot carry a delta the log could take;
    four times leaves room for the fields around it."""
    return 4 * (max_reply_bytes or DEFAULT_MAX_EVENT_BYTES) + _SLACK


class SseEvent(NamedTuple):
    """One event: its ``event:`` name (raw bytes; None if it had none) and its ``data``
    (lines joined with ``\\n``). :meth:`SseDecoder.feed` returns plain ``(event, data)``
    tuples, which compare equal to these."""

    event: bytes | None
    data: bytes


# The two shapes vendors send, each event whole: a lone ``data:`` line (OpenAI) or an
# ``event:`` line then a ``data:`` line (Anthropic). A read made only of one of them is
# decoded by one regex call (see SseDecoder._tiled).
_DATA_EVENTS: Final = re.compile(rb"data: ([^\n]*)\n\n")
_NAMED_EVENTS: Final = re.compile(rb"event: ([^\n]*)\ndata: ([^\n]*)\n\n")
_DATA_FRAMING: Final = len(b"data: \n\n")
_NAMED_FRAMING: Final = len(b"event: \ndata: \n\n")


class SseDecoder:
    """Feed it byte chunks as they arrive; it returns the events they complete, as
    ``(event, data)`` tuples (see :class:`SseEvent`)."""

    __slots__ = ("_bound", "_buffer", "_data", "_event", "_size")

    def __init__(self, bound: int | None = None) -> None:
        """``bound``: the most bytes one event (or one unended line) may hold;
        ``event_bound(None)`` if not given."""
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self._event: bytes | None = None
        self._size = 0  # Invariant: the bytes of ``_data``
        self._bound = event_bound(None) if bound is None else bound

    def feed(self, chunk: bytes) -> list[tuple[bytes | None, bytes]]:
        if b"\n" not in chunk:  # before joining: a long line fed in pieces stays linear
            self._buffer += chunk
            if len(self._buffer) > self._bound:
                self._too_large(len(self._buffer))
            return []
        if self._buffer:
            self._buffer += chunk
            chunk = bytes(self._buffer)
            self._buffer.clear()
        out: list[tuple[bytes | None, bytes]] = []
        if not self._data and self._event is None and b"\r" not in chunk:
            # The complete events, each parsed in one piece (the usual read ends with one).
            end = chunk.rfind(b"\n\n") + 2
            if end > 1:
                whole, chunk = (chunk, b"") if end == len(chunk) else (chunk[:end], chunk[end:])
                tiled = self._tiled(whole)
                if tiled is not None:
                    out = tiled
                else:
                    for block in whole[:-2].split(b"\n\n"):
                        self._block(block, out)
                if not chunk:
                    return out
        lines = chunk.split(b"\n")
        self._buffer += lines.pop()
        if len(self._buffer) > self._bound:
            self._too_large(len(self._buffer))
        for line in lines:
            self._line(line[:-1] if line.endswith(b"\r") else line, out)
        return out

    def _tiled(self, whole: bytes) -> list[tuple[bytes | None, bytes]] | None:
        """The events of ``whole`` (complete events, no ``\\r``) if it is made only of
        events of one of the two usual shapes, else None (then it is parsed block by
        block). The matches tile ``whole`` exactly when their lengths add up to it: they
        never overlap, so nothing between them was skipped."""
        # (No event of a read within the bound can be past it: only a longer read is
        # checked event by event.)
        if whole[:6] == b"data: ":
            datas: list[bytes] = _DATA_EVENTS.findall(whole)
            if sum(map(len, datas)) + _DATA_FRAMING * len(datas) != len(whole):
                return None
            if len(whole) > self._bound and max(map(len, datas)) > self._bound:
                self._too_large(max(map(len, datas)))
            return list(zip(repeat(None), datas))
        if whole[:7] == b"event: ":
            pairs: list[tuple[bytes, bytes]] = _NAMED_EVENTS.findall(whole)
            if sum(map(len, chain.from_iterable(pairs))) + _NAMED_FRAMING * len(pairs) != len(
                whole
            ):
                return None
            if len(whole) > self._bound:
                largest = max(len(data) for _, data in pairs)
                if largest > self._bound:
                    self._too_large(largest)
            return pairs  # type: ignore[return-value]  # (bytes, bytes): a named event
        return None

    def _block(self, block: bytes, out: list[tuple[bytes | None, bytes]]) -> None:
        """One complete event (its lines without the blank one after them): either usual
        shape in one piece, any other line by line, as the rules say."""
        if block[:6] == b"data: " and b"\n" not in block:
            if len(block) - 6 > self._bound:
                self._too_large(len(block) - 6)
            out.append((None, block[6:]))
            return
        if block[:7] == b"event: ":
            newline = block.find(b"\n")
            if block[newline + 1 : newline + 7] == b"data: " and block.count(b"\n") == 1:
                if len(block) - newline - 7 > self._bound:
                    self._too_large(len(block) - newline - 7)
                out.append((block[7:newline], block[newline + 7 :]))
                return
        for line in block.split(b"\n"):
            self._line(line, out)
        self._line(b"", out)

    def _too_large(self, size: int) -> None:
        self._buffer.clear()
        self._data = []
        raise SseEventTooLargeError(size, self._bound)

    def finish(self) -> list[tuple[bytes | None, bytes]]:
        """The events left when the stream ended."""
        out: list[tuple[bytes | None, bytes]] = []
        if self._buffer:
            line = bytes(self._buffer)
            self._buffer.clear()
            self._line(line.rstrip(b"\r"), out)
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[tuple[bytes | None, bytes]]) -> None:
        if not line:
            if self._data or self._event is not None:
                out.append((self._event, b"\n".join(self._data)))
                self._data = []
                self._size = 0
                self._event = None
            return
        if line[:1] == b":":
            return
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._size += len(value)
            if self._size > self._bound:
                self._too_large(self._size)
        elif name == b"event":
            self._event = value


class EventChunks(Generic[M]):
    """A reply's event stream turned into chunks read by read: :meth:`feed` gives the
    chunks one network read completes (a plain call per read, not a generator layer: at
    one event a read, each layer was a few percent of a streamed chunk's CPU).

    A subclass says what each event is (:meth:`take`). ``done``: the reply's last event
    came (the rest of the body is only drained). ``failure``: a read's event failed (it
    did not decode, the vendor reported an error): :meth:`feed` returned the chunks of
    the events before it, which come first; the caller raises it then."""

    __slots__ = ("_sse", "done", "failure", "mapper")

    def __init__(self, bound: int, mapper: M) -> None:
        """``bound``: an event's largest size (see :func:`event_bound`); ``mapper``: the
        reply's vendor mapper, for :meth:`take`."""
        self._sse = SseDecoder(bound)
        self.mapper = mapper
        self.done = False
        self.failure: Exception | None = None

    def take(self, event: bytes | None, data: bytes, out: list[StreamChunk]) -> bool:
        """Add the chunks of the event named ``event`` (None: unnamed) with ``data`` to
        ``out``; True if it is the reply's last event."""
        raise NotImplementedError

    def feed(self, data: bytes) -> list[StreamChunk]:
        out: list[StreamChunk] = []
        take = self.take
        try:
            for event, payload in self._sse.feed(data):
                if take(event, payload, out):
                    self.done = True
                    break
        except Exception as err:  # noqa: BLE001 - raised by the caller, after ``out``
            self.failure = err
        return out

    def finish(self) -> list[StreamChunk]:
        """The chunks of an event the body's end left open (raises if it fails)."""
        out: list[StreamChunk] = []
        for event, payload in self._sse.finish():
            if self.take(event, payload, out):
                break
        return out


async def drain(body: AsyncIterator[bytes], timeout: float = DRAIN_TIMEOUT_S) -> None:
    """Read what is left of a finished stream (briefly), so HTTP/1.1 can reuse the
    connection; a failure here never turns a completed reply into an error."""
    with contextlib.suppress(Exception):  # timeouts and transport errors alike
        async with asyncio.timeout(timeout):
            async for _ in body:
                pass
