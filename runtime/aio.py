"""asyncio forms of the verbs that wait, and a bounded async iterator over live events.

``from runtime import aio``, then, inside a running loop::

    agent = await aio.spawn(rt, model=model)
    reply = await aio.ask(agent, "hello")              # or: await agent.submit("hello")
    replies = await aio.gather([a.submit(t) for a, t in work])
    await aio.wait_idle(agent); await aio.dispose(agent)
    async with aio.events(rt, "agent/settled") as settled:
        async for event in settled: ...
    await aio.flush(rt); await aio.close(rt)

The waits on agents (a reply, idle, disposed) are futures completed by the agents'
own events and callbacks, handed to the loop with ``call_soon_threadsafe``: the loop is
never blocked and no thread waits for them. ``spawn`` (it creates the session on disk
and starts the actor) and ``close`` (which joins threads) have no such event: they run
in a worker thread (``asyncio.to_thread``). ``flush`` is ``rt.aflush()``.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .errors import ReplyTimeoutError
from .replies import PendingReply, Reply

if TYPE_CHECKING:
    from .agent import Agent
    from .runtime import Runtime

__all__ = [
    "DEFAULT_EVENT_BUFFER",
    "EventStream",
    "as_completed",
    "ask",
    "close",
    "dispose",
    "events",
    "flush",
    "gather",
    "spawn",
    "wait_all_idle",
    "wait_idle",
]

DEFAULT_EVENT_BUFFER = 1024
"""How many undelivered events an :class:`EventStream` keeps before it drops the oldest."""


async def spawn(rt: Runtime, **settings: Any) -> Agent:
    """``rt.spawn(**settings)`` in a worker thread (it writes the new session)."""
    return await asyncio.to_thread(lambda: rt.spawn(**settings))


async def ask(
    agent: Agent, message: Any, *, timeout: float | None = 300.0, steer: bool = False
) -> Reply:
    """``agent.ask`` without blocking the loop; ``ReplyTimeoutError`` after ``timeout``."""
    pending = agent.submit(message, steer=steer)
    return await _reply(pending, timeout)


async def _reply(pending: PendingReply, timeout: float | None) -> Reply:
    try:
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(pending.future)), timeout)
    except TimeoutError as err:
        raise ReplyTimeoutError(pending.agent_id, pending.message_id, timeout) from err


async def gather(pending: Sequence[PendingReply], timeout: float | None = None) -> list[Reply]:
    """The replies of many sends, in the order given, once all are in."""
    futures = [asyncio.wrap_future(p.future) for p in pending]
    try:
        return list(await asyncio.wait_for(asyncio.gather(*futures), timeout))
    except TimeoutError as err:
        late = next(p for p in pending if not p.future.done())
        raise ReplyTimeoutError(late.agent_id, late.message_id, timeout) from err


async def as_completed(
    pending: Iterable[PendingReply], timeout: float | None = None
) -> AsyncIterator[Reply]:
    """Yield replies as they complete; ``ReplyTimeoutError`` if not all are in within
    ``timeout`` seconds."""
    items = list(pending)
    futures = [asyncio.wrap_future(p.future) for p in items]
    try:
        for next_done in asyncio.as_completed(futures, timeout=timeout):
            yield await next_done
    except TimeoutError as err:
        late = next(p for p in items if not p.future.done())
        raise ReplyTimeoutError(late.agent_id, late.message_id, timeout) from err


def _when(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Future[None], Callable[[], None]]:
    """A loop future and a thread-safe callback that completes it (once)."""
    future: asyncio.Future[None] = loop.create_future()

    def complete() -> None:
        if not future.done():
            future.set_result(None)

    def complete_soon() -> None:
        loop.call_soon_threadsafe(complete)

    return future, complete_soon


async def wait_idle(agent: Agent, timeout: float | None = None) -> bool:
    """``agent.wait_idle`` without blocking the loop: False on timeout."""
    return await wait_all_idle([agent], timeout)


async def wait_all_idle(agents: Iterable[Agent], timeout: float | None = None) -> bool:
    """Until every one of ``agents`` handled every send before the call and is idle."""
    loop = asyncio.get_running_loop()
    waits = []
    for agent in agents:
        future, complete = _when(loop)
        agent.notify_idle(complete)
        waits.append(future)
    if not waits:
        return True
    try:
        await asyncio.wait_for(asyncio.gather(*waits), timeout)
    except TimeoutError:
        return False
    return True


async def dispose(agent: Agent, timeout: float | None = None) -> bool:
    """``agent.dispose`` without blocking the loop: starts the disposal, then awaits its
    ``agent/disposed`` (``agent.disposed`` turns True once that event's listeners have
    returned, a moment later); False if it did not end within ``timeout``."""
    loop = asyncio.get_running_loop()
    future, complete = _when(loop)
    stop = agent.on("agent/disposed", lambda _event: complete())
    try:
        if not agent.dispose(timeout=0):  # starts it; True if it ended already
            await asyncio.wait_for(asyncio.shield(future), timeout)
    except TimeoutError:
        return agent.disposed
    finally:
        stop()
    return True


async def flush(rt: Runtime) -> None:
    """``rt.flush()`` for asyncio code (``rt.aflush()``)."""
    await rt.aflush()


async def close(rt: Runtime, timeout: float | None = 30.0) -> None:
    """``rt.close(timeout)`` in a worker thread (it joins the runtime's threads)."""
    await asyncio.to_thread(rt.close, timeout)


class EventStream:
    """An async iterator over one live event of every agent (``rt.on(name, ...)``).

    Bounded: it keeps at most ``buffer`` undelivered events; when the consumer is slower
    than the agents, the oldest undelivered event is dropped and counted in
    :attr:`dropped` (the agents are never slowed down by a slow consumer: the listener
    runs on their threads). Use it as ``async with``, or call :meth:`aclose`; closing
    ends the iteration."""

    def __init__(self, rt: Runtime, name: str, buffer: int = DEFAULT_EVENT_BUFFER) -> None:
        if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 1:
            raise ValueError(f"buffer is an int >= 1, got {buffer!r}")
        self._loop = asyncio.get_running_loop()
        self._queue: collections.deque[Any] = collections.deque(maxlen=buffer)
        self._lock = threading.Lock()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self.dropped = 0
        """How many events were dropped because the consumer fell ``buffer`` behind."""
        self._stop = rt.on(name, self._arrived)

    def _arrived(self, event: Any) -> None:  # on an agent's thread
        with self._lock:
            if self._closed:
                return
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
            self._queue.append(event)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._loop.call_soon_threadsafe(_wake, waiter)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Any:
        while True:
            with self._lock:
                if self._queue:
                    return self._queue.popleft()
                if self._closed:
                    raise StopAsyncIteration
                self._waiter = waiter = self._loop.create_future()
            await waiter

    async def aclose(self) -> None:
        self._stop()
        with self._lock:
            self._closed = True
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def events(rt: Runtime, name: str, *, buffer: int = DEFAULT_EVENT_BUFFER) -> EventStream:
    """An :class:`EventStream` over ``name`` (``"agent/settled"``, ...): call it in the
    running loop that iterates it."""
    return EventStream(rt, name, buffer)
