"""The I/O side's pool for blocking callables (sync tool bodies, sync listeners run off
the dispatcher): it counts what it holds, so a close can wait with a timeout, and lends
one more thread for each callable its caller gave up on (:class:`Lease`)."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import ParamSpec, TypeVar

from actors._dispatcher import mark_thread_blocking_pool

__all__ = ["BlockingPool", "Lease"]

T = TypeVar("T")
P = ParamSpec("P")


class BlockingPool(ThreadPoolExecutor):
    """A thread pool that knows how many callables it holds (queued or running), so
    that closing can wait for them with a timeout (``shutdown`` has none). Each callable
    runs in a copy of its submitter's context (as ``asyncio.to_thread`` does), so that
    ``actors._dispatcher.working_for`` follows an agent's work into the pool; its threads
    are marked as the runtime's (``in_runtime_thread``)."""

    def __init__(self, workers: int, prefix: str) -> None:
        super().__init__(workers, thread_name_prefix=prefix, initializer=mark_thread_blocking_pool)
        self._idle = threading.Condition()
        self._held = 0  # Invariant: submitted callables whose future is not done yet
        # Invariant: leases abandoned and not ended; _max_workers is raised by as many.
        self._abandoned = 0

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._idle:
            self._held += 1
        try:
            run_in = contextvars.copy_context().run
            future = super().submit(partial(run_in, fn, *args, **kwargs))
        except BaseException:
            self._release(None)
            raise
        future.add_done_callback(self._release)  # done: returned, raised or cancelled
        return future

    def _release(self, _future: object) -> None:
        with self._idle:
            self._held -= 1
            if not self._held:
                self._idle.notify_all()

    def wait_idle(self, timeout: float | None) -> int:
        """Wait until every callable finished, at most ``timeout`` seconds; how many
        have not."""
        with self._idle:
            self._idle.wait_for(lambda: not self._held, timeout)
            return self._held

    def lease(self) -> Lease:
        """A lease for a callable whose caller may stop waiting for it (a timeout): see
        :class:`Lease`."""
        return Lease(self)

    @property
    def abandoned(self) -> int:
        """Callables still holding a thread that their callers gave up on."""
        return self._abandoned

    def _abandon(self, lease: Lease) -> None:
        with self._idle:
            if lease._state == _LEASED:
                lease._state = _ABANDONED
                self._abandoned += 1
                # ThreadPoolExecutor starts a thread on submit while it has fewer than
                # _max_workers and none idle: one more for as long as this one is held.
                self._max_workers += 1

    def _end_lease(self, lease: Lease) -> None:
        with self._idle:
            if lease._state == _ABANDONED:
                self._abandoned -= 1
                self._max_workers -= 1
            lease._state = _ENDED


_LEASED, _ABANDONED, _ENDED = range(3)


class Lease:
    """A sync callable's hold on a blocking-pool thread that its caller may give up on.

    A sync tool body past its timeout cannot be interrupted: it keeps its thread until it
    returns. :meth:`abandon` (the caller stopped waiting) lets the pool start one more
    thread for as long as the callable runs, so bodies that never return cannot take
    every thread of the pool from the others; :meth:`end` (the callable returned, raised
    or never started) gives the extra thread back. Both are idempotent and thread-safe.
    """

    __slots__ = ("_pool", "_state")

    def __init__(self, pool: BlockingPool) -> None:
        self._pool = pool
        self._state = _LEASED

    def abandon(self) -> None:
        self._pool._abandon(self)

    def end(self, _future: object = None) -> None:
        self._pool._end_lease(self)
