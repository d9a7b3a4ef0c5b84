"""Per-provider request limits: a fair concurrency limit and a requests-per-minute bucket.

Requests beyond a limit *wait* in FIFO order; they never fail because of it. A request
cancelled while waiting leaves the queue consistent: if it had already been granted its
slot (or rate token) when the cancel landed, the grant passes on to the next waiter.

Everything here runs on one asyncio loop (the runtime's I/O loop). Time is injectable
(``clock``, an ``actors.Clock``, and ``sleep``) so tests drive the rate bucket with a
fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec

from actors import SYSTEM_CLOCK, Clock

__all__ = ["FairSemaphore", "LimiterStatistics", "ProviderLimiter", "RateBucket"]

Sleep = Callable[[float], Awaitable[None]]


class LimiterStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a :class:`ProviderLimiter`."""

    in_flight: int
    waiting_for_slot: int
    waiting_for_rate: int
    max_concurrency: int | None
    requests_per_minute: float | None


class _FifoQueue:
    """Waiter futures in arrival order; cancelled ones are skipped lazily.

    Invariant: ``stale`` counts the cancelled futures still in ``waiters``.
    """

    def __init__(self) -> None:
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.stale = 0

    def __len__(self) -> int:
        return len(self.waiters) - self.stale

    def push(self) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        return fut

    def pop_live(self) -> asyncio.Future[None] | None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                return fut
            self.stale -= 1
        return None

    def abandon(self, fut: asyncio.Future[None]) -> bool:
        """Mark ``fut`` given up; ``True`` if it had been granted (the grant must pass on)."""
        if fut.done() and not fut.cancelled():
            return True
        fut.cancel()
        self.stale += 1
        return False


class FairSemaphore:
    """A counting semaphore that grants strictly in arrival order."""

    def __init__(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"a concurrency limit must be at least 1, got {value}")
        self.limit = value
        self._free = value
        self._queue = _FifoQueue()

    @property
    def in_use(self) -> int:
        return self.limit - self._free

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def acquire(self) -> None:
        if self._free > 0 and not len(self._queue):
            self._free -= 1
            return
        fut = self._queue.push()
        try:
            await fut
        except asyncio.CancelledError:
            if self._queue.abandon(fut):
                self.release()
            raise

    def release(self) -> None:
        fut = self._queue.pop_live()
        if fut is None:
            self._free += 1
            assert self._free <= self.limit, "released more than acquired"
        else:
            fut.set_result(None)  # the slot passes straight on: _free is unchanged


class RateBucket:
    """A token bucket refilled at ``per_minute / 60`` tokens a second, granted FIFO.

    ``burst`` is the bucket's size (default: one second's worth, at least 1). A single
    pump task grants waiting requests as tokens arrive.
    """

    def __init__(
        self,
        per_minute: float,
        *,
        burst: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if per_minute <= 0:
            raise ValueError(f"requests_per_minute must be positive, got {per_minute}")
        self.per_minute = per_minute
        self.capacity = float(burst if burst is not None else max(1, math.ceil(per_minute / 60)))
        self._rate = per_minute / 60.0
        self._now = clock.monotonic
        self._sleep = sleep
        self._tokens = self.capacity
        self._stamp = self._now()
        self._queue = _FifoQueue()
        self._pump_task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def _refill(self) -> None:
        now = self._now()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now

    async def acquire(self) -> None:
        self._refill()
        if not len(self._queue) and self._tokens >= 1:
            self._tokens -= 1
            return
        fut = self._queue.push()
        if self._pump_task is None or self._pump_task.done():
            self._pump_task = asyncio.get_running_loop().create_task(self._pump())
        try:
            await fut
        except asyncio.CancelledError:
            if self._queue.abandon(fut):
                self._tokens = min(self.capacity, self._tokens + 1)  # unused: give it back
            raise

    async def _pump(self) -> None:
        while len(self._queue):
            self._refill()
            if self._tokens >= 1:
                fut = self._queue.pop_live()
                if fut is not None:
                    self._tokens -= 1
                    fut.set_result(None)
                continue
            await self._sleep((1.0 - self._tokens) / self._rate)


class ProviderLimiter:
    """The limits one provider instance applies to its requests.

    A request first waits for a concurrency slot, then for a rate token, so the rate at
    which requests go out follows the bucket exactly.
    """

    def __init__(
        self,
        *,
        max_concurrency: int | None = None,
        requests_per_minute: float | None = None,
        rpm_burst: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._slots = FairSemaphore(max_concurrency) if max_concurrency is not None else None
        self._bucket = (
            RateBucket(requests_per_minute, burst=rpm_burst, clock=clock, sleep=sleep)
            if requests_per_minute is not None
            else None
        )
        self._in_flight = 0

    @property
    def unlimited(self) -> bool:
        return self._slots is None and self._bucket is None

    def statistics(self) -> LimiterStatistics:
        return LimiterStatistics(
            in_flight=self._in_flight,
            waiting_for_slot=self._slots.waiting if self._slots else 0,
            waiting_for_rate=self._bucket.waiting if self._bucket else 0,
            max_concurrency=self._slots.limit if self._slots else None,
            requests_per_minute=self._bucket.per_minute if self._bucket else None,
        )

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one request's place for the body of the ``async with``."""
        if self._slots is not None:
            await self._slots.acquire()
        try:
            if self._bucket is not None:
                await self._bucket.acquire()
            self._in_flight += 1
            try:
                yield
            finally:
                self._in_flight -= 1
        finally:
            if self._slots is not None:
                self._slots.release()
