"""The providers' HTTP client behind a proxy (``aiohttp``), and what both clients share.

Measured on this 2-core machine (``benchmarks/bench_streaming.py``, 200 concurrent
streams x 5 requests x 50 chunks against a pre-rendered loopback server), a streamed
chunk cost its client 6.7 us of CPU through ``aiohttp`` + ``msgspec`` against 141 us
through the official ``openai`` SDK's stream loop; most of the SDK's cost is per request
(its typed-dict parameter transform, ``httpx2``'s pool bookkeeping and pure-Python
HTTP parsing), not per byte. So corral's providers build the request body themselves
(a dict encoded by ``msgspec``), send it through corral's own HTTP/1.1 client
(:mod:`.h1`, which pushes each read to the agent with no task woken), or through
``aiohttp`` here where the environment names a proxy, and decode the event stream with
:mod:`.sse`.

What the SDKs did that this keeps: keep-alive connections pooled per loop, TCP
keep-alive probes on long streams, ``timeout`` on connecting (at most 10 s) and on every
read, redirects followed, proxies from the environment (``HTTPS_PROXY``, ``NO_PROXY``;
read once, when the client is made), no hidden retry (a retry is the runtime's policy, a
new turn). An HTTP error status is raised as
:class:`HttpStatusError` with the status, the headers and the parsed error body (read up
to :data:`MAX_ERROR_BODY` bytes), which :mod:`.failures` classifies.
"""

from __future__ import annotations

import contextlib
import socket
import urllib.request
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec

from ..errors import ConnectTimeout, ProviderError, ReadTimeout

__all__ = [
    "MAX_ERROR_BODY",
    "ConnectTimeout",
    "HttpStatusError",
    "ReadTimeout",
    "WireClient",
    "WireResponse",
    "read_error_body",
    "require_aiohttp",
]

MAX_ERROR_BODY: Final = 64 * 1024
KEEPALIVE_EXPIRY_S: Final = 20.0
CONNECT_CAP_S: Final = 10.0
READ_SIZE: Final = 64 * 1024
"""The most one socket read takes (see :func:`_small_reads`)."""


def require_aiohttp(extra: str) -> None:
    """Fail at once, with the fix, where the HTTP client is not installed."""
    try:
        import aiohttp  # noqa: F401, PLC0415 - optional, checked when a provider is built
    except ImportError as err:
        raise ImportError(
            f"corral's HTTP providers need aiohttp: pip install 'corral[{extra}]'"
        ) from err


class HttpStatusError(ProviderError):
    """The server answered an HTTP error status (``status_code`` >= 400). (Here, not in
    ``runtime.errors`` with the other provider errors: it carries a :class:`WireResponse`.)

    ``body`` is the parsed JSON error body (or its text when it is not JSON), ``response``
    carries the headers (``retry-after``, the request id), as the SDKs' errors did.
    """

    def __init__(self, status_code: int, headers: Mapping[str, str], body: object) -> None:
        self.status_code = status_code
        self.response = WireResponse(headers, _empty())
        self.body = body
        shown = msgspec.json.encode(body).decode() if not isinstance(body, str) else body
        super().__init__(f"Error code: {status_code} - {shown[:1000]}")


async def _empty() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


class WireResponse:
    """A streaming response: its headers and its body's bytes as they arrive."""

    __slots__ = ("_body", "headers")

    def __init__(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> None:
        self.headers = headers
        self._body = body

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        return self._body


def _env_proxy(url: str) -> str | None:
    """The proxy the environment (``HTTPS_PROXY``, ``NO_PROXY``, ...) names for ``url``."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy is None or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def set_keepalive(sock: Any) -> None:
    """TCP keep-alive probes on ``sock`` (a socket, or asyncio's view of one), so a
    silently dead peer is noticed."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 60), ("TCP_KEEPCNT", 5)):
            const = getattr(socket, name, None)
            if const is not None:
                sock.setsockopt(socket.IPPROTO_TCP, const, value)


def _keepalive_socket(addr_info: Any) -> socket.socket:
    """A socket with TCP keep-alive probes (aiohttp's socket factory)."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    set_keepalive(sock)
    return sock


class WireClient:
    """POSTs JSON to ``base_url + path`` and streams the answer; one per event loop.

    Made on (and bound to) the loop that runs it, as ``aiohttp`` sessions are.
    """

    def __init__(self, base_url: str, headers: Mapping[str, str], timeout: float) -> None:
        import aiohttp  # noqa: PLC0415 - imported on the I/O loop, on first use

        self._aiohttp = aiohttp
        self._base = base_url.rstrip("/")
        self._headers = {"content-type": "application/json", **headers}
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=min(timeout, CONNECT_CAP_S), sock_read=timeout
        )
        connector = aiohttp.TCPConnector(
            limit=0,  # the provider's limiter bounds requests in flight
            keepalive_timeout=KEEPALIVE_EXPIRY_S,
            socket_factory=_keepalive_socket,
        )
        # Proxies from the environment, looked up once (aiohttp's ``trust_env`` reads the
        # environment and ``~/.netrc`` on every request: a quarter of a stream's CPU).
        self._proxy = _env_proxy(self._base)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True)

    @asynccontextmanager
    async def stream(self, path: str, body: bytes) -> AsyncIterator[WireResponse]:
        """The response to ``POST path`` with ``body``; raises :class:`HttpStatusError`
        for an error status. Leaving the block early (a cancel, a failure) closes the
        connection instead of returning a half-read one to the pool."""
        aiohttp = self._aiohttp
        try:
            response = await self._session.post(
                self._base + path,
                data=body,
                headers=self._headers,
                timeout=self._timeout,
                proxy=self._proxy,
            )
        except aiohttp.ConnectionTimeoutError as err:
            raise ConnectTimeout(str(err) or "connect timed out") from err
        except aiohttp.SocketTimeoutError as err:
            raise ReadTimeout(str(err) or "read timed out") from err
        _small_reads(response)
        try:
            if response.status >= 400:
                detail = await read_error_body(response.content.iter_any())
                raise HttpStatusError(response.status, response.headers, detail)  # noqa: TRY301 - closes the response, below
            # aiohttp's own iterator, not a generator around it (one layer less a read):
            # its read timeout is translated here, as it leaves the block.
            yield WireResponse(response.headers, response.content.iter_any())
        except aiohttp.SocketTimeoutError as err:
            response.close()
            raise ReadTimeout(str(err) or "read timed out") from err
        except BaseException:
            response.close()  # never back to the pool half read
            raise
        finally:
            response.release()

    async def close(self) -> None:
        await self._session.close()


def _small_reads(response: Any) -> None:
    """Read the connection's socket at most :data:`READ_SIZE` bytes at a time.

    asyncio's plain-TCP transport calls ``recv(256 KiB)`` for every read: a buffer that
    large is above glibc's mmap threshold, so each read of a streamed chunk (a few
    hundred bytes) cost an ``mmap``, an ``mremap`` to shrink it and an ``munmap`` when it
    was freed, and in a process with several threads each ``munmap`` is a TLB shootdown
    on the other cores. At 250 agents streaming 50 tokens/s that was 20 us of system CPU
    a chunk, half the I/O thread's. (A TLS transport reads into its own buffer, so it has
    no such attribute to lower.)"""
    connection = response.connection
    transport = connection.transport if connection is not None else None
    if transport is not None and getattr(transport, "max_size", 0) > READ_SIZE:
        transport.max_size = READ_SIZE


async def read_error_body(body: AsyncIterator[bytes]) -> object:
    """An error answer's body (read up to MAX_ERROR_BODY; a body cut short gives what
    came), parsed as JSON when it is JSON, else its text."""
    data = bytearray()
    with contextlib.suppress(Exception):  # a broken error body: what came is the detail
        async for part in body:
            data += part
            if len(data) >= MAX_ERROR_BODY:
                del data[MAX_ERROR_BODY:]
                break
    try:
        parsed: object = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return data.decode("utf-8", "replace")
    return parsed
