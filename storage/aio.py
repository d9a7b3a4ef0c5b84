"""Awaiting durability from asyncio code: :meth:`Session.aflush` and :meth:`Store.aflush`.

The log writer reports a flush by calling back on its own thread. An event loop must be
woken to resolve the waiting task's future, and ``loop.call_soon_threadsafe`` wakes it
with a write to its self-pipe per call. One commit resolves the flushes of every task
that appended meanwhile, so a callback per task would wake the loop (and hand the GIL to
its thread) once per task, in the middle of the writer's callbacks. Here the callbacks of
one loop queue their futures and only the first of a batch wakes the loop, which
resolves every future queued by then: one wake-up per commit and loop (measured in
``benchmarks/bench_log_append.py``, "producers as asyncio tasks").
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import Final

from storage.records import FlushCallback

__all__ = ["wait_durable"]

Resolved = tuple["asyncio.Future[None]", BaseException | None]


class _LoopWaker:
    """Resolves one event loop's flush futures from the writer's thread, waking the loop
    once per batch of callbacks."""

    __slots__ = ("_lock", "_loop", "_ready")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[Resolved] = []

    def callback(self, future: asyncio.Future[None]) -> FlushCallback:
        """The flush callback that resolves ``future`` (called from any thread)."""

        def done(error: BaseException | None) -> None:
            with self._lock:
                ready = self._ready
                ready.append((future, error))
                first = len(ready) == 1
            if first:
                try:
                    self._loop.call_soon_threadsafe(self._resolve)
                except RuntimeError:  # the loop is closed: nobody awaits the future
                    with self._lock:
                        self._ready = []

        return done

    def _resolve(self) -> None:
        """On the loop: resolve every future queued so far."""
        with self._lock:
            ready, self._ready = self._ready, []
        for future, error in ready:
            if future.done():  # its task was cancelled
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


_wakers: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker]] = (
    weakref.WeakKeyDictionary()
)
_wakers_lock: Final = threading.Lock()


def _waker(loop: asyncio.AbstractEventLoop) -> _LoopWaker:
    """The loop's waker (a loop that cannot be weakly referenced gets one per flush)."""
    try:
        waker = _wakers.get(loop)
        if waker is None:
            with _wakers_lock:
                waker = _wakers.get(loop)
                if waker is None:
                    waker = _wakers[loop] = _LoopWaker(loop)
    except TypeError:
        return _LoopWaker(loop)
    return waker


async def wait_durable(flush_async: Callable[[FlushCallback], None]) -> None:
    """Ask ``flush_async`` for a flush and wait for it without blocking the running loop;
    raise the error it reports (a :class:`~storage.errors.StorageError`, or
    :class:`~storage.errors.StoreClosedError` at once for a closed store). Cancelling
    the waiting task leaves the flush itself running: what was appended still becomes
    durable."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    flush_async(_waker(loop).callback(future))
    await future
