"""What every HTTP model provider shares: its name, key, limits and one pooled SDK client.

The SDK client (and its ``httpx2`` connection pools, see :mod:`.transport`) is created
lazily on the loop that first streams, the runtime's single I/O loop, and reused by every
request of that provider instance, so thousands of concurrent streams share its pools.
A provider used from another loop (a test's second ``asyncio.run``) gets a fresh client
there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import TracebackType
from typing import Generic, Self, TypeVar

from actors.model import ModelError

from .failures import to_model_error
from .limits import LimiterStatistics, ProviderLimiter
from .secrets import Secret

__all__ = ["HttpProvider"]

ClientT = TypeVar("ClientT")


class HttpProvider(Generic[ClientT]):
    """Base of the vendor models: identity, credentials, limits, the loop-bound client.

    Subclasses implement ``_make_client`` and ``_close_client`` and the ``stream`` of
    :class:`actors.model.Model`.
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
        client: ClientT | None,
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
        # Invariant: ``_client`` was made on ``_client_loop`` (None: given by the caller,
        # usable on any loop, and never closed by us).
        self._client: ClientT | None = client
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._owns_client = client is None

    # ------------------------------------------------------------------ Model protocol

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

    def _make_client(self) -> ClientT:
        raise NotImplementedError

    def _close_client(self, client: ClientT) -> Awaitable[None]:
        raise NotImplementedError

    def _sdk_client(self) -> ClientT:
        """The client for the running loop, made on first use."""
        if not self._owns_client:
            assert self._client is not None
            return self._client
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = self._make_client()
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the pooled connections (on the loop that made them). Idempotent."""
        client, self._client = self._client, None
        if client is None or not self._owns_client:
            self._client = client
            return
        loop, self._client_loop = self._client_loop, None
        if loop is asyncio.get_running_loop():
            await self._close_client(client)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ failures

    @property
    def _secrets(self) -> tuple[Secret, ...]:
        return (self._secret,) if self._secret is not None else ()

    def _error(self, err: BaseException, request_id: str | None = None) -> ModelError:
        return to_model_error(
            err, vendor=self._provider, secrets=self._secrets, request_id=request_id
        )
