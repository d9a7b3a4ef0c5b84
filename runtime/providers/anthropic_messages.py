"""A :class:`~actors.model.Model` for Anthropic's Messages API (streaming).

The request body is built here and sent through :mod:`.http` (``aiohttp``), not the
``anthropic`` SDK (see there why); no hidden retry (a retry is the runtime's policy).
Credentials: ``api_key=``, else the variable named by ``api_key_env=``, else
``$ANTHROPIC_API_KEY``. ``reasoning_effort`` turns on extended thinking:
``thinking="adaptive"`` (default) sends ``thinking: {type: adaptive}`` with
``output_config.effort``; ``thinking="budget"`` sends a ``budget_tokens`` from
:data:`~.anthropic_wire.EFFORT_BUDGETS`, kept below ``max_tokens``.
"""

from __future__ import annotations

from typing import Final

import msgspec

from actors import ModelRequest
from storage import StreamChunk

from .anthropic_wire import (
    EventMapper,
    ThinkingMode,
    decode_event,
    message_params,
    plain_message_events,
)
from .base import HttpProvider, Reply
from .bodies import JsonBody, plain_reply
from .failures import StreamReportedError
from .http import require_aiohttp
from .limits import ProviderLimiter
from .secrets import resolve_api_key
from .sse import EventChunks, event_bound

__all__ = ["ANTHROPIC_URL", "ANTHROPIC_VERSION", "AnthropicModel"]

ANTHROPIC_URL: Final = "https://api.anthropic.com"
ANTHROPIC_VERSION: Final = "2023-06-01"


class AnthropicModel(HttpProvider):
    """Streams Messages from Anthropic (or a compatible ``base_url``).

    ``max_tokens`` is used when the request's config sets none (the API requires one).
    Limits and ``timeout`` behave as in :class:`~.openai_compat.OpenAICompatModel`.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str | None = None,
        base_url: str | None = None,
        provider: str = "anthropic",
        max_tokens: int = 4096,
        thinking: ThinkingMode = "adaptive",
        max_concurrency: int | None = None,
        requests_per_minute: float | None = None,
        timeout: float = 60.0,
        default_headers: dict[str, str] | None = None,
        limiter: ProviderLimiter | None = None,
    ) -> None:
        require_aiohttp("anthropic")
        secret = resolve_api_key(
            provider,
            api_key=api_key,
            api_key_env=api_key_env,
            env_names=["ANTHROPIC_API_KEY"],
            required=True,
        )
        super().__init__(
            provider=provider,
            model=model,
            secret=secret,
            base_url=base_url,
            timeout=timeout,
            max_concurrency=max_concurrency,
            requests_per_minute=requests_per_minute,
            limiter=limiter,
            default_headers=default_headers,
        )
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self._max_tokens = max_tokens
        self._thinking: ThinkingMode = thinking

    def _headers(self) -> dict[str, str]:
        assert self._secret is not None
        return {
            "x-api-key": self._secret.reveal(),
            "anthropic-version": ANTHROPIC_VERSION,
            "accept": "text/event-stream",
        }

    def _default_base(self) -> str:
        return ANTHROPIC_URL

    def _reply(self, request: ModelRequest) -> Reply:
        """The request, and how its answer is read (the streams of :class:`HttpProvider`
        are made of it): deltas as they arrive (the chunks of one network read at a
        time), then usage, then one ``FinishChunk``.

        Raises :class:`~actors.model.ModelError` for every failure, including an
        ``error`` event mid-stream (``overloaded_error`` → ``SERVER``) and a stream that
        ends before ``message_stop`` (``TRANSPORT``). Cancelling closes the response.
        :mod:`.http` sends the request; the event stream is decoded by :mod:`.sse` and
        ``msgspec``. A 200 whose body is one JSON ``message`` (a server
        ignoring ``stream: true``) is read as the stream of that message; one that is a
        JSON error fails as that error (see :mod:`.bodies`).
        """
        mapper = EventMapper()
        return Reply(
            "/v1/messages",
            lambda: _ENCODER.encode(
                message_params(
                    request, default_max_tokens=self._max_tokens, thinking=self._thinking
                )
            ),
            lambda: _Events(event_bound(request.max_reply_bytes), mapper),
            lambda body: _plain(body, mapper),
            mapper,
            lambda: None if mapper.stopped else "the stream ended before message_stop",
            request.max_reply_bytes,
        )


class _Events(EventChunks[EventMapper]):
    """Events until ``message_stop``, each mapped by the reply's :class:`EventMapper`."""

    __slots__ = ()

    def take(self, event: bytes | None, data: bytes, out: list[StreamChunk]) -> bool:
        if not data or event == b"ping":
            return False
        wire = decode_event(data)
        if event == b"error" or wire.type == "error":
            raise StreamReportedError(msgspec.json.decode(data))
        mapper = self.mapper
        out += mapper.feed(wire)
        return mapper.stopped


_ENCODER: Final = msgspec.json.Encoder()


def _plain(body: JsonBody, mapper: EventMapper) -> list[StreamChunk]:
    """A non-streamed ``message``, mapped as the events that would have streamed it."""
    reply = plain_reply(body, lambda value: value.get("type") == "message")
    return [out for event in plain_message_events(reply) for out in mapper.feed(event)]
