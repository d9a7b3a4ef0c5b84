"""``ScriptedModel``: a deterministic model that ships in the library.

It drives tests and load benchmarks. Each model request consumes one scripted item: a
``str`` (the reply text), a list of :class:`ToolCall` (the model calls those tools), or
an :class:`~storage.events.LlmFailure` (the request fails with it). Once the script is
exhausted it echoes the last user text. With ``latency`` it waits on the I/O side's
event loop timers (never a sleeping thread); without it, it answers inline.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from decimal import Decimal
from typing import Any, TypeAlias

import msgspec

from actors import ModelError, ModelRequest, failure_problem
from storage import (
    FinishChunk,
    LlmFailure,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
    UserMessage,
    lossless_problem,
)

__all__ = ["Latency", "ScriptItem", "ScriptedModel", "ToolCall"]


class ToolCall(msgspec.Struct, frozen=True):
    """A tool call the scripted model makes: ``arguments`` are encoded as JSON, or given
    raw (``raw_arguments``) to script malformed JSON."""

    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)
    raw_arguments: str | None = None


ScriptItem: TypeAlias = str | Sequence[ToolCall] | LlmFailure
Latency: TypeAlias = float | Callable[[], float]

_encoder = msgspec.json.Encoder()


def last_user_text(messages: Sequence[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, UserMessage):
            return "".join(b.text for b in message.content if isinstance(b, TextBlock))
    return ""


def _split(text: str, parts: int) -> list[str]:
    if parts <= 1 or len(text) <= 1:
        return [text]
    size = -(-len(text) // parts)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _checked_item(item: object, where: str) -> ScriptItem:
    """``item`` if it is a script item a reply can be made of; else ``TypeError`` or
    ``ValueError`` naming ``where`` and what is wrong (a malformed item would otherwise
    fail deep inside the agent, or reach the log as a record it cannot read back)."""
    if type(item) is str:
        return item
    if type(item) is list and item:  # a list of calls (no ABC check: the usual reply)
        for index, call in enumerate(item):
            _check_call(call, f"{where}[{index}]")
        return item
    if isinstance(item, LlmFailure):
        problem = failure_problem(item)
        if problem is not None:
            raise ValueError(f"{where}: a malformed LlmFailure ({problem}): {item!r}")
        return item
    if not isinstance(item, Sequence) or isinstance(item, str | bytes | bytearray):
        raise TypeError(
            f"{where}: a script item is a str (a text reply), a list of ToolCall or an "
            f"LlmFailure; got {type(item).__name__}"
        )
    if not item:
        raise ValueError(f"{where}: an empty list of tool calls (a text reply is a str)")
    for index, call in enumerate(item):
        _check_call(call, f"{where}[{index}]")
    return item


def _check_call(call: object, where: str) -> None:
    if not isinstance(call, ToolCall):
        raise TypeError(f"{where}: expected a ToolCall, got {type(call).__name__}")
    if type(call.name) is not str or not call.name:
        raise ValueError(f"{where}: a tool call's name is a non-empty str, got {call.name!r}")
    if call.raw_arguments is not None:
        if type(call.raw_arguments) is not str:
            raise TypeError(
                f"{where}: raw_arguments is a str (JSON text) or None, got "
                f"{type(call.raw_arguments).__name__}"
            )
        return
    if type(call.arguments) is not dict:
        raise TypeError(
            f"{where}: arguments is a dict (a JSON object), got {type(call.arguments).__name__}"
        )
    if not call.arguments:  # {}: encodes, and is lossless (the usual call of a load)
        return
    try:
        _encoder.encode(call.arguments)
    except (TypeError, ValueError, OverflowError) as err:
        raise TypeError(f"{where}: arguments cannot be encoded as JSON: {err}") from None
    problem = lossless_problem(call.arguments, "$.arguments")
    if problem is not None:  # msgspec writes NaN as null: the model would send another value
        raise ValueError(f"{where}: arguments are not lossless JSON: {problem}")


def _check_latency(latency: object, what: str) -> float:
    """``latency`` as a float if it is a finite real number of seconds >= 0 (an int,
    a float, a ``Fraction``, a ``Decimal``); else ``TypeError`` (not a number: a str, a
    bool) or ``ValueError`` (negative, NaN, infinite)."""
    if isinstance(latency, bool) or not isinstance(latency, numbers.Real | Decimal):
        raise TypeError(
            f"{what} must be a number of seconds >= 0 (or, for latency, a function "
            f"returning one), got {latency!r}"
        )
    seconds = float(latency)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {latency!r}")
    return seconds


class ScriptedModel:
    """A model whose replies are scripted (or computed by a function of the request).

    Every item is checked (a list when the model is built, a function's result when it
    is called), so the chunks made of them are well formed: ``chunks_checked``."""

    chunks_checked = True

    def __init__(
        self,
        replies: Iterable[ScriptItem] | Callable[[ModelRequest], ScriptItem] = (),
        *,
        latency: Latency = 0.0,
        chunks: int = 1,
        name: str = "scripted",
    ) -> None:
        if isinstance(replies, str | bytes):
            raise TypeError("replies must be an iterable of items or a function, not one string")
        if type(chunks) is not int:
            raise TypeError(f"chunks must be an int (at least 1), got {chunks!r}")
        if chunks < 1:
            raise ValueError(f"chunks must be at least 1, got {chunks}")
        if not callable(latency):
            latency = _check_latency(latency, "latency")
        if type(name) is not str:
            raise TypeError(f"name must be a str (it is logged in every request), got {name!r}")
        self._fn: Callable[[ModelRequest], ScriptItem] | None = None
        self._script: Iterator[ScriptItem] | None = None
        if callable(replies):
            self._fn = replies
        else:
            self._script = iter(
                [_checked_item(item, f"replies[{i}]") for i, item in enumerate(replies)]
            )
        self._lock = threading.Lock()
        self._latency = latency
        self._chunks = chunks
        self._name = name
        self.requests = 0
        self._last_text: tuple[str, list[TextDelta]] | None = None

    @classmethod
    def echo(cls, *, latency: Latency = 0.0, chunks: int = 1) -> ScriptedModel:
        """Answer every request with the last user text."""
        return cls((), latency=latency, chunks=chunks)

    @classmethod
    def jittered(cls, mean: float, spread: float, *, seed: int | None = None) -> Latency:
        """A latency distribution: uniform in ``mean ± spread`` seconds."""
        rng = random.Random(seed)
        lock = threading.Lock()

        def draw() -> float:
            with lock:
                return max(0.0, rng.uniform(mean - spread, mean + spread))

        return draw

    @property
    def provider(self) -> str:
        return "scripted"

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"ScriptedModel(name={self._name!r}, chunks={self._chunks})"

    def _next(self, request: ModelRequest) -> ScriptItem:
        with self._lock:
            self.requests += 1
            if self._fn is not None:
                return _checked_item(self._fn(request), "the reply function's result")
            assert self._script is not None
            item = next(self._script, None)
        return last_user_text(request.messages) if item is None else item

    def _reply(self, item: ScriptItem, request: ModelRequest) -> list[StreamChunk]:
        if isinstance(item, LlmFailure):
            raise ModelError(item)
        out: list[StreamChunk] = []
        if isinstance(item, str):
            cached = self._last_text  # the same reply again (a load's usual script)
            if cached is None or cached[0] != item:
                deltas = [TextDelta(text=piece) for piece in _split(item, self._chunks)]
                cached = self._last_text = (item, deltas)
            out += cached[1]  # frozen chunks: shared between replies
            finish = "stop"
            produced = len(item)
        else:
            for index, call in enumerate(item):
                raw = call.raw_arguments
                if raw is not None:
                    args = raw
                elif call.arguments:
                    args = _encoder.encode(call.arguments).decode()
                else:
                    args = "{}"  # what the encoder writes for {}, without the call
                pieces = [args] if self._chunks == 1 else _split(args, self._chunks)
                out.append(
                    ToolCallDelta(
                        index=index,
                        call_id=f"call-{index}-{self.requests}",
                        name=call.name,
                        arguments_delta=pieces[0],
                    )
                )
                out += [ToolCallDelta(index=index, arguments_delta=p) for p in pieces[1:]]
            finish = "tool-calls"
            produced = sum(len(c.name) for c in item)
        prompt = len(request.messages)
        out.append(
            UsageChunk(usage=Usage(input_tokens=prompt, output_tokens=max(1, produced // 4)))
        )
        out.append(FinishChunk(reason=finish))  # type: ignore[arg-type]
        return out

    def _delay(self) -> float:
        if callable(self._latency):
            return _check_latency(self._latency(), "the latency function's result")
        return self._latency

    def answer_now(self, request: ModelRequest) -> Sequence[StreamChunk] | None:
        """Inline answer when there is no latency to serve."""
        if callable(self._latency) or self._latency > 0:
            return None
        return self._reply(self._next(request), request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        delay = self._delay()
        item = self._next(request)
        if delay > 0:
            await asyncio.sleep(delay)
        for chunk in self._reply(item, request):
            yield chunk
