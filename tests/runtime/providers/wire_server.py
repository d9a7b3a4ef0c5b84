"""A loopback HTTP/1.1 server that replays scripted vendor streaming replies.

It runs its own asyncio loop on a background thread, binds ``127.0.0.1`` on an ephemeral
port, keeps connections alive, streams server-sent events with chunked transfer encoding
and serves any number of concurrent connections. Each request takes the next scripted
reply (or ``default``); every request is recorded with its path, headers and JSON body,
and with two events: ``finished`` (the reply was written completely) and ``disconnected``
(the client closed the connection before that). Tests wait on those events with
timeouts; nothing here sleeps.

Replies: :class:`Sse` (a 200 stream that ends, drops, or stalls until the client leaves),
:class:`JsonReply` (a status with a JSON body), :class:`RawReply` (a status with any
body and content type), :class:`Stall` (never answers) and
:class:`Hangup` (closes the connection without answering). Frame builders for each
vendor's format live in :mod:`tests.runtime.providers.wire_formats`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Hangup",
    "JsonReply",
    "RawReply",
    "Recorded",
    "Reply",
    "Sse",
    "Stall",
    "WireServer",
]


@dataclass(frozen=True)
class Sse:
    """A 200 event stream: ``frames`` in order, then ``then``.

    ``end`` finishes the chunked body; ``drop`` aborts the connection (no terminating
    chunk); ``stall`` sends nothing more until the client closes. ``gate`` names a gate
    the reply waits on after its first ``gate_after`` frames (0: before the headers),
    or until the client closes the connection.
    """

    frames: list[bytes]
    then: Literal["end", "drop", "stall"] = "end"
    headers: dict[str, str] = field(default_factory=dict)
    gate: str | None = None
    gate_after: int = 0
    coalesce: bool = False  # write all frames at once (benchmarks: less server CPU)


@dataclass(frozen=True)
class JsonReply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RawReply:
    """``body`` as it is, with ``content_type`` (none when empty) and a content length."""

    body: bytes
    content_type: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Stall:
    """Read the request, answer nothing, wait for the client to give up."""


@dataclass(frozen=True)
class Hangup:
    """Read the request and close the connection without a response."""


Reply = Sse | JsonReply | RawReply | Stall | Hangup
ReplySource = Reply | Callable[["Recorded"], Reply]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    529: "Overloaded",
}


@dataclass
class Recorded:
    """One request as the server saw it; ``peer`` is the client's address (its connection)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    peer: tuple[str, int] = ("", 0)
    finished: threading.Event = field(default_factory=threading.Event)
    disconnected: threading.Event = field(default_factory=threading.Event)


class WireServer:
    """Start with :meth:`start` (or as a context manager); always :meth:`close`."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._script: deque[ReplySource] = deque()
        self.default: ReplySource | None = None
        self.requests: list[Recorded] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.open_connections = 0  # client connections not closed yet
        self._gates: dict[str, asyncio.Event] = {}
        self.port = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> WireServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=4096)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="wire-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the wire server did not start within 10 s")
        return self

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def __enter__(self) -> WireServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ scripting

    def script(self, *replies: ReplySource) -> None:
        """Queue replies for the next requests, in order."""
        with self._lock:
            self._script.extend(replies)

    def open_gate(self, name: str) -> None:
        """Let every reply waiting on gate ``name`` (now or later) go on."""
        loop = self._loop
        assert loop is not None
        asyncio.run_coroutine_threadsafe(self._open_gate(name), loop).result(10)

    async def _open_gate(self, name: str) -> None:
        self._gate(name).set()

    def _gate(self, name: str) -> asyncio.Event:
        return self._gates.setdefault(name, asyncio.Event())

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> list[Recorded]:
        """Block until at least ``count`` requests arrived; return them."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.requests) >= count, timeout):
                raise TimeoutError(f"{len(self.requests)} of {count} requests within {timeout} s")
            return list(self.requests)

    def wait_for_open_connections(self, count: int, timeout: float = 10.0) -> bool:
        """Block until exactly ``count`` client connections are open; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self.open_connections == count, timeout)

    def _connection_opened(self, change: int) -> None:
        with self._lock:
            self.open_connections += change
            self._lock.notify_all()

    def _next_reply(self, rec: Recorded) -> Reply:
        with self._lock:
            self.requests.append(rec)
            self._lock.notify_all()
            source = self._script.popleft() if self._script else self.default
        if source is None:
            return JsonReply(500, {"error": {"message": "no scripted reply", "type": "test"}})
        return source(rec) if callable(source) else source

    # ------------------------------------------------------------------ HTTP

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self._connection_opened(1)
        try:
            while await self._serve_one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]
            writer.transport.abort()
            self._connection_opened(-1)

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False  # the client closed an idle keep-alive connection
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        body: Any = json.loads(raw) if raw else None
        peer = writer.get_extra_info("peername")
        rec = Recorded(method=method, path=target, headers=headers, body=body, peer=peer[:2])
        reply = self._next_reply(rec)
        return await self._respond(reply, rec, reader, writer)

    @staticmethod
    def _head(status: int, headers: dict[str, str], extra: Iterable[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        lines += [f"{k}: {v}" for k, v in extra]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _wait_for_client_close(self, reader: asyncio.StreamReader, rec: Recorded) -> bool:
        await reader.read(1)  # b"" at EOF; a well-behaved client sends nothing meanwhile
        rec.disconnected.set()
        return False

    async def _pass_gate(self, name: str, reader: asyncio.StreamReader, rec: Recorded) -> bool:
        """Wait for gate ``name``; ``False`` if the client closed the connection first."""
        opened = asyncio.ensure_future(self._gate(name).wait())
        closed = asyncio.ensure_future(self._wait_for_client_close(reader, rec))
        try:
            await asyncio.wait([opened, closed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (opened, closed):
                waiter.cancel()
            await asyncio.gather(opened, closed, return_exceptions=True)
        return not rec.disconnected.is_set()

    async def _respond(
        self,
        reply: Reply,
        rec: Recorded,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if isinstance(reply, Hangup):
            writer.transport.abort()
            return False
        if isinstance(reply, Stall):
            return await self._wait_for_client_close(reader, rec)
        if isinstance(reply, JsonReply | RawReply):
            if isinstance(reply, JsonReply):
                data, kind = json.dumps(reply.body).encode(), "application/json"
            else:
                data, kind = reply.body, reply.content_type
            extra = [("content-type", kind)] if kind else []
            extra.append(("content-length", str(len(data))))
            writer.write(self._head(reply.status, reply.headers, extra) + data)
            await writer.drain()
            rec.finished.set()
            return True
        extra = [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
        gate_at = reply.gate_after if reply.gate is not None else None
        try:
            if gate_at == 0 and not await self._pass_gate(reply.gate or "", reader, rec):
                return False
            writer.write(self._head(200, reply.headers, extra))
            if reply.coalesce and gate_at is None and reply.then == "end":
                body = b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in reply.frames)
                writer.write(body + b"0\r\n\r\n")
                await writer.drain()
                rec.finished.set()
                return True
            for n, frame in enumerate(reply.frames, start=1):
                writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                await writer.drain()
                if n == gate_at and not await self._pass_gate(reply.gate or "", reader, rec):
                    return False
            if reply.then == "drop":
                writer.transport.abort()
                return False
            if reply.then == "stall":
                return await self._wait_for_client_close(reader, rec)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            rec.disconnected.set()
            return False
        rec.finished.set()
        return True


def main() -> None:
    """Serve one OpenAI text reply forever (for benchmarks): prints the port, stops at EOF.

    ``python -m tests.runtime.providers.wire_server CHUNKS`` streams CHUNKS content
    deltas per request.
    """
    import sys

    from .wire_formats import openai_frames, openai_text_reply

    chunks = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    pieces = [f"w{n:03d} " for n in range(chunks)]
    server = WireServer()
    server.default = Sse(openai_frames(openai_text_reply(*pieces)), coalesce=True)
    with server:
        print(server.port, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
