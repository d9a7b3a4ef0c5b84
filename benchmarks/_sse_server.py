"""A fast loopback SSE server for the streaming benchmarks, run in its own process.

``python benchmarks/_sse_server.py --port-file F [--chunks C] [--ttft S] [--tps R]``
binds ``127.0.0.1`` on an ephemeral port, writes the port to ``F`` and serves HTTP/1.1
with keep-alive until it is killed: ``POST /v1/chat/completions`` answers an OpenAI
Chat Completions stream, ``POST /v1/messages`` an Anthropic Messages stream, each of ``C``
text deltas, with chunked transfer encoding.

Two modes:

- **throughput** (no ``--tps``): every reply is rendered once at start-up and written in
  one call, so the server spends almost nothing per chunk and the client's cost is what
  is measured.
- **paced** (``--tps R``): a reply's first delta is written ``--ttft`` seconds after the
  request, then one every ``1/R`` seconds, by one ticker for all streams (every 2 ms,
  writing only the streams that are due: a heap by due time).
  Each delta's text is ``@<unix time of its write> `` (taken for each write, so a tick
  that ran late is the server's lag, not counted against the client) so the client can
  measure how late it saw the chunk against the moment the server wrote it.

The raw ``asyncio.Protocol`` (no HTTP library) keeps the server's own CPU per chunk small.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import time
from pathlib import Path

TICK_S = 0.002


def _chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _openai_event(delta: dict[str, object] | None, finish: str | None = None,
                  usage: dict[str, int] | None = None) -> bytes:
    chunk: dict[str, object] = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "bench",
        "choices": [] if delta is None else [
            {"index": 0, "delta": delta, "finish_reason": finish}
        ],
    }
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def _anthropic_event(event: dict[str, object]) -> bytes:
    body = json.dumps(event, separators=(",", ":")).encode()
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + body + b"\n\n"


def openai_parts(texts: list[str]) -> tuple[bytes, list[bytes], bytes]:
    """(head events, one event per text delta, tail events) of an OpenAI stream."""
    head = _openai_event({"role": "assistant", "content": ""})
    deltas = [_openai_event({"content": t}) for t in texts]
    usage = {"prompt_tokens": 11, "completion_tokens": len(texts), "total_tokens": 11 + len(texts)}
    tail = _openai_event({}, finish="stop") + _openai_event(None, usage=usage) + b"data: [DONE]\n\n"
    return head, deltas, tail


def anthropic_parts(texts: list[str]) -> tuple[bytes, list[bytes], bytes]:
    head = _anthropic_event({
        "type": "message_start",
        "message": {
            "id": "msg_bench", "type": "message", "role": "assistant", "model": "bench",
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 11, "output_tokens": 1},
        },
    }) + _anthropic_event({
        "type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""},
    })
    deltas = [
        _anthropic_event({
            "type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": t},
        })
        for t in texts
    ]
    tail = (
        _anthropic_event({"type": "content_block_stop", "index": 0})
        + _anthropic_event({
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": len(texts)},
        })
        + _anthropic_event({"type": "message_stop"})
    )
    return head, deltas, tail


HEADERS = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"transfer-encoding: chunked\r\nx-request-id: req-bench\r\n\r\n"
)


class _Stream:
    __slots__ = ("conn", "left", "next_at", "parts")

    def __init__(self, conn: _Conn, parts: tuple[bytes, list[bytes], bytes], start: float) -> None:
        self.conn = conn
        self.parts = parts
        self.left = len(parts[1])
        self.next_at = start


class _Conn(asyncio.Protocol):
    def __init__(self, server: _Server) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            path = head.split(" ", 2)[1]
            self.buf = self.buf[end + 4 + length :]
            self.server.answer(self, path)


class _Server:
    def __init__(self, chunks: int, ttft: float, tps: float | None) -> None:
        self.tps = tps
        self.ttft = ttft
        self.chunks = chunks
        texts = [f"w{n:03d} " for n in range(chunks)]
        self.rendered: dict[str, bytes] = {}
        for path, parts in (
            ("/v1/chat/completions", openai_parts(texts)),
            ("/v1/messages", anthropic_parts(texts)),
        ):
            head, deltas, tail = parts
            self.rendered[path] = (
                HEADERS + _chunked(head + b"".join(deltas) + tail) + b"0\r\n\r\n"
            )
        self.streams: list[_Stream] = []

    def answer(self, conn: _Conn, path: str) -> None:
        assert conn.transport is not None
        if path not in self.rendered:
            conn.transport.write(
                b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
            )
            return
        if self.tps is None:
            conn.transport.write(self.rendered[path])
            return
        # Paced: the head now, each delta on the ticker's schedule.
        placeholder = ["@0000000000.000000 "] * self.chunks
        parts = (openai_parts if path.startswith("/v1/chat") else anthropic_parts)(placeholder)
        conn.transport.write(HEADERS + _chunked(parts[0]))
        self.streams.append(_Stream(conn, parts, time.perf_counter() + self.ttft))

    async def tick(self) -> None:
        """Every TICK_S, write each stream's deltas that are due (a heap by due time,
        so a tick costs what is due, not what is open)."""
        assert self.tps is not None
        interval = 1.0 / self.tps
        due: list[tuple[float, int, _Stream]] = []
        order = 0
        while True:
            await asyncio.sleep(TICK_S)
            for s in self.streams:  # the streams answered since the last tick
                order += 1
                heapq.heappush(due, (s.next_at, order, s))
            self.streams = []
            now = time.perf_counter()
            while due and due[0][0] <= now:
                _, _, s = heapq.heappop(due)
                transport = s.conn.transport
                if transport is None:
                    continue
                out = []
                wall = b"@%.6f" % time.time()  # this write's own time: the server's lag
                while s.left and s.next_at <= now:  # (a tick that ran late) is not counted
                    template = s.parts[1][len(s.parts[1]) - s.left]
                    out.append(template.replace(b"@0000000000.000000", wall))
                    s.left -= 1
                    s.next_at += interval
                if not s.left:
                    out.append(s.parts[2])
                transport.write(_chunked(b"".join(out)))
                if s.left:
                    order += 1
                    heapq.heappush(due, (s.next_at, order, s))
                else:
                    transport.write(b"0\r\n\r\n")


async def _main(args: argparse.Namespace) -> None:
    server = _Server(args.chunks, args.ttft, args.tps)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: _Conn(server), "127.0.0.1", 0, backlog=4096)
    port = srv.sockets[0].getsockname()[1]
    tmp = Path(str(args.port_file) + ".tmp")
    tmp.write_text(str(port))
    os.replace(tmp, args.port_file)
    if args.tps is not None:
        await server.tick()
    else:
        await asyncio.Event().wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port-file", type=Path, required=True)
    p.add_argument("--chunks", type=int, default=50)
    p.add_argument("--ttft", type=float, default=0.0)
    p.add_argument("--tps", type=float, default=None)
    asyncio.run(_main(p.parse_args()))
