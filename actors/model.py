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
instead of a round trip through the I/O side. A model that reads its reply in pieces
(the HTTP providers) may also implement :class:`BatchStreamingModel`, handing over each
piece's chunks at once, or :class:`PushStreamingModel`, pushing them to a callback as they
are read.

What a model hands over is checked before anything of it is logged (msgspec does not
check field types when a struct is built, and a record the log cannot read back would
make the whole session unreadable): :func:`checked_chunk` fails the request with an
``UNKNOWN`` failure naming a malformed chunk, after the chunks before it (unless the
model sets ``chunks_checked = True``: its chunks are well formed by construction, as
``ScriptedModel``'s are, which checks its script instead);
:func:`checked_failure` turns a malformed :class:`LlmFailure` (an unknown code, a
message that is not a str) into an ``UNKNOWN`` one that says what was wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from operator import attrgetter
from typing import Any, Final, NamedTuple, Protocol, get_args, runtime_checkable

import msgspec

from storage import (
    FinishChunk,
    FinishReason,
    LlmFailure,
    Message,
    ReasoningDelta,
    RequestConfig,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UsageChunk,
)

from .errors import ModelError
from .protocols import implements

__all__ = [
    "BatchStreamingModel",
    "ImmediateModel",
    "Model",
    "ModelRequest",
    "PushStreamingModel",
    "batches_pushed",
    "checked_chunk",
    "checked_failure",
    "chunks_of",
    "failure_problem",
    "push_reply",
]

_FINISH_REASONS: Final = frozenset(get_args(FinishReason))
_USAGE: Final = attrgetter(
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"
)
_PREVIEW_CHARS: Final = 200


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a model call needs.

    Invariant: ``messages`` is exactly ``session.derive_messages()`` at dispatch
    ("model-visible means logged").
    """

    config: RequestConfig
    messages: Sequence[Message]
    system: str | None = None
    tools: Sequence[ToolSpec] = ()
    # The log's event limit (None: the default): a reply whose assistant message would
    # be larger cannot be logged, so a model may stop reading one (the providers refuse
    # a server-sent event of over four times this; the turn counts the reply itself).
    max_reply_bytes: int | None = None


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


@runtime_checkable
class BatchStreamingModel(Model, Protocol):
    """A model that can hand over its reply in batches: the chunks that one read of the
    network completed, so the I/O side pays its per-item costs (a generator step, a
    lock, a notification) once per read, not once per chunk. The agent prefers
    :meth:`stream_batches` when a model has it; the batches, joined, are what
    :meth:`stream` yields (an empty batch is allowed and means nothing)."""

    def stream_batches(self, request: ModelRequest) -> AsyncIterator[Sequence[StreamChunk]]:
        """Stream the reply as batches of chunks, in order, as :meth:`stream` would."""
        ...


@runtime_checkable
class PushStreamingModel(Model, Protocol):
    """A model that hands its reply to a callback as it arrives: ``push`` is called with
    the chunks each network read completed, from the I/O loop's read callback, with no
    task woken a read (at realistic rates a read is one chunk, and the wake was most of
    what it cost). The agent prefers :meth:`stream_into` when a model has it; the
    batches pushed, joined, are what :meth:`stream` yields (an empty batch is allowed)."""

    async def stream_into(
        self, request: ModelRequest, push: Callable[[list[StreamChunk]], None]
    ) -> None:
        """Push the reply's chunks in order, as :meth:`stream` would yield them; return
        when the reply ended; raise :class:`ModelError` for a failure. Cancelling the task
        awaiting it ends the request."""
        ...


class _Ended(NamedTuple):
    """The end of a pushed reply read as batches: None, or its failure."""

    error: BaseException | None


async def batches_pushed(
    stream_into: Callable[[ModelRequest, Callable[[list[StreamChunk]], None]], Awaitable[None]],
    request: ModelRequest,
) -> AsyncIterator[list[StreamChunk]]:
    """A :class:`PushStreamingModel`'s ``stream_into`` read as
    :meth:`BatchStreamingModel.stream_batches` (each push one batch), through a queue: a
    model that pushes need not write its reply twice. Leaving the iteration early (a
    cancel, a ``break``) cancels the request and waits until it ended."""
    queue: asyncio.Queue[list[StreamChunk] | _Ended] = asyncio.Queue()

    async def run() -> None:
        try:
            await stream_into(request, queue.put_nowait)
        except BaseException as err:
            queue.put_nowait(_Ended(err))
            if not isinstance(err, Exception):
                raise
        else:
            queue.put_nowait(_Ended(None))

    task = asyncio.ensure_future(run())
    try:
        while True:
            item = await queue.get()
            if isinstance(item, _Ended):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def chunks_of(batches: AsyncIterator[Sequence[StreamChunk]]) -> AsyncIterator[StreamChunk]:
    """:meth:`Model.stream` made of ``batches`` (an async generator of batches, closed
    when this one is, so a cancel reaches it before the ``CancelledError`` leaves)."""
    try:
        async for batch in batches:
            for chunk in batch:
                yield chunk
    finally:
        await batches.aclose()  # type: ignore[attr-defined]


async def push_reply(
    model: Model, request: ModelRequest, push: Callable[[list[StreamChunk]], None]
) -> None:
    """Hand ``model``'s reply for ``request`` to ``push``, a list of chunks at a time, by
    the cheapest protocol it has: :meth:`PushStreamingModel.stream_into` as is, each
    batch of :meth:`BatchStreamingModel.stream_batches` (an empty one skipped), or each
    chunk of :meth:`Model.stream`. The iterator is closed before this returns or raises
    (a cancel closes the model's stream). What ``push`` raises ends the reply, raised."""
    if implements(model, PushStreamingModel):
        await model.stream_into(request, push)  # type: ignore[attr-defined]
        return
    batches = implements(model, BatchStreamingModel)
    chunks: Any = model.stream_batches(request) if batches else model.stream(request)  # type: ignore[attr-defined]
    try:
        if batches:
            async for batch in chunks:
                if batch:
                    push(list(batch))
        else:
            async for chunk in chunks:
                push([chunk])
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


_KEPT_AS_IS: Final = (bytes, bytearray, memoryview)


def checked_chunk(chunk: object) -> StreamChunk:
    """``chunk`` if it is a well-formed stream chunk (one the log can hold and read
    back); else raises :class:`ModelError` with an ``UNKNOWN`` failure that names what
    is wrong. The common chunks are checked field by field (every chunk of every reply
    passes here); anything else is converted to a chunk type by msgspec or refused."""
    if type(chunk) is TextDelta:
        if type(chunk.text) is str:
            return chunk
    elif type(chunk) is FinishChunk:
        if type(chunk.reason) is str and chunk.reason in _FINISH_REASONS:
            return chunk
    elif type(chunk) is UsageChunk:
        usage = chunk.usage
        if type(usage) is Usage:
            a, b, c, d, e = _USAGE(usage)
            if (
                type(a) is int
                and type(b) is int
                and type(c) is int
                and type(d) is int
                and type(e) is int
            ):
                return chunk
    elif type(chunk) is ToolCallDelta:
        call_id, name = chunk.call_id, chunk.name
        if (
            type(chunk.index) is int
            and (call_id is None or type(call_id) is str)
            and (name is None or type(name) is str)
            and type(chunk.arguments_delta) is str
        ):
            return chunk
    elif type(chunk) is ReasoningDelta:
        signature = chunk.signature
        if type(chunk.text) is str and (signature is None or type(signature) is str):
            return chunk
    try:  # a subclass, a plain value, or a malformed chunk: msgspec says which
        # bytes kept as they are (not base64 text: b"x" is no text "eA=="): refused
        plain = msgspec.to_builtins(chunk, builtin_types=_KEPT_AS_IS)
        converted: StreamChunk = msgspec.convert(plain, StreamChunk)
    except (msgspec.ValidationError, TypeError) as err:
        failure = LlmFailure(
            message=f"the model produced a malformed stream chunk ({err}): {_preview(chunk)}",
            code="UNKNOWN",
        )
        raise ModelError(failure) from None
    return converted


def checked_failure(failure: object) -> LlmFailure:
    """``failure`` if it is a well-formed :class:`LlmFailure` (a known code, a str
    message, a finite ``retry_after_s`` >= 0, ...); else an ``UNKNOWN`` failure whose
    message says what was wrong and shows the original."""
    checked = _check_failure(failure)
    if isinstance(checked, LlmFailure):
        return checked
    return LlmFailure(
        message=f"the model reported a malformed failure ({checked}): {_preview(failure)}",
        code="UNKNOWN",
    )


def failure_problem(failure: object) -> str | None:
    """What makes ``failure`` unfit for the log (see :func:`checked_failure`), or None."""
    checked = _check_failure(failure)
    return None if isinstance(checked, LlmFailure) else checked


def _check_failure(failure: object) -> LlmFailure | str:
    """``failure`` as a well-formed :class:`LlmFailure` (equal to it; an int
    ``retry_after_s`` becomes a float), or what is wrong with it."""
    try:
        checked: LlmFailure = msgspec.convert(msgspec.to_builtins(failure), LlmFailure)
    except (msgspec.ValidationError, TypeError) as err:
        return str(err)
    retry = checked.retry_after_s
    if retry is None or (math.isfinite(retry) and retry >= 0):
        return checked
    return f"retry_after_s must be a finite number of seconds >= 0, got {retry!r}"


def _preview(value: object) -> str:
    text = repr(value)
    if len(text) > _PREVIEW_CHARS:
        return f"{text[:_PREVIEW_CHARS]}... ({len(text) - _PREVIEW_CHARS} more characters)"
    return text
