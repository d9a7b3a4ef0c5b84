"""A :class:`~actors.model.Model` for OpenAI and every OpenAI-compatible endpoint.

OpenAI, DeepSeek, vLLM, Ollama, llama.cpp's server, OpenRouter, ...: anything that
serves ``POST {base_url}/chat/completions`` with server-sent events. The request body is
built here and sent through :mod:`.http` (``aiohttp``), not the ``openai`` SDK, whose
per-request machinery cost twenty times a chunk's CPU (see there); no hidden retry: a
retry is the runtime's policy (a new turn), not a second HTTP request.

Credentials: ``api_key=``, else the variable named by ``api_key_env=``, else
``$OPENAI_API_KEY`` for OpenAI's own endpoint (no ``base_url``) or ``$DEEPSEEK_API_KEY``
for a ``deepseek.com`` one. Any other ``base_url`` never receives ``$OPENAI_API_KEY``
implicitly (a third-party host must not see an OpenAI key); without a key it is sent the
placeholder ``EMPTY``, as local servers expect.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit

import msgspec

from actors import ModelRequest
from storage import StreamChunk

from .base import HttpProvider, Reply
from .bodies import JsonBody, plain_reply
from .failures import StreamReportedError
from .http import require_aiohttp
from .limits import ProviderLimiter
from .openai_wire import ChunkMapper, MaxTokensField, WireChunk, chat_params, decode_chunk
from .secrets import resolve_api_key
from .sse import EventChunks, event_bound

__all__ = ["NO_KEY_PLACEHOLDER", "OpenAICompatModel"]

NO_KEY_PLACEHOLDER: Final = "EMPTY"
OPENAI_URL: Final = "https://api.openai.com/v1"


def _host(base_url: str | None) -> str:
    return (urlsplit(base_url).hostname or "").lower() if base_url else "api.openai.com"


def _key_env_names(base_url: str | None) -> tuple[list[str], bool]:
    """The variables a key may come from for ``base_url``, and whether one is required."""
    host = _host(base_url)
    if host == "api.openai.com" or host.endswith(".openai.com"):
        return ["OPENAI_API_KEY"], True
    if host == "deepseek.com" or host.endswith(".deepseek.com"):
        return ["DEEPSEEK_API_KEY"], True
    return [], False


class OpenAICompatModel(HttpProvider):
    """Streams Chat Completions from an OpenAI-compatible endpoint.

    ``max_concurrency`` bounds this instance's requests in flight (the rest wait, FIFO);
    ``requests_per_minute`` paces them. ``timeout`` bounds connecting and every read, so
    a stalled stream fails as ``TIMEOUT``. ``send_reasoning`` echoes earlier reasoning
    back as ``reasoning_content`` (some DeepSeek modes want it, most servers reject it).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        provider: str = "openai",
        max_concurrency: int | None = None,
        requests_per_minute: float | None = None,
        timeout: float = 60.0,
        max_tokens_field: MaxTokensField | None = None,
        send_reasoning: bool = False,
        include_usage: bool = True,
        default_headers: dict[str, str] | None = None,
        limiter: ProviderLimiter | None = None,
    ) -> None:
        require_aiohttp("openai")
        env_names, required = _key_env_names(base_url)
        secret = resolve_api_key(
            provider,
            api_key=api_key,
            api_key_env=api_key_env,
            env_names=env_names,
            required=required,
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
        official = env_names == ["OPENAI_API_KEY"]
        self._max_tokens_field: MaxTokensField = max_tokens_field or (
            "max_completion_tokens" if official else "max_tokens"
        )
        self._send_reasoning = send_reasoning
        self._include_usage = include_usage

    def _headers(self) -> dict[str, str]:
        key = self._secret.reveal() if self._secret else NO_KEY_PLACEHOLDER
        return {"authorization": f"Bearer {key}", "accept": "text/event-stream"}

    def _default_base(self) -> str:
        return OPENAI_URL

    def _reply(self, request: ModelRequest) -> Reply:
        """The request, and how its answer is read (the streams of :class:`HttpProvider`
        are made of it): deltas as they arrive (the chunks of one network read at a
        time), then usage, then one ``FinishChunk``.

        Raises :class:`~actors.model.ModelError` for every failure. Cancelling the task
        iterating this closes the HTTP response (and so its connection) before the
        ``CancelledError`` leaves. :mod:`.http` sends the request; the event stream is
        decoded by :mod:`.sse` and ``msgspec`` (see there why).
        A server that ignores ``stream: true`` and answers one JSON ``chat.completion``
        is read as a stream of that one reply; a 200 whose body is a JSON error fails as
        that error (see :mod:`.bodies`).
        """
        mapper = ChunkMapper()
        return Reply(
            "/chat/completions",
            lambda: _ENCODER.encode(
                chat_params(
                    request,
                    max_tokens_field=self._max_tokens_field,
                    send_reasoning=self._send_reasoning,
                    include_usage=self._include_usage,
                )
            ),
            lambda: _Events(event_bound(request.max_reply_bytes), mapper),
            lambda body: _plain(body, mapper),
            mapper,
            lambda: (
                None
                if mapper.finish_reason is not None
                else "the stream ended before a finish reason"
            ),
            request.max_reply_bytes,
        )


class _Events(EventChunks[ChunkMapper]):
    """Events until ``[DONE]``, each mapped by the reply's :class:`ChunkMapper`."""

    __slots__ = ()

    def take(self, event: bytes | None, data: bytes, out: list[StreamChunk]) -> bool:
        if data == b"[DONE]":
            return True
        if data:
            chunk = decode_chunk(data)
            if chunk.error is not None:
                raise StreamReportedError(chunk.error)
            out += self.mapper.feed(chunk)
        return False


_ENCODER: Final = msgspec.json.Encoder()


def _plain(body: JsonBody, mapper: ChunkMapper) -> list[StreamChunk]:
    """A non-streamed ``chat.completion``, mapped as one chunk of a stream."""
    reply = plain_reply(body, lambda value: isinstance(value.get("choices"), list))
    return mapper.feed(msgspec.convert(reply, WireChunk))
