"""Per-provider request limits: a fair concurrency limit, a requests-per-minute bucket,
a tokens-per-minute budget and a pause a quota's 429 imposes.

A provider instance acts as *one client of its quota*: every agent sharing the instance
shares these. A 429 with a ``retry-after`` pauses the instance's new requests until
then (:meth:`ProviderLimiter.pause`; the requests waiting for it then go out spread
over ``pause_jitter`` of the pause, not at one instant); ``tokens_per_minute`` holds new
requests while the tokens the replies used (their usage) are over that budget.

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
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec

from actors import SYSTEM_CLOCK, Clock

__all__ = ["FairSemaphore", "LimiterStatistics", "ProviderLimiter", "RateBucket", "TokenBudget"]

Sleep = Callable[[float], Awaitable[None]]


class LimiterStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a :class:`ProviderLimiter`."""

    in_flight: int
    waiting_for_slot: int
    waiting_for_rate: int
    max_concurrency: int | None
    requests_per_minute: float | None
    tokens_per_minute: float | None = None
    paused_for_s: float = 0.0
    """How long new requests are still held by a quota's ``retry-after`` (0: not paused)."""
    pauses: int = 0
    """How many times a quota's ``retry-after`` paused this provider."""


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


class TokenBudget:
    """Tokens per minute: a level refilled at ``per_minute / 60`` a second up to one
    minute's worth, debited by each reply's usage once known (so it can go below 0).
    A request waits while the level is below 0: the budget is kept over any minute, a
    reply's tokens being counted when its usage arrives."""

    def __init__(
        self, per_minute: float, *, clock: Clock = SYSTEM_CLOCK, sleep: Sleep = asyncio.sleep
    ) -> None:
        if per_minute <= 0:
            raise ValueError(f"tokens_per_minute must be positive, got {per_minute}")
        self.per_minute = per_minute
        self._rate = per_minute / 60.0
        self._now = clock.monotonic
        self._sleep = sleep
        self._level = float(per_minute)
        self._stamp = self._now()

    def _refill(self) -> None:
        now = self._now()
        self._level = min(self.per_minute, self._level + (now - self._stamp) * self._rate)
        self._stamp = now

    def spend(self, tokens: int) -> None:
        self._refill()
        self._level -= tokens

    async def acquire(self) -> None:
        self._refill()
        while self._level < 0:
            await self._sleep(-self._level / self._rate)
            self._refill()


class ProviderLimiter:
    """The limits one provider instance applies to its requests.

    A request first waits out a pause (a quota's ``retry-after``), then for a
    concurrency slot, then for a rate token and the token budget, then for a pause
    again (one may have begun meanwhile), so the rate at which requests go out follows
    the bucket exactly and none goes out while the provider is paused.
    """

    def __init__(
        self,
        *,
        max_concurrency: int | None = None,
        requests_per_minute: float | None = None,
        rpm_burst: int | None = None,
        tokens_per_minute: float | None = None,
        pause_jitter: float = 0.1,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 <= pause_jitter < 1:
            raise ValueError(f"pause_jitter is a fraction in [0, 1), got {pause_jitter!r}")
        self._slots = FairSemaphore(max_concurrency) if max_concurrency is not None else None
        self._bucket = (
            RateBucket(requests_per_minute, burst=rpm_burst, clock=clock, sleep=sleep)
            if requests_per_minute is not None
            else None
        )
        self._tokens = (
            TokenBudget(tokens_per_minute, clock=clock, sleep=sleep)
            if tokens_per_minute is not None
            else None
        )
        self._now = clock.monotonic
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._pause_jitter = pause_jitter
        self._paused_until = -math.inf
        self._pause_s = 0.0  # the length of the latest pause (the jitter's scale)
        self._pauses = 0
        self._in_flight = 0

    @property
    def unlimited(self) -> bool:
        """No limit is set (a pause still applies: a 429 can come to any provider)."""
        return self._slots is None and self._bucket is None and self._tokens is None

    def statistics(self) -> LimiterStatistics:
        return LimiterStatistics(
            in_flight=self._in_flight,
            waiting_for_slot=self._slots.waiting if self._slots else 0,
            waiting_for_rate=self._bucket.waiting if self._bucket else 0,
            max_concurrency=self._slots.limit if self._slots else None,
            requests_per_minute=self._bucket.per_minute if self._bucket else None,
            tokens_per_minute=self._tokens.per_minute if self._tokens else None,
            paused_for_s=max(0.0, self._paused_until - self._now()),
            pauses=self._pauses,
        )

    def pause(self, seconds: float) -> None:
        """Hold this provider's new requests for ``seconds`` (a quota's ``retry-after``);
        a pause under way is only ever lengthened."""
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        until = self._now() + seconds
        if until > self._paused_until:
            self._paused_until = until
            self._pause_s = seconds
            self._pauses += 1

    def spend(self, tokens: int) -> None:
        """Count a reply's tokens against ``tokens_per_minute`` (nothing without it)."""
        if self._tokens is not None and tokens > 0:
            self._tokens.spend(tokens)

    async def _unpaused(self) -> None:
        """Return once no pause holds new requests; a request that waited for one goes
        out at a random moment of the pause's ``pause_jitter`` after its end."""
        waited = False
        while (left := self._paused_until - self._now()) > 0:
            waited = True
            await self._sleep(left)
        if waited and self._pause_jitter > 0:
            await self._sleep(self._pause_s * self._pause_jitter * self._rng.random())
            if self._paused_until > self._now():  # paused again meanwhile
                await self._unpaused()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one request's place for the body of the ``async with``."""
        await self._unpaused()
        if self._slots is not None:
            await self._slots.acquire()
        try:
            if self._bucket is not None:
                await self._bucket.acquire()
            if self._tokens is not None:
                await self._tokens.acquire()
            await self._unpaused()  # a pause may have begun while it waited
            self._in_flight += 1
            try:
                yield
            finally:
                self._in_flight -= 1
        finally:
            if self._slots is not None:
                self._slots.release()
