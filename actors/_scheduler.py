"""Timers without a thread per timer: one heap, driven by one thread or by a test clock.

Design: a :class:`Scheduler` keeps every timer in one binary heap. With a real
clock a single daemon thread sleeps on a condition until the earliest deadline
(started on first use). With a :class:`ManualClock` there is no thread at all:
``clock.advance(dt)`` fires the due timers in the caller's thread, in deadline
order, so tests are deterministic. Callbacks must be quick (a ``tell``); they run
on a thread marked non-blocking, so a ``"block"`` mailbox overflow rejects there.

Coroutines wait on the same clock with :meth:`Scheduler.sleep` and
:meth:`Scheduler.wait_for` (a tool's timeout, a provider limiter's pause): on the real
clock they are ``asyncio.sleep`` and ``asyncio.wait_for`` (the event loop's clock is
``time.monotonic`` too), on any other a timer of this heap wakes the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from itertools import count
from typing import Any, TypeVar

from pykka import ActorDeadError, ActorRef

from actors._deadletters import DeadLetters
from actors._dispatcher import mark_thread_nonblocking
from actors.clock import Clock, ManualClock, SystemClock
from actors.errors import MailboxFullError, SchedulerClosedError

__all__ = ["Scheduler", "SchedulerStatistics", "TimerHandle"]

logger = logging.getLogger("corral.scheduler")
T = TypeVar("T")

_LONGEST_WAIT_S = 3600.0  # the longest single condition wait of the timer thread


class TimerHandle:
    """A pending timer; ``cancel()`` returns True if it stopped the timer from firing."""

    __slots__ = ("_scheduler", "callback", "cancelled", "fired", "when")

    def __init__(self, scheduler: Scheduler, when: float, callback: Callable[[], None]) -> None:
        self._scheduler = scheduler
        self.when = when
        self.callback = callback
        self.cancelled = False
        self.fired = False

    def cancel(self) -> bool:
        return self._scheduler._cancel(self)


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    pending: int
    fired: int
    cancelled: int
    threaded: bool
    closed: bool


class Scheduler:
    """Deliver a callback, or a message to an actor, after a delay."""

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        dead_letters: DeadLetters | None = None,
        name: str = "corral-scheduler",
    ) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = count()
        self._pending = 0  # Invariant: timers in the heap neither cancelled nor fired
        self._fired = 0
        self._cancelled = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        # The event loop's own timers measure this clock (time.monotonic): use them.
        self._loop_clock = type(self.clock) is SystemClock
        if isinstance(self.clock, ManualClock):
            self._unsubscribe = self.clock.subscribe(self._on_advance)

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Call ``callback()`` once ``delay`` seconds have passed on the clock."""
        when = self.clock.monotonic() + max(0.0, delay)
        handle = TimerHandle(self, when, callback)
        with self._cond:
            if self._closed:
                raise SchedulerClosedError
            earliest = not self._heap or when < self._heap[0][0]
            heapq.heappush(self._heap, (when, next(self._seq), handle))
            self._pending += 1
            if self._unsubscribe is None and self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._unsubscribe is not None:
                self._cond.notify_all()  # wait_pending (no thread waits here on a manual clock)
            elif earliest:
                self._cond.notify()
        return handle

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` on this scheduler's clock (in a coroutine on any loop)."""
        if self._loop_clock:
            await asyncio.sleep(seconds)
            return
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        timer = self.call_later(seconds, partial(_on_loop, loop, partial(_wake, woken)))
        try:
            await woken
        finally:
            timer.cancel()

    async def wait_for(self, work: Awaitable[T], timeout: float) -> T:
        """``await work``, cancelled with ``TimeoutError`` once ``timeout`` seconds have
        passed on this scheduler's clock (``asyncio.wait_for``'s contract)."""
        if self._loop_clock:
            return await asyncio.wait_for(work, timeout)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as limit:
            inside = [True]

            def expire() -> None:  # on the loop: cut the wait now, if it still runs
                if inside[0]:
                    limit.reschedule(loop.time())

            timer = self.call_later(timeout, partial(_on_loop, loop, expire))
            try:
                return await work
            finally:
                inside[0] = False
                timer.cancel()

    def wait_pending(self, count: int = 1, timeout: float | None = None) -> bool:
        """Block until at least ``count`` timers are pending (True), or ``timeout``
        real seconds passed (False): a test on a :class:`ManualClock` waits here for
        the timer it means to fire before it advances the clock."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending >= count or self._closed, timeout)
            return self._pending >= count

    def tell_later(self, delay: float, actor_ref: ActorRef[Any], message: object) -> TimerHandle:
        """``actor_ref.tell(message)`` after ``delay``; a stopped actor makes a dead letter."""

        def deliver() -> None:
            try:
                actor_ref.tell(message)
            except (ActorDeadError, MailboxFullError) as error:
                self.dead_letters.record(str(actor_ref), message, f"timer fired: {error}")

        return self.call_later(delay, deliver)

    def run_due(self) -> int:
        """Fire every timer due by now in the caller's thread; returns how many fired."""
        fired = 0
        while True:
            due = self._pop_due()
            if not due:
                return fired
            for handle in due:
                self._fire(handle)
            fired += len(due)

    def _on_advance(self) -> None:
        self.run_due()

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(
            pending=self._pending,
            fired=self._fired,
            cancelled=self._cancelled,
            threaded=self._thread is not None,
            closed=self._closed,
        )

    def close(self, timeout: float | None = 5.0) -> None:
        """Drop pending timers and stop the timer thread."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._pending = 0
            self._cond.notify_all()
        if self._unsubscribe is not None:
            self._unsubscribe()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- internals -------------------------------------------------------------------

    def _cancel(self, handle: TimerHandle) -> bool:
        with self._cond:
            if handle.cancelled or handle.fired or self._closed:
                return False
            handle.cancelled = True
            self._pending -= 1
            self._cancelled += 1
            if len(self._heap) > 64 and self._pending < len(self._heap) // 2:
                # Lazy deletion left mostly garbage: compact.
                self._heap = [e for e in self._heap if not e[2].cancelled]
                heapq.heapify(self._heap)
        return True

    def _pop_due(self) -> list[TimerHandle]:
        now = self.clock.monotonic()
        due: list[TimerHandle] = []
        with self._cond:
            heap = self._heap
            while heap and heap[0][0] <= now:
                handle = heapq.heappop(heap)[2]
                if handle.cancelled:
                    continue
                handle.fired = True
                self._pending -= 1
                self._fired += 1
                due.append(handle)
        return due

    def _fire(self, handle: TimerHandle) -> None:
        try:
            handle.callback()
        except Exception:
            logger.exception("timer callback %r failed", handle.callback)

    def _run(self) -> None:
        mark_thread_nonblocking()
        while True:
            with self._cond:
                while not self._closed:
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0][0] - self.clock.monotonic()
                    if wait <= 0:
                        break
                    # A far timer (a provider's Retry-After of years) is waited for in
                    # steps: threading refuses a wait beyond TIMEOUT_MAX (OverflowError).
                    self._cond.wait(min(wait, _LONGEST_WAIT_S))
                if self._closed:
                    return
            self.run_due()


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """``callback()`` on ``loop`` (a timer's: the waiting coroutine runs there); a
    closed loop has nothing waiting any more."""
    with contextlib.suppress(RuntimeError):  # the loop is closed
        loop.call_soon_threadsafe(callback)


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():  # (a cancelled sleep's future is done)
        woken.set_result(None)
