"""The model protocol the agent consumes; ``runtime/`` implements it (scripted, vendors).

A model turns one :class:`ModelRequest` into an asynchronous stream of
:data:`storage.events.StreamChunk` values. It runs on the runtime's I/O side (the asyncio
loop thread), never on a dispatcher thread. Failures are raised as :class:`ModelError`
carrying a normalized :class:`storage.events.LlmFailure`; any other exception is
normalized by the agent to ``UNKNOWN``. Cancelling the agent cancels the task iterating
the stream (``asyncio.CancelledError`` inside the generator): a vendor model must close
its HTTP stream when that happens.

A model that can answer without waiting for anything (a zero-latency scripted model)
may also implement :class:`ImmediateModel`; the agent then takes the chunks inline
instead of a round trip through the I/O side.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from storage.events import LlmFailure, Message, RequestConfig, StreamChunk, ToolSpec

__all__ = ["ImmediateModel", "Model", "ModelError", "ModelRequest"]


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a model call needs.

    Invariant: ``messages`` is exactly ``session.derive_messages()`` at dispatch
    ("model-visible means logged").
    """

    config: RequestConfig
    messages: Sequence[Message]
    system: str | None = None
    tools: Sequence[ToolSpec] = ()


class ModelError(Exception):
    """A model request failed; ``failure`` says how, in CONTRACT section 5's codes."""

    def __init__(self, failure: LlmFailure) -> None:
        super().__init__(f"{failure.code}: {failure.message}")
        self.failure = failure


@runtime_checkable
class Model(Protocol):
    """A source of model replies.

    ``provider`` and ``name`` feed the default ``agent/request`` config.
    """

    @property
    def provider(self) -> str: ...

    @property
    def name(self) -> str: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Stream the reply: deltas, then usage, then exactly one ``FinishChunk``."""
        ...


@runtime_checkable
class ImmediateModel(Model, Protocol):
    """A model that may answer inline. ``None`` means "not now, use :meth:`stream`"."""

    def answer_now(self, request: ModelRequest) -> Sequence[StreamChunk] | None:
        """Return the whole reply at once, or raise :class:`ModelError`."""
        ...
