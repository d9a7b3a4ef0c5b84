"""One connection of corral's HTTP/1.1 client (:mod:`.h1`): the response parsed as it
is read (status line and headers; ``Content-Length``, chunked and close-delimited bodies;
``gzip``/``deflate``), its body pulled or pushed (:class:`Body`), the read timeout, and the
connection's life in the pool (a late release never touches its next request)."""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from ..errors import ReadTimeout
from .http import KEEPALIVE_EXPIRY_S, set_keepalive
from .sse import DRAIN_TIMEOUT_S

__all__ = [
    "Body",
    "Connection",
    "Headers",
    "HttpProtocolError",
    "Response",
    "ServerDisconnectedError",
    "Sink",
]

MAX_HEAD: Final = 64 * 1024  # the status line and headers of one response
_SIZE, _DATA_END, _TRAILER = -1, -2, -3  # the chunked decoder's states between chunks


class HttpProtocolError(ConnectionError):
    """The server's answer is not HTTP/1.1 that can be read (a transport failure)."""


class ServerDisconnectedError(ConnectionError):
    """The server closed the connection before the response was complete."""


class Headers(dict[str, str]):
    """A response's headers, names lowercased; looked up in any case. Repeated headers
    are joined with ``", "``."""

    def get(self, key: str, default: Any = None) -> Any:
        return dict.get(self, key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return dict.__getitem__(self, key.lower())

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key.lower() if isinstance(key, str) else key)


class Response:
    """A response's status and headers, and its :class:`Body`."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Headers, body: Body) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def aiter_bytes(self) -> Body:
        return self.body



Sink = Callable[[bytes], bool]
"""A push reader: called with each piece of the body as it arrives; True to stop."""


class Body:
    """A response body: pieces pulled (``async for``) or pushed (:meth:`push_into`)."""

    __slots__ = (
        "_connection",
        "_done",
        "_ended",
        "_ending",
        "_error",
        "_pieces",
        "_sink",
        "_waiter",
    )

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._pieces: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Sink | None = None
        self._done: asyncio.Future[bool] | None = None  # push_into's: True, the body ended
        self._ended = False
        self._ending: asyncio.Future[None] | None = None  # drained()'s
        self._error: BaseException | None = None

    # the connection's side
    def put(self, piece: bytes) -> None:
        sink = self._sink
        if sink is not None:
            try:
                stop = sink(piece)
            except Exception as err:  # noqa: BLE001 - raised by push_into
                self._stop(err)
                return
            if stop:
                self._stop(False)
            return
        self._pieces.append(piece)
        self._wake()

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self._error = error
        ending = self._ending
        if ending is not None and not ending.done():
            ending.set_result(None)
        if self._sink is not None:
            self._stop(error if error is not None else True)
        else:
            self._wake()

    def _stop(self, outcome: bool | BaseException) -> None:
        """End :meth:`push_into`: the body ended (True), the sink stopped (False) or
        raised, or the transport failed."""
        self._sink = None
        done = self._done
        if done is not None and not done.done():
            if isinstance(outcome, BaseException):
                done.set_exception(outcome)
            else:
                done.set_result(outcome)
        if outcome is False and not self._ended:
            self._connection.drain_quietly()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # the reader's side
    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        while not self._pieces:
            if self._ended:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            self._connection.resume()
            await self._waiter
        piece = self._pieces.popleft()
        if not self._pieces:
            self._connection.resume()
        return piece

    async def push_into(self, sink: Sink) -> bool:
        """Call ``sink`` with every piece of the body from now on (those already read
        first), from the connection's read callback, until it returns True (then the rest
        of the body is drained quietly, for the connection's reuse) or the body ends.
        True if the body ended; raises what ``sink`` raised, or the transport's failure."""
        while self._pieces:
            try:
                if sink(self._pieces.popleft()):
                    self._pieces.clear()
                    self._connection.drain_quietly()
                    return False
            except BaseException:
                self._pieces.clear()
                raise
        if self._ended:
            if self._error is not None:
                raise self._error
            return True
        self._done = asyncio.get_running_loop().create_future()
        self._sink = sink
        self._connection.resume()
        try:
            return await self._done
        finally:
            self._sink = None
            self._done = None

    async def drain(self) -> None:
        async for _ in self:
            pass

    async def drained(self) -> None:
        """Wait until the rest of a body :meth:`push_into` stopped reading has been read
        (usually the next read: its final chunk) or given up (the connection is closed
        :data:`~.sse.DRAIN_TIMEOUT_S` after the stop), so that the connection is back in
        the pool for the next request of the same caller."""
        if not self._ended:
            self._ending = asyncio.get_running_loop().create_future()
            await self._ending


class Connection(asyncio.BufferedProtocol):
    """One keep-alive connection: a request at a time, its response parsed as it is read."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        pool: list[Connection],
        open_: set[Connection],
        buffer: memoryview,
    ) -> None:
        """``buffer``: where the transport reads into (its client's, shared by all its
        connections: a read is copied out of it before the loop reads any other socket)."""
        self._loop = loop
        self._timeout = timeout
        self._pool = pool
        self._open = open_
        self.closed: asyncio.Future[None] = loop.create_future()  # done: the socket closed
        self._buffer = buffer
        self._transport: asyncio.Transport | None = None
        self._lost = False
        self._head = bytearray()
        self._reading_head = False
        self._response: asyncio.Future[Response] | None = None
        self._body: Body | None = None
        self._mode = ""  # "length", "chunked", "close": how the body ends
        self._left = 0  # length: bytes still to come; chunked: of the chunk, or a state
        self._pending = b""  # chunked: the start of a size or trailer line
        self._decoder: Any = None  # a zlib decompressor for an encoded body
        self._reusable = False
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        self._idle_since = 0.0
        self._released = True  # no request of its own: idle, or in the pool
        self._served = 0  # requests answered before the current one
        self.generation = 0  # the current request's number on this connection
        self._answered = False  # a byte of the current request's answer came
        self._draining: asyncio.TimerHandle | None = None  # the reader left early

    # ------------------------------------------------------------------ asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._open.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            set_keepalive(sock)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        # Copied out first: the buffer may be shared (asyncio calls get_buffer, reads into
        # it and calls this in one step, for one socket at a time).
        data = bytes(self._buffer[:nbytes])
        self._last_read = self._loop.time()
        self._answered = True
        if self._reading_head:
            self._read_head(data)
        elif self._body is not None:
            self._read_body(data)
        else:  # bytes with no request: the connection cannot be trusted
            self.close()

    def eof_received(self) -> bool:
        self._ended_by_peer()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._open.discard(self)
        self._ended_by_peer(exc)
        self._cancel_timers()
        if not self.closed.done():
            self.closed.set_result(None)

    def _ended_by_peer(self, exc: Exception | None = None) -> None:
        self._reusable = False
        if self._reading_head:
            self._fail(ServerDisconnectedError("the server closed the connection before answering"))
        elif self._body is not None:
            if self._mode == "close":
                self._finish_body()
            else:
                self._fail(
                    ServerDisconnectedError("the server closed the connection mid-body")
                    if exc is None
                    else exc
                )

    # ------------------------------------------------------------------ requests

    def usable(self, now: float) -> bool:
        return not self._lost and now - self._idle_since < KEEPALIVE_EXPIRY_S

    def stale(self) -> bool:
        """The connection was reused and closed without a byte of the answer: the server
        closed it idle (no request is read from a connection it is closing)."""
        return self._served > 0 and not self._answered

    async def request(self, head: bytes, body: bytes) -> Response:
        """Send the request; the response once its headers came."""
        assert self._transport is not None
        self._response = self._loop.create_future()
        self.generation += 1
        self._released = False
        self._answered = False
        self._reading_head = True
        self._head.clear()
        self._body = None
        self._last_read = self._loop.time()
        self._arm()
        self._transport.write(head + body)
        try:
            return await self._response
        finally:
            self._response = None

    def _read_head(self, data: bytes) -> None:
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_HEAD:
                self._fail(HttpProtocolError(f"response headers over {MAX_HEAD} bytes"))
            return
        head, rest = bytes(self._head[:end]), bytes(self._head[end + 4 :])
        self._head.clear()
        try:
            status, headers, version = parse_head(head)
        except (ValueError, UnicodeDecodeError) as err:
            self._fail(HttpProtocolError(f"not an HTTP response: {err}"))
            return
        if 100 <= status < 200:  # 100 Continue and friends: the answer follows
            if rest:
                self._read_head(rest)
            return
        self._reading_head = False
        connection = headers.get("connection", "").lower()
        self._reusable = (version == "HTTP/1.1" and "close" not in connection) or (
            "keep-alive" in connection
        )
        encoding = headers.get("transfer-encoding", "").lower()
        if status in (204, 304):
            self._mode, self._left = "length", 0
        elif "chunked" in encoding:
            self._mode, self._left, self._pending = "chunked", _SIZE, b""
        elif "content-length" in headers:
            try:
                self._mode, self._left = "length", int(headers["content-length"])
            except ValueError:
                self._fail(HttpProtocolError("a Content-Length that is not a number"))
                return
        else:
            self._mode, self._reusable = "close", False
        coding = headers.get("content-encoding", "").lower()
        self._decoder = (
            zlib.decompressobj(31) if coding == "gzip"
            else zlib.decompressobj() if coding == "deflate"
            else None
        )
        body = self._body = Body(self)
        response = self._response
        if response is not None and not response.done():
            response.set_result(Response(status, headers, body))
        if self._mode == "length" and self._left == 0:
            self._finish_body()
        elif rest:
            self._read_body(rest)

    def _read_body(self, data: bytes) -> None:
        if self._mode == "chunked":
            self._read_chunked(data)
        elif self._mode == "length":
            if len(data) >= self._left:
                piece, self._left = data[: self._left], 0
                self._deliver(piece)
                self._finish_body()
            else:
                self._left -= len(data)
                self._deliver(data)
        else:
            self._deliver(data)

    def _read_chunked(self, data: bytes) -> None:
        if self._pending:
            data, self._pending = self._pending + data, b""
        pos, size = 0, len(data)
        out: list[bytes] = []
        while pos < size:
            left = self._left
            if left > 0:
                take = min(left, size - pos)
                out.append(data[pos : pos + take])
                pos += take
                self._left = left - take or _DATA_END
            elif left == _DATA_END:
                if size - pos < 2:
                    self._pending = data[pos:]
                    break
                if data[pos : pos + 2] != b"\r\n":
                    self._fail(HttpProtocolError("a chunk not followed by CRLF"))
                    return
                pos += 2
                self._left = _SIZE
            else:  # a size line, or a trailer line after the last chunk
                end = data.find(b"\r\n", pos)
                if end < 0:
                    self._pending = data[pos:]
                    if len(self._pending) > MAX_HEAD:
                        self._fail(HttpProtocolError("a chunk size line without an end"))
                    break
                line = data[pos:end]
                pos = end + 2
                if left == _TRAILER:
                    if not line:  # the body's end
                        if out:
                            self._deliver(b"".join(out))
                        self._finish_body()
                        return
                    continue
                try:
                    chunk = int(line.partition(b";")[0].strip(), 16)
                except ValueError:
                    self._fail(HttpProtocolError(f"a chunk size that is not one: {line[:40]!r}"))
                    return
                self._left = chunk if chunk > 0 else _TRAILER
        if out:
            self._deliver(out[0] if len(out) == 1 else b"".join(out))

    def _deliver(self, piece: bytes) -> None:
        if self._decoder is not None:
            try:
                piece = self._decoder.decompress(piece)
            except zlib.error as err:
                self._fail(HttpProtocolError(f"a body that does not decompress: {err}"))
                return
            if not piece:
                return
        body = self._body
        if body is None:
            return
        body.put(piece)
        if body._sink is None and len(body._pieces) > 64 and not self._paused:
            self._paused = True  # a pull reader behind: stop reading until it catches up
            if self._transport is not None:
                self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            if self._transport is not None and not self._lost:
                self._transport.resume_reading()

    def _finish_body(self) -> None:
        if self._decoder is not None:
            rest = self._decoder.flush()
            self._decoder = None
            if rest and self._body is not None:
                self._body.put(rest)
        body = self._body
        self._body = None
        draining = self._draining is not None
        self._cancel_timers()
        if body is not None:
            body.end()
        if draining:  # the reader left: back to the pool from here
            self.release()

    def _fail(self, error: BaseException) -> None:
        self._reusable = False
        response = self._response
        if response is not None and not response.done():
            response.set_exception(error)
        body = self._body
        self._body = None
        self._reading_head = False
        if body is not None:
            body.end(error)
        self.close()

    # ------------------------------------------------------------------ timeouts

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = self._loop.call_at(self._last_read + self._timeout, self._check)

    def _check(self) -> None:
        """The read timeout: one timer per request, moved on when bytes came meanwhile
        (not reset on every read)."""
        self._timer = None
        if not (self._reading_head or self._body is not None):
            return
        idle = self._loop.time() - self._last_read
        if idle >= self._timeout:
            self._fail(ReadTimeout(f"no data from the server for {self._timeout} s"))
        else:
            self._arm()

    def _cancel_timers(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None

    # ------------------------------------------------------------------ lifetime

    def drain_quietly(self) -> None:
        """The reader is done before the body ended: read the rest unseen for a moment
        (the final chunk usually follows at once), then back to the pool; else closed."""
        if self._body is None:
            return
        self._body._sink = _discard
        self._body._pieces.clear()
        self.resume()
        self._draining = self._loop.call_later(DRAIN_TIMEOUT_S, self.close)

    def release(self, generation: int | None = None) -> None:
        """Request ``generation`` (None: the current one) is over: the connection back to
        the pool if it can be reused. Once per request: the drain's end and the caller's
        block may both call it, and the caller's may come after the connection went back
        to the pool and on to another request, which it must leave alone."""
        if generation is not None and generation != self.generation:
            return
        if self._released or self._draining is not None:
            return  # done already, or still draining: it returns (or closes) when that ends
        self._released = True
        if self._body is not None or self._reading_head:
            self.close()
        elif self._reusable and not self._lost:
            self._idle_since = self._loop.time()
            self._served += 1
            self._pool.append(self)
        else:
            self.close()

    def abandon(self, generation: int) -> None:
        """The caller of request ``generation`` failed mid-request: closed, unless it
        already went back to the pool (its body ended while draining), where another
        request may be using it."""
        if generation == self.generation and not self._released:
            self._released = True
            self.close()

    def close(self) -> None:
        self._reusable = False
        self._cancel_timers()
        if self._transport is not None and not self._lost:
            self._transport.abort()
        self._lost = True


def _discard(_piece: bytes) -> bool:
    return False


def parse_head(head: bytes) -> tuple[int, Headers, str]:
    """The status, headers and version of a response head (without its blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"status line {lines[0][:80]!r}")
    status = int(rest[:3])
    headers = Headers()
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"header line {line[:80]!r}")
        name, value = name.strip().lower(), value.strip()
        dict.__setitem__(headers, name, f"{headers[name]}, {value}" if name in headers else value)
    return status, headers, version
