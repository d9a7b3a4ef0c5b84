"""What every HTTP model provider shares: its name, key, limits and one pooled client.

The HTTP client (:func:`.h1.make_client`: corral's own :class:`.h1.H1Client`, or
``aiohttp``'s :class:`.http.WireClient` behind a proxy; each with its connection pool) is
created lazily on the loop that first streams, the runtime's single I/O loop, and
reused by every request of that provider instance on that loop, so thousands of
concurrent streams share its pool. A client is bound to the loop that made it, so a
provider used from several loops (one instance shared by two runtimes, a test's second
``asyncio.run``) keeps one client per loop; :meth:`HttpProvider.aclose` closes the
running loop's, and a client whose loop was closed is dropped.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, NamedTuple, Protocol, Self

from actors import ModelError, ModelRequest
from actors.model import batches_pushed, chunks_of
from storage import FinishReason, StreamChunk, UsageChunk

from .bodies import JsonBody, open_body
from .failures import empty_response, finished_with_error, request_id_from, to_model_error
from .h1 import Body, H1Client, make_client
from .http import WireClient
from .limits import LimiterStatistics, ProviderLimiter
from .secrets import Secret
from .sse import EventChunks, drain

__all__ = ["HttpProvider"]


class StreamMapper(Protocol):
    """What the shared stream tail needs of a vendor's event mapper."""

    @property
    def saw_text(self) -> bool: ...

    @property
    def saw_tool_calls(self) -> bool: ...

    @property
    def vendor_finish(self) -> str | None: ...

    def final_reason(self) -> FinishReason: ...

    def finish(self) -> list[StreamChunk]: ...


class Reply(NamedTuple):
    """A vendor's request and how its answer is read (see :meth:`HttpProvider._exchange`)."""

    path: str
    body: Callable[[], bytes]
    events: Callable[[], EventChunks[Any]]
    plain: Callable[[JsonBody], list[StreamChunk]]
    mapper: StreamMapper
    unfinished: Callable[[], str | None]
    max_reply_bytes: int | None


class HttpProvider:
    """Base of the vendor models: identity, credentials, limits, the loop-bound client.

    Subclasses implement ``_headers`` (what authenticates a request), ``_default_base``
    and :meth:`_reply` (the request and how its answer is read: :meth:`stream_into`,
    :meth:`stream_batches` and :meth:`stream` are made of it).
    """

    def __init__(
        self,
        *,
        provider: str,
        model: str,
        secret: Secret | None,
        base_url: str | None,
        timeout: float,
        max_concurrency: int | None,
        requests_per_minute: float | None,
        limiter: ProviderLimiter | None,
        default_headers: dict[str, str] | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self._provider = provider
        self._model = model
        self._secret = secret
        self._base_url = base_url
        self._timeout = timeout
        self._limiter = limiter or ProviderLimiter(
            max_concurrency=max_concurrency, requests_per_minute=requests_per_minute
        )
        self._default_headers = dict(default_headers or {})
        # ``_clients`` maps each loop to the client made on it (the lock guards its
        # changes; a lookup needs none).
        self._clients: dict[asyncio.AbstractEventLoop, H1Client | WireClient] = {}
        self._clients_lock = threading.Lock()

    # ------------------------------------------------------------------ Model protocol

    chunks_checked = True
    """The chunks are well formed by construction (see :func:`actors.model.checked_chunk`):
    every field comes from a typed ``msgspec`` wire struct or a fixed table, so the agent
    need not check them one by one (the provider tests check each one they stream)."""

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def name(self) -> str:
        return self._model

    @property
    def base_url(self) -> str | None:
        return self._base_url

    def statistics(self) -> LimiterStatistics:
        """In-flight and waiting requests of this provider instance."""
        return self._limiter.statistics()

    def __repr__(self) -> str:
        key = "set" if self._secret is not None else "none"
        where = f", base_url={self._base_url!r}" if self._base_url else ""
        return (
            f"{type(self).__name__}(provider={self._provider!r}, model={self._model!r}"
            f"{where}, api_key=<{key}>)"
        )

    # ------------------------------------------------------------------ client lifetime

    def _headers(self) -> dict[str, str]:
        """The headers that authenticate a request (and say which API version)."""
        raise NotImplementedError

    def _default_base(self) -> str:
        raise NotImplementedError

    def _make_client(self) -> H1Client | WireClient:
        headers = {**self._headers(), **self._default_headers}
        return make_client(self._base_url or self._default_base(), headers, self._timeout)

    def _client(self) -> H1Client | WireClient:
        """The client for the running loop, made on first use there."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            with self._clients_lock:
                for old in [old for old in self._clients if old.is_closed()]:
                    # Its pools cannot be closed without their loop: dropped (the
                    # garbage collector closes their sockets).
                    del self._clients[old]
                client = self._clients[loop] = self._make_client()
        return client

    async def aclose(self) -> None:
        """Close the running loop's client and its pooled connections. Idempotent.

        A client made on another loop is that loop's: it may be streaming there (one
        provider shared by two runtimes), and only its own loop can close it. One whose
        loop is closed is dropped."""
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            client = self._clients.pop(loop, None)
            for old in [old for old in self._clients if old.is_closed()]:
                del self._clients[old]
        if client is not None:
            await client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _reply(self, request: ModelRequest) -> Reply:
        """What a vendor's request is and how its answer is read; subclasses implement it."""
        raise NotImplementedError

    async def stream_into(
        self, request: ModelRequest, push: Callable[[list[StreamChunk]], None]
    ) -> None:
        """The reply pushed as it arrives (see :class:`actors.model.PushStreamingModel`):
        ``push`` is called with the chunks of each network read (deltas, then usage, then
        one ``FinishChunk``), from the I/O loop's read callback where the connection allows
        it; returns when the reply ended. Raises :class:`~actors.model.ModelError` for
        every failure; cancelling the task awaiting it closes the connection."""
        await self._exchange(self._reply(request), push)

    def stream_batches(self, request: ModelRequest) -> AsyncIterator[list[StreamChunk]]:
        """The reply in batches, one a network read (see
        :class:`actors.model.BatchStreamingModel`): :meth:`stream_into` pushing into a
        queue, so both read the same frame. Leaving the iteration early (a cancel, a
        ``break``) cancels the request and waits until its connection is closed."""
        return batches_pushed(self.stream_into, request)

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Deltas as they arrive, then usage, then one ``FinishChunk``: the chunks of
        :meth:`stream_batches` one by one (see there). Cancelling the task iterating
        this closes the HTTP response (and so its connection) before the
        ``CancelledError`` leaves."""
        return chunks_of(self.stream_batches(request))

    # ------------------------------------------------------------------ failures

    @property
    def _secrets(self) -> tuple[Secret, ...]:
        return (self._secret,) if self._secret is not None else ()

    def _error(
        self, err: BaseException, request_id: str | None = None, *, responded: bool = False
    ) -> ModelError:
        return to_model_error(
            err,
            vendor=self._provider,
            secrets=self._secrets,
            request_id=request_id,
            timeout=self._timeout,
            responded=responded,
        )

    # ------------------------------------------------------------------ streaming

    async def _exchange(self, reply: Reply, push: Callable[[list[StreamChunk]], None]) -> None:
        """The request/stream/finish frame both vendors share: take a limiter slot, POST
        ``reply.body()`` (JSON, encoded here) to ``reply.path``, push the batches a
        ``reply.events()`` decoder maps from its bytes (one a read; or what
        ``reply.plain`` maps from a 200 whose body is JSON, see :mod:`.bodies`; read up to
        a bound derived from ``reply.max_reply_bytes``, the log's event limit), turn every
        failure into a :class:`ModelError` (keeping the request id), refuse a stream that
        ``reply.unfinished`` says ended early, that ended with a failed or unknown finish
        reason, or that produced nothing, then push the mapper's closing chunks (usage,
        finish)."""
        payload = reply.body()
        mapper = reply.mapper
        request_id: str | None = None
        responded = False  # the response's headers came: a timeout now is a stalled stream
        failure: ModelError | None = None
        count = self._count

        def emit(batch: list[StreamChunk]) -> None:
            if batch:
                count(batch)
                push(batch)

        async with self._limiter.slot():
            client = self._client()
            try:
                async with client.stream(reply.path, payload) as response:
                    request_id = request_id_from(response.headers)
                    responded = True
                    body = response.aiter_bytes()
                    answer = await open_body(
                        response.headers.get("content-type"), body, reply.max_reply_bytes
                    )
                    if isinstance(answer, JsonBody):
                        emit(reply.plain(answer))
                    else:
                        decoder = reply.events()
                        pushed = body if answer is body and isinstance(body, Body) else None
                        if pushed is not None:
                            # Pushed from the read callback: no task woken a read.
                            def sink(data: bytes) -> bool:
                                emit(decoder.feed(data))
                                return decoder.done or decoder.failure is not None

                            ended = await pushed.push_into(sink)
                        else:
                            ended = True
                            async for data in answer:
                                emit(decoder.feed(data))
                                if decoder.done or decoder.failure is not None:
                                    ended = False
                                    break
                        if decoder.failure is not None:
                            raise decoder.failure  # noqa: TRY301 - a ModelError like any other, below
                        if ended:
                            emit(decoder.finish())
                        elif pushed is not None:  # the rest, for the connection's reuse
                            await pushed.drained()
                        else:  # (pulled, a pushed body's drain would wait unbounded)
                            await drain(answer)
            except Exception as err:  # noqa: BLE001 - every failure becomes a ModelError
                failure = self._error(err, request_id, responded=responded)
        if failure is not None:
            quota = failure.failure
            if quota.code == "RATE_LIMIT" and quota.retry_after_s is not None:
                # One client of its quota: no request of this provider goes out until then.
                self._limiter.pause(quota.retry_after_s)
            # Raised here, not in the ``except``: the HTTP library's exception (which may
            # hold the request, and so the key) must not ride along as its ``__context__``.
            raise failure
        problem = reply.unfinished()
        if problem is not None:
            raise self._error(ConnectionError(problem), request_id)
        if mapper.final_reason() == "error":
            raise finished_with_error(
                self._provider, mapper.vendor_finish, request_id, self._secrets
            )
        if mapper.final_reason() != "max-tokens" and not (mapper.saw_text or mapper.saw_tool_calls):
            raise empty_response(self._provider, request_id, self._secrets)
        emit(mapper.finish())

    def _count(self, batch: list[StreamChunk]) -> None:
        """Count a reply's usage against the provider's tokens-per-minute budget."""
        for chunk in batch:
            if chunk.__class__ is UsageChunk:
                usage = chunk.usage
                self._limiter.spend(usage.input_tokens + usage.output_tokens)
