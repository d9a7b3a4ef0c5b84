"""The I/O side's pool for blocking callables (sync tool bodies, sync listeners run off
the dispatcher): it counts what it holds, so a close can wait with a timeout, and lends
one more thread for each callable its caller gave up on (:class:`Lease`).

Its own ``Executor`` rather than a ``ThreadPoolExecutor``: a sync tool's run is one
:meth:`BlockingPool.call` (a tuple on a ``SimpleQueue``, one lock to count it), where
``ThreadPoolExecutor.submit`` made a ``Future``, a work item, a done callback and took
five locks and a semaphore each way; measured with 1,000 agents making one no-op tool
call a turn, 7-10% less CPU a turn (see benchmarks/README.md). Worker threads are
started as ``ThreadPoolExecutor`` starts them (one more only when none is idle, up to
the bound) and are daemon threads, as the I/O loop's is: a body that never returns does
not hold the process at exit (the runtime's close waits for bodies with a timeout).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from queue import Empty, SimpleQueue
from typing import Any, ParamSpec, TypeVar

from actors._dispatcher import mark_thread_blocking_pool

__all__ = ["BlockingPool", "Lease"]

T = TypeVar("T")
P = ParamSpec("P")

_log = logging.getLogger("corral.io")

_Item = tuple[Callable[..., Any], Callable[..., Any], tuple[Any, ...]]
"""A queued callable: ``(run_in_context, fn, args)``."""


def _fulfil(
    future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Run a :meth:`BlockingPool.submit` callable into its future (as
    ``ThreadPoolExecutor``'s work item does)."""
    if not future.set_running_or_notify_cancel():
        return  # cancelled while queued
    try:
        result = fn(*args, **kwargs)
    except BaseException as error:  # noqa: BLE001 - the future's failure, as in the stdlib
        future.set_exception(error)
    else:
        future.set_result(result)


class BlockingPool(Executor):
    """A bounded thread pool that knows how many callables it holds (queued or running),
    so that closing can wait for them with a timeout (``shutdown`` has none). Each
    callable runs in a copy of its submitter's context (as ``asyncio.to_thread`` does),
    so that ``actors._dispatcher.working_for`` follows an agent's work into the pool; its
    threads are marked as the runtime's (``in_runtime_thread``)."""

    def __init__(self, workers: int, prefix: str) -> None:
        if workers < 1:
            raise ValueError(f"a blocking pool needs at least one worker, got {workers!r}")
        self._prefix = prefix
        self._queue: SimpleQueue[_Item | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._idle_changed = threading.Condition(self._lock)
        # Invariants (under _lock): callables queued or running, not finished yet; how
        # many wait_idle callers wait for _held to reach 0.
        self._held = 0
        self._waiters = 0
        # Workers that finished a callable and were not claimed by a call since (as the
        # idle semaphore of ThreadPoolExecutor): a call claims one, or starts a thread.
        self._idle = 0
        self._threads: list[threading.Thread] = []
        # Invariant: at most this many threads; raised by one per abandoned lease.
        self._max_workers = workers
        self._abandoned = 0
        self._shutdown = False
        self._stopped = False  # every thread has been sent its stop (None on the queue)

    def call(self, fn: Callable[..., Any], /, *args: Any) -> None:
        """Run ``fn(*args)`` on a pool thread, with no future: what it returns is dropped
        and what it raises is logged, so ``fn`` reports its own outcome (the I/O side's
        blocking effects do). Raises ``RuntimeError`` once the pool is shut down."""
        item = (contextvars.copy_context().run, fn, args)
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._held += 1
            self._queue.put(item)
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._max_workers:
                self._start_thread()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        self.call(_fulfil, future, fn, args, kwargs)
        return future

    def _start_thread(self) -> None:
        """One more worker (the lock is held)."""
        thread = threading.Thread(
            target=self._work, name=f"{self._prefix}_{len(self._threads)}", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def _work(self) -> None:
        mark_thread_blocking_pool()
        queue = self._queue
        lock = self._lock
        while True:
            item = queue.get()
            if item is None:  # shut down: what was queued before has run
                return
            run, fn, args = item
            try:
                run(fn, *args)
            except BaseException:  # noqa: BLE001 - a worker outlives what it runs
                _log.exception("a blocking-pool callable raised %r", fn)
            del item, run, fn, args  # not held while the thread waits for more
            with lock:
                self._held -= 1
                if not self._held and self._waiters:
                    self._idle_changed.notify_all()
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new callable is taken; the queued ones still run (``cancel_futures``: the
        futures of those not started are cancelled and they do not run); then the threads
        end. ``wait``: return once they have."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                self._drop_queued()
            if not self._stopped:
                self._stopped = True
                for _ in self._threads:
                    self._queue.put(None)
            threads = list(self._threads)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _drop_queued(self) -> None:
        """Take every queued callable off the queue, cancelling the futures of submitted
        ones (the lock is held)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except Empty:
                break
            if item is None:
                continue
            self._held -= 1
            _run, fn, args = item
            if fn is _fulfil:
                args[0].cancel()
        if not self._held and self._waiters:
            self._idle_changed.notify_all()

    def wait_idle(self, timeout: float | None) -> int:
        """Wait until every callable finished, at most ``timeout`` seconds; how many
        have not."""
        with self._lock:
            self._waiters += 1
            try:
                self._idle_changed.wait_for(lambda: not self._held, timeout)
            finally:
                self._waiters -= 1
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
        with self._lock:
            if lease._state == _LEASED:
                lease._state = _ABANDONED
                self._abandoned += 1
                # A call starts a thread while there are fewer than _max_workers and none
                # idle: one more for as long as this one is held.
                self._max_workers += 1

    def _end_lease(self, lease: Lease) -> None:
        with self._lock:
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
