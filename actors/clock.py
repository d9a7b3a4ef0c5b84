"""The one clock protocol of corral, the real clock and a test clock.

Everything that reads time for a decision (the scheduler's timers, and through them
retry back-offs, tool timeouts and restart back-offs; the supervisor's restart
intensity; a provider's rate bucket) and the wall-clock time written into a log take a
:class:`Clock`: ``Runtime.open(clock=ManualClock())`` gives a whole runtime one, and a
test moves time by hand (``clock.advance(30)``) instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

__all__ = ["MANUAL_EPOCH", "SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock", "log_clock"]


class Clock(Protocol):
    """Time in seconds: ``monotonic`` for deciding when something fires (what the
    scheduler, the supervisor and the provider limiter read, never ``time.monotonic``
    directly), ``time`` for the wall-clock time a log records (seconds since the epoch,
    as ``time.time``), so a test can hold both still."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    """The real clocks: ``time.monotonic`` and ``time.time``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


MANUAL_EPOCH: Final = 1_767_225_600.0
"""Where a :class:`ManualClock`'s wall-clock time starts by default: 2026-01-01 00:00
UTC (a fixed time, so that what a test logs is the same in every run)."""


class ManualClock:
    """A test clock that only moves when told to. ``advance`` calls every subscriber
    (a :class:`~actors.Scheduler` on this clock subscribes, and fires its due timers
    there, in the caller's thread). Its wall-clock ``time`` is ``epoch`` plus the time
    advanced since it was made."""

    def __init__(self, start: float = 0.0, *, epoch: float = MANUAL_EPOCH) -> None:
        self._start = start
        self._now = start
        self._epoch = epoch
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[], None]] = []

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._epoch + (self._now - self._start)

    def subscribe(self, on_advance: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            self._subscribers.append(on_advance)

        def dispose() -> None:
            with self._lock:
                if on_advance in self._subscribers:
                    self._subscribers.remove(on_advance)

        return dispose

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and fire every timer now due."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back: advance({seconds})")
        with self._lock:
            self._now += seconds
            subscribers = list(self._subscribers)
        for on_advance in subscribers:
            on_advance()


SYSTEM_CLOCK: Final = SystemClock()
"""The real clock, shared (it holds no state)."""


def log_clock(clock: Clock) -> Callable[[], int] | None:
    """``clock``'s wall-clock time in epoch milliseconds, as a store's ``clock=`` takes
    it; None for the system clock (the store reads the real time inline: its hot path)."""
    if type(clock) is SystemClock:
        return None
    wall = clock.time
    return lambda: int(wall() * 1000)
