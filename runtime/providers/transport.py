"""One HTTP client for thousands of concurrent streams: connection pools side by side.

``httpcore2``'s connection pool rescans every connection each time a request starts or
ends, so one pool serving N concurrent streams costs O(N²): measured here, 1,000
concurrent streams spent two thirds of their CPU in that scan. :class:`ShardedTransport`
keeps several pools (shards) behind one ``httpx2`` transport and sends each request to
the least busy shard, opening another shard only when every shard already carries
``per_shard`` requests. Up to ``per_shard`` concurrent requests it behaves exactly like
one pool (a request reuses the idle keep-alive connection of the one before).

The SDK client stays one per provider instance; only its transport is sharded.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from typing import Final

import httpx2

__all__ = ["ShardedTransport", "http_client"]

PER_SHARD: Final = 64
MAX_SHARDS: Final = 64
KEEPALIVE_EXPIRY_S: Final = 20.0


def _keepalive_options() -> list[tuple[int, int, int]]:
    """TCP keep-alive probes, so a silently dead peer is noticed on long streams."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 60), ("TCP_KEEPCNT", 5)):
        const = getattr(socket, name, None)
        if const is not None:
            options.append((socket.IPPROTO_TCP, const, value))
    return options


class _Shard:
    __slots__ = ("in_flight", "transport")

    def __init__(self, transport: httpx2.AsyncBaseTransport) -> None:
        self.transport = transport
        self.in_flight = 0  # requests sent whose response is not closed yet


class _ReleasingStream(httpx2.AsyncByteStream):
    """A response body that gives its shard's place back when closed (once)."""

    def __init__(self, inner: httpx2.AsyncByteStream, shard: _Shard) -> None:
        self._inner = inner
        self._shard: _Shard | None = shard

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._inner:
            yield part

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            shard, self._shard = self._shard, None
            if shard is not None:
                shard.in_flight -= 1


class ShardedTransport(httpx2.AsyncBaseTransport):
    """Up to ``max_shards`` connection pools; a request goes to the least busy one."""

    def __init__(
        self,
        *,
        per_shard: int = PER_SHARD,
        max_shards: int = MAX_SHARDS,
        keepalive_expiry: float = KEEPALIVE_EXPIRY_S,
        factory: Callable[[], httpx2.AsyncBaseTransport] | None = None,
    ) -> None:
        if per_shard < 1 or max_shards < 1:
            raise ValueError("per_shard and max_shards must be at least 1")
        self.per_shard = per_shard
        self.max_shards = max_shards
        limits = httpx2.Limits(
            max_connections=None,  # the provider's limiter bounds requests in flight
            max_keepalive_connections=per_shard,
            keepalive_expiry=keepalive_expiry,
        )
        if factory is None:
            ssl_context = httpx2.create_ssl_context()  # loading CA certificates is slow: once
            options = _keepalive_options()

            def factory() -> httpx2.AsyncBaseTransport:
                return httpx2.AsyncHTTPTransport(
                    verify=ssl_context, limits=limits, socket_options=options
                )

        self._factory = factory
        self._shards: list[_Shard] = []

    @property
    def shards(self) -> int:
        return len(self._shards)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self._shards)

    def _pick(self) -> _Shard:
        best = min(self._shards, key=lambda s: s.in_flight, default=None)
        if best is None or (
            best.in_flight >= self.per_shard and len(self._shards) < self.max_shards
        ):
            best = _Shard(self._factory())
            self._shards.append(best)
        return best

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        shard = self._pick()
        shard.in_flight += 1
        try:
            response = await shard.transport.handle_async_request(request)
        except BaseException:
            shard.in_flight -= 1
            raise
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _ReleasingStream(response.stream, shard)
        return response

    async def aclose(self) -> None:
        shards, self._shards = self._shards, []
        for shard in shards:
            await shard.transport.aclose()


def http_client(timeout: float, *, per_shard: int = PER_SHARD) -> httpx2.AsyncClient:
    """The ``httpx2`` client a provider hands its SDK: sharded pools, ``timeout`` on
    connect (at most 10 s), every read, write and pool wait."""
    return httpx2.AsyncClient(
        transport=ShardedTransport(per_shard=per_shard),
        timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0)),
        follow_redirects=True,
    )
