"""``SimulatedModel``: a model that behaves like a vendor's, for load tests that pay no
tokens.

Per request it draws a time to first token, a speed (tokens per second) and a reply
length from :class:`Dist` distributions, and whether the turn calls a tool; then it
streams on the I/O side as a vendor does: it waits out the time to first token, sends
the reply a chunk (``chunk_tokens`` tokens) at a time, each after the time its tokens
take at the drawn speed, then usage and the finish. All waits are the event loop's
timers; all randomness comes from one seeded :class:`random.Random` (same seed, same
draws in the same order of requests).

A tool call is made on a turn's first step (the last message is not a tool result) with
probability ``tool_probability``: one of the request's tools, picked at random, with
arguments that fill the required properties of its JSON schema with a placeholder of
their type (a string ``"x"``, the first of an ``enum``, 1, true, [] or {}).
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

import msgspec

from actors import ModelRequest
from storage import (
    FinishChunk,
    Message,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    ToolMessage,
    ToolSpec,
    Usage,
    UsageChunk,
    UserMessage,
)

__all__ = ["Dist", "Draw", "SimulatedModel", "SimulatedSettings", "placeholder_arguments"]

_TEXT: Final = (
    "the agent looked at the task and found a short answer that reads like a reply of a "
    "model under load with tokens streamed one chunk after another as vendors do"
)
_WORDS: Final = tuple(_TEXT.split(" "))
_ENCODER: Final = msgspec.json.Encoder()
_PLACEHOLDERS: Final[dict[str, Any]] = {
    "string": "x",
    "integer": 1,
    "number": 1.0,
    "boolean": True,
    "array": [],
    "object": {},
}


class Dist(msgspec.Struct, frozen=True):
    """A quantity drawn uniformly from ``mean ± spread`` (never below ``0``).

    Written ``MEAN`` or ``MEAN~SPREAD`` on the command line (``0.3~0.1``)."""

    mean: float
    spread: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("mean", self.mean), ("spread", self.spread)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"a distribution's {name} is a finite number >= 0, got {value}")

    @classmethod
    def parse(cls, text: str) -> Dist:
        """``"0.3"`` or ``"0.3~0.1"``; ``ValueError`` saying what is expected."""
        mean, _, spread = text.partition("~")
        try:
            return cls(float(mean), float(spread) if spread else 0.0)
        except ValueError as err:
            raise ValueError(
                f"expected MEAN or MEAN~SPREAD (numbers >= 0, e.g. 0.3~0.1), got {text!r}: {err}"
            ) from None

    def draw(self, rng: random.Random) -> float:
        if self.spread == 0:
            return self.mean
        return max(0.0, rng.uniform(self.mean - self.spread, self.mean + self.spread))

    def __str__(self) -> str:
        return f"{self.mean:g}~{self.spread:g}" if self.spread else f"{self.mean:g}"


class Draw(msgspec.Struct, frozen=True):
    """One request's draws."""

    ttft_s: float
    tokens_per_s: float
    reply_tokens: int
    tool: ToolSpec | None  # the tool to call, or None: a text reply
    number: int  # the request's number (1, 2, ...)


def placeholder_arguments(spec: ToolSpec) -> dict[str, Any]:
    """Arguments for ``spec``: each required property with a placeholder of its type."""
    properties = spec.parameters.get("properties", {})
    required = spec.parameters.get("required", [])
    args: dict[str, Any] = {}
    if not isinstance(properties, dict) or not isinstance(required, list):
        return args
    for name in required:
        schema = properties.get(name, {})
        if not isinstance(schema, dict):
            args[name] = "x"
        elif isinstance(schema.get("enum"), list) and schema["enum"]:
            args[name] = schema["enum"][0]
        else:
            kind = schema.get("type", "string")
            args[name] = _PLACEHOLDERS.get(kind if isinstance(kind, str) else "string", "x")
    return args


def _prompt_tokens(messages: Sequence[Message]) -> int:
    chars = 0
    for message in messages:
        if isinstance(message, UserMessage | ToolMessage):
            chars += sum(len(b.text) for b in message.content if isinstance(b, TextBlock))
    return max(1, chars // 4)


class SimulatedSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What a :class:`SimulatedModel` is made with: data, so it crosses to a shard
    (``SimulatedModel.settings``, :meth:`build`)."""

    ttft_s: Dist = Dist(0.3, 0.1)
    tokens_per_s: Dist = Dist(60.0, 20.0)
    reply_tokens: Dist = Dist(120.0, 60.0)
    tool_probability: float = 0.0
    chunk_tokens: int = 4
    seed: int = 0
    name: str = "simulated"

    def build(self) -> SimulatedModel:
        return SimulatedModel(**msgspec.structs.asdict(self))


class SimulatedModel:
    """A vendor-like model: see the module doc. ``requests`` counts the requests served."""

    chunks_checked = True

    def __init__(
        self,
        *,
        ttft_s: Dist = Dist(0.3, 0.1),  # noqa: B008 - a frozen struct
        tokens_per_s: Dist = Dist(60.0, 20.0),  # noqa: B008
        reply_tokens: Dist = Dist(120.0, 60.0),  # noqa: B008
        tool_probability: float = 0.0,
        chunk_tokens: int = 4,
        seed: int = 0,
        name: str = "simulated",
    ) -> None:
        if not 0.0 <= tool_probability <= 1.0:
            raise ValueError(f"tool_probability is in [0, 1], got {tool_probability}")
        if type(chunk_tokens) is not int or chunk_tokens < 1:
            raise ValueError(f"chunk_tokens is an int >= 1, got {chunk_tokens!r}")
        if tokens_per_s.mean <= 0:
            raise ValueError(f"tokens_per_s must have a mean > 0, got {tokens_per_s}")
        self.ttft_s = ttft_s
        self.tokens_per_s = tokens_per_s
        self.reply_tokens = reply_tokens
        self.tool_probability = tool_probability
        self.chunk_tokens = chunk_tokens
        self.settings = SimulatedSettings(
            ttft_s=ttft_s,
            tokens_per_s=tokens_per_s,
            reply_tokens=reply_tokens,
            tool_probability=tool_probability,
            chunk_tokens=chunk_tokens,
            seed=seed,
            name=name,
        )
        self._name = name
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.requests = 0

    @property
    def provider(self) -> str:
        return "simulated"

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return (
            f"SimulatedModel(ttft_s={self.ttft_s}, tokens_per_s={self.tokens_per_s}, "
            f"reply_tokens={self.reply_tokens}, tool_probability={self.tool_probability:g})"
        )

    def plan(self, request: ModelRequest) -> Draw:
        """The next request's draws (what :meth:`stream` does with ``request``)."""
        with self._lock:
            self.requests += 1
            number = self.requests
            ttft = self.ttft_s.draw(self._rng)
            speed = max(self.tokens_per_s.draw(self._rng), 1e-3)
            tokens = max(1, round(self.reply_tokens.draw(self._rng)))
            tool: ToolSpec | None = None
            last = request.messages[-1] if request.messages else None
            first_step = not isinstance(last, ToolMessage)
            wants = request.tools and first_step and self.tool_probability > 0
            if wants and self._rng.random() < self.tool_probability:
                tool = self._rng.choice(list(request.tools))
        return Draw(ttft, speed, tokens, tool, number)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        ttft, speed, tokens, tool, number = msgspec.structs.astuple(self.plan(request))
        if ttft > 0:
            await asyncio.sleep(ttft)
        usage = Usage(input_tokens=_prompt_tokens(request.messages))
        if tool is not None:
            arguments = _ENCODER.encode(placeholder_arguments(tool)).decode()
            yield ToolCallDelta(
                index=0, call_id=f"sim-{number}", name=tool.name, arguments_delta=arguments
            )
            output = max(1, len(arguments) // 4)
            yield UsageChunk(usage=Usage(input_tokens=usage.input_tokens, output_tokens=output))
            yield FinishChunk(reason="tool-calls")
            return
        step = self.chunk_tokens
        for start in range(0, tokens, step):
            count = min(step, tokens - start)
            words = [_WORDS[(start + i) % len(_WORDS)] for i in range(count)]
            if start:
                await asyncio.sleep(count / speed)
            yield TextDelta(text=(" " if start else "") + " ".join(words))
        yield UsageChunk(usage=Usage(input_tokens=usage.input_tokens, output_tokens=tokens))
        yield FinishChunk(reason="stop")
