"""corral's own HTTP/1.1 client for a provider's POST-and-stream: the body pushed to the
reader from the socket's read callback, with no task woken per read.

Why not ``aiohttp`` for this: at realistic rates (an agent streaming 50 tokens/s) every
network read carries one chunk, so what a read costs is what a chunk costs. Through
``aiohttp`` a read went the protocol's ``data_received``, its C parser, a ``StreamReader``,
a future, a task step, the ``iter_any`` iterator and two generator layers before the
chunk reached the agent; here it is ``buffer_updated`` (``recv_into`` one reused buffer:
no 256 KiB allocation a read, see :func:`.http._small_reads`), a chunked-framing split and
one call of the reader's ``sink``. ``benchmarks/bench_streaming.py`` measures both.

What it does, and what it leaves to ``aiohttp`` (:class:`.http.WireClient`, chosen by
:func:`make_client`): ``http://`` and ``https://`` (the loop's TLS, the system's
certificates) straight to the server, keep-alive connections pooled per loop (LIFO, idle
ones dropped after :data:`.http.KEEPALIVE_EXPIRY_S` or when the server closes them), TCP
keep-alive probes, a connect timeout (at most 10 s) and a read timeout (no byte for
``timeout`` seconds, headers or body), ``Content-Length``, chunked and close-delimited
bodies, ``gzip``/``deflate`` content encodings, an error status raised as
:class:`.http.HttpStatusError` with its body (read up to :data:`.http.MAX_ERROR_BODY`). A
``307``/``308`` redirect to the same origin is followed (the body sent again), at most
five times; any other redirect is an error status (a key must not follow a redirect to
another host). A proxy from the environment: ``aiohttp``'s client instead. No hidden
retry.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Final
from urllib.parse import urljoin, urlsplit

from ..errors import ConnectTimeout
from .h1_connection import (
    Body,
    Connection,
    HttpProtocolError,
    Response,
    ServerDisconnectedError,
)
from .http import (
    CONNECT_CAP_S,
    READ_SIZE,
    HttpStatusError,
    WireClient,
    _env_proxy,
    read_error_body,
)

__all__ = ["Body", "H1Client", "HttpProtocolError", "ServerDisconnectedError", "make_client"]

MAX_REDIRECTS: Final = 5


def make_client(
    base_url: str, headers: Mapping[str, str], timeout: float
) -> H1Client | WireClient:
    """The client for ``base_url``: :class:`H1Client`, or ``aiohttp``'s
    :class:`.http.WireClient` where the environment names a proxy for it."""
    if _env_proxy(base_url) is not None:
        return WireClient(base_url, headers, timeout)
    return H1Client(base_url, headers, timeout)


class _Origin:
    """Where requests go: scheme, host, port and the base path, parsed once."""

    __slots__ = ("base_path", "host", "host_header", "port", "tls", "url")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        default = 443 if self.tls else 80
        name = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = name if self.port == default else f"{name}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self.url = f"{parts.scheme}://{self.host_header}"

    def same(self, other: _Origin) -> bool:
        return (self.tls, self.host, self.port) == (other.tls, other.host, other.port)


class H1Client:
    """POSTs JSON to ``base_url + path`` and streams the answer; one per event loop (the
    interface of :class:`.http.WireClient`, plus :meth:`Body.push_into`)."""

    def __init__(self, base_url: str, headers: Mapping[str, str], timeout: float) -> None:
        self._origin = _Origin(base_url)
        self._timeout = timeout
        self._connect_timeout = min(timeout, CONNECT_CAP_S)
        lines = [f"Host: {self._origin.host_header}"]
        fields = {"content-type": "application/json", **headers}
        fields.setdefault("user-agent", "corral")
        fields.setdefault("accept-encoding", "gzip, deflate")
        for name, value in fields.items():
            if any(c in f"{name}{value}" for c in "\r\n\0"):
                raise ValueError(f"header {name!r}: a name or value with a line break")
            lines.append(f"{name}: {value}")
        self._fields = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self._idle: dict[tuple[bool, str, int], list[Connection]] = {}
        self._open: set[Connection] = set()  # every connection not closed yet
        # One read buffer for all its connections (they are on one loop), not 64 KiB each.
        self._read_buffer = memoryview(bytearray(READ_SIZE))
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    @asynccontextmanager
    async def stream(self, path: str, body: bytes) -> AsyncIterator[Response]:
        """The response to ``POST path`` with ``body``; raises :class:`HttpStatusError`
        for an error status. Leaving the block before the body ended (a cancel, a
        failure) closes the connection; after it ended (or while it drains, briefly),
        the connection goes back to the pool."""
        origin = self._origin
        target = origin.base_path + path
        hops = 0
        while True:
            connection = await self._connection()
            mine = 0  # this request's generation on the connection, once it was answered
            try:
                try:
                    response = await connection.request(self._head(target, len(body)), body)
                except ServerDisconnectedError:
                    if not connection.stale():
                        raise
                    # A pooled connection the server closed as it was taken (its idle
                    # timeout): the request never reached it; once more on a new one.
                    connection = await self._connection(fresh=True)
                    response = await connection.request(self._head(target, len(body)), body)
                mine = connection.generation  # release/abandon only this request's
                status = response.status
                moved = _redirect(response, origin, target) if hops < MAX_REDIRECTS else None
                if moved is not None:
                    await response.body.drain()
                    connection.release(mine)
                    target, hops = moved, hops + 1
                    continue
                if status >= 300:  # an error, or a redirect not followed
                    detail = await read_error_body(response.body)
                    connection.release(mine)  # read to its end: reusable (a 429 storm)
                    raise HttpStatusError(status, response.headers, detail)  # noqa: TRY301 - closes the connection, below
                yield response
            except BaseException:
                # Never back to the pool half read (before an answer it is ours still).
                connection.abandon(mine or connection.generation)
                raise
            connection.release(mine)
            return

    def _head(self, target: str, length: int) -> bytes:
        start = f"POST {target} HTTP/1.1\r\n".encode()
        return b"".join((start, self._fields, str(length).encode(), b"\r\n\r\n"))

    async def _connection(self, *, fresh: bool = False) -> Connection:
        """An idle pooled connection (unless ``fresh``), or a new one."""
        if self._closed:
            raise RuntimeError("the HTTP client is closed")
        origin = self._origin
        key = (origin.tls, origin.host, origin.port)
        idle = None if fresh else self._idle.get(key)
        loop = asyncio.get_running_loop()
        if idle:
            now = loop.time()
            while idle:
                connection = idle.pop()
                if connection.usable(now):
                    return connection
                connection.close()
        context = None
        if origin.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        pool = self._idle.setdefault(key, [])
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, protocol = await loop.create_connection(
                    lambda: Connection(loop, self._timeout, pool, self._open, self._read_buffer),
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if context is not None else None,
                )
        except TimeoutError as err:
            raise ConnectTimeout(
                f"no connection to {origin.host}:{origin.port} in {self._connect_timeout} s"
            ) from err
        return protocol

    async def close(self) -> None:
        """Close every connection, pooled, draining or in use; the sockets are closed
        when this returns."""
        self._closed = True
        for idle in self._idle.values():
            idle.clear()
        lost = [connection.closed for connection in self._open]
        for connection in list(self._open):
            connection.close()
        if lost:
            await asyncio.wait(lost, timeout=1.0)


def _redirect(response: Response, origin: _Origin, target: str) -> str | None:
    """The target a ``307``/``308`` (a redirect that keeps the method and body) moves the
    request to, if it stays on ``origin`` (a key never follows to another host)."""
    location = response.headers.get("location")
    if response.status not in (307, 308) or not location:
        return None
    moved = urljoin(origin.url + target, location)
    try:
        if not _Origin(moved).same(origin):
            return None
    except ValueError:  # not http(s) at all
        return None
    parts = urlsplit(moved)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
