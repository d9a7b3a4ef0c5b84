"""The one clock protocol of corral, the real clock and a test clock.

Everything that reads time for a decision (the scheduler's timers, the supervisor's
restart intensity, a provider's rate bucket) takes a :class:`Clock`; tests give them a
:class:`ManualClock` and move time by hand instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """Monotonic time in seconds: what the scheduler, the supervisor and the provider
    limiter read (never ``time.monotonic`` directly), so a test can hold time still."""

    def monotonic(self) -> float: ...


class SystemClock:
    """The real monotonic clock."""

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A test clock that only moves when told to. ``advance`` calls every subscriber
    (a :class:`~actors.Scheduler` on this clock subscribes, and fires its due timers
    there, in the caller's thread)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[], None]] = []

    def monotonic(self) -> float:
        return self._now

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
