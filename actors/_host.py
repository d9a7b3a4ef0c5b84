"""A pool thread blocked in a sync middleware's ``next()`` that runs its inner chain's
sync work itself, so that a chain of middleware holds at most one pool thread.

A sync middleware listener runs in the I/O side's blocking pool and its ``next()`` blocks
that thread until the inner chain is done. Were the inner chain's sync work (a sync
listener past an async one, a sync tool body) sent to the same pool, enough such chains
at once would hold every thread waiting for threads other waiting chains hold: nothing
would ever run again. Used by the bus's waterfalls (``actors/bus.py``) and by
``tools/execute`` (``actors/tools.py``).
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

__all__ = ["Host", "unstopped"]

_Work = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]


def _refused(error: StopIteration) -> RuntimeError:
    return RuntimeError(f"raised {error!r}")


def unstopped(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a ``StopIteration`` it raises turned into a ``RuntimeError`` naming
    it: for work whose outcome goes into an asyncio future (``run_in_executor``,
    ``wrap_future``), which refuses ``StopIteration`` and is then never settled."""
    try:
        return fn(*args)
    except StopIteration as err:
        raise _refused(err) from err


class Host:
    """A thread blocked in a sync listener's ``next()``: until the inner chain is done it
    runs the chain's sync work (sync listeners inside, a sync body) sent from the loop,
    so that work needs no other pool thread.

    Invariant: ``submit`` and ``close`` run on the loop, so nothing is queued after the
    closing sentinel (work submitted after the close goes to the pool instead)."""

    __slots__ = ("_closed", "_loop", "_pool", "_queue")

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: Executor) -> None:
        self._loop = loop
        self._pool = pool
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on the host thread (on the loop: returns its future)."""
        if self._closed:  # e.g. a task an async listener left behind calls next() late
            return self._loop.run_in_executor(self._pool, unstopped, fn, *args)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._queue.put((fn, args, future))
        return future

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)

    def serve(self, inner: Awaitable[Any]) -> Any:
        """Run ``inner`` on the loop and the work it submits here, until it is done; its
        result (or exception). On the blocked thread."""

        async def run_then_close() -> Any:
            try:
                return await inner
            finally:
                self.close()

        done = asyncio.run_coroutine_threadsafe(run_then_close(), self._loop)
        while (item := self._queue.get()) is not None:
            fn, args, future = item
            try:
                value = fn(*args)
            except BaseException as err:  # noqa: BLE001 - handed to the awaiting coroutine
                self._settle(future, None, err)
            else:
                self._settle(future, value, None)
        return done.result()

    def _settle(self, future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
        def settle() -> None:
            if future.done():  # cancelled meanwhile: a timeout, or the call's cancel
                return
            if error is None:
                future.set_result(value)
            elif isinstance(error, StopIteration):  # asyncio futures refuse StopIteration
                future.set_exception(_refused(error))
            else:
                future.set_exception(error)

        try:
            self._loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed: nobody awaits the result any more
            return
