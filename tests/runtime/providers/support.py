"""Helpers shared by the provider tests: requests, stream collection, a fake clock."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from actors.errors import ModelError
from actors.model import BatchStreamingModel, Model, ModelRequest, checked_chunk
from storage.events import (
    FinishChunk,
    LlmFailure,
    Message,
    ReasoningDelta,
    RequestConfig,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    UsageChunk,
    UserMessage,
)

T = TypeVar("T")

KEY = "sk-test-0123456789abcdefSECRET"
ANTHROPIC_KEY = "sk-ant-test-0123456789abcdefSECRET"


def run(coro_fn: Callable[[], Awaitable[T]], timeout: float = 20.0) -> T:
    """Run one test body on a fresh loop, bounded in time."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro_fn(), timeout)

    return asyncio.run(bounded())


def user(text: str, id_: str = "m1") -> UserMessage:
    return UserMessage(id=id_, content=[TextBlock(text=text)])


def request(
    *messages: Message,
    model: str = "test-model",
    provider: str = "openai",
    system: str | None = None,
    tools: Sequence[ToolSpec] = (),
    **config: object,
) -> ModelRequest:
    return ModelRequest(
        config=RequestConfig(provider=provider, model=model, **config),  # type: ignore[arg-type]
        messages=list(messages) or [user("hi")],
        system=system,
        tools=list(tools),
    )


async def collect(model: Model, req: ModelRequest) -> list[StreamChunk]:
    """The chunks of ``req``'s reply, read as the agent reads them (in batches when the
    model has them), checking on the way that no batch is empty and that a model that
    vouches for its chunks (``chunks_checked``) hands over only chunks the agent's own
    check passes unchanged."""
    if isinstance(model, BatchStreamingModel):
        batches = [list(batch) async for batch in model.stream_batches(req)]
        assert all(batches), f"an empty batch among {batches}"
        chunks = [chunk for batch in batches for chunk in batch]
    else:
        chunks = [chunk async for chunk in model.stream(req)]
    if getattr(model, "chunks_checked", False):
        for chunk in chunks:
            assert checked_chunk(chunk) is chunk, chunk
    return chunks


async def failure_of(model: Model, req: ModelRequest) -> LlmFailure:
    try:
        await collect(model, req)
    except ModelError as err:
        return err.failure
    raise AssertionError("the stream did not fail")


def text_of(chunks: Sequence[StreamChunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


def reasoning_of(chunks: Sequence[StreamChunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, ReasoningDelta))


def tool_calls_of(chunks: Sequence[StreamChunk]) -> dict[int, tuple[str, str, str]]:
    """Assemble ``index -> (call_id, name, arguments)`` as the agent would."""
    calls: dict[int, list[str]] = {}
    for c in chunks:
        if isinstance(c, ToolCallDelta):
            slot = calls.setdefault(c.index, ["", "", ""])
            slot[0] = c.call_id or slot[0]
            slot[1] = c.name or slot[1]
            slot[2] += c.arguments_delta
    return {i: (s[0], s[1], s[2]) for i, s in sorted(calls.items())}


def tail_of(chunks: Sequence[StreamChunk]) -> list[str]:
    """The kinds of the last chunks: usage then finish, in that order."""
    return [type(c).__name__ for c in chunks if isinstance(c, UsageChunk | FinishChunk)]


class FakeClock:
    """Monotonic time that moves only when a test calls :meth:`advance`."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + delay, next(self._seq), fut))
        await fut

    def wake(self, delay: float) -> None:
        """Move time on and resolve the due sleepers, without running the loop."""
        self.now += delay
        while self._sleepers and self._sleepers[0][0] <= self.now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    async def advance(self, delay: float) -> None:
        """Move time on, wake due sleepers, and let the loop run what they release."""
        self.wake(delay)
        await settle()

    @property
    def sleeping(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())


async def settle(rounds: int = 20) -> None:
    """Let every ready callback run (bounded loop turns, no wall-clock waiting)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def aiter_list(items: Sequence[T]) -> AsyncIterator[T]:
    for item in items:
        yield item
