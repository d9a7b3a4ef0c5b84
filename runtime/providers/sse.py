"""Server-sent events, decoded incrementally from the bytes of a streaming response.

The providers read a vendor stream's raw bytes and decode them here (then ``msgspec``
decodes each event's JSON into small structs), instead of through the SDKs' per-event
pydantic models: at thousands of concurrent streams that is most of a provider's CPU.

Follows the WHATWG event-stream rules that vendors use: ``\\n`` or ``\\r\\n`` line ends,
``data:`` lines joined with ``\\n``, ``event:`` names, ``:`` comments (keep-alives)
ignored, a blank line dispatches. An event still open at the end of the stream is
dispatched too (some servers omit the final blank line).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Final, NamedTuple

__all__ = ["DRAIN_TIMEOUT_S", "SseDecoder", "SseEvent", "drain"]

DRAIN_TIMEOUT_S: Final = 0.1


class SseEvent(NamedTuple):
    event: str | None
    data: bytes


class SseDecoder:
    """Feed it byte chunks as they arrive; it returns the events they complete."""

    __slots__ = ("_buffer", "_data", "_event")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        if b"\n" not in chunk:
            self._buffer += chunk
            return []
        if self._buffer:
            self._buffer += chunk
            chunk = bytes(self._buffer)
            self._buffer.clear()
        lines = chunk.split(b"\n")
        self._buffer += lines.pop()
        out: list[SseEvent] = []
        for line in lines:
            self._line(line[:-1] if line.endswith(b"\r") else line, out)
        return out

    def finish(self) -> list[SseEvent]:
        """The events left when the stream ended."""
        out: list[SseEvent] = []
        if self._buffer:
            line = bytes(self._buffer)
            self._buffer.clear()
            self._line(line.rstrip(b"\r"), out)
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[SseEvent]) -> None:
        if not line:
            if self._data or self._event is not None:
                out.append(SseEvent(self._event, b"\n".join(self._data)))
                self._data = []
                self._event = None
            return
        if line[:1] == b":":
            return
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")


async def drain(body: AsyncIterator[bytes], timeout: float = DRAIN_TIMEOUT_S) -> None:
    """Read what is left of a finished stream (briefly), so HTTP/1.1 can reuse the
    connection; a failure here never turns a completed reply into an error."""
    with contextlib.suppress(Exception):  # timeouts and transport errors alike
        async with asyncio.timeout(timeout):
            async for _ in body:
                pass
