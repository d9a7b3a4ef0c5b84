"""Deadlines for waits that share one timeout (a close that waits for several things)."""

from __future__ import annotations

import time

__all__ = ["deadline", "remaining"]


def deadline(timeout: float | None) -> float | None:
    """The monotonic time ``timeout`` seconds from now (None: no limit)."""
    return None if timeout is None else time.monotonic() + timeout


def remaining(until: float | None) -> float | None:
    """Seconds left until ``until`` (None: no limit), never negative."""
    return None if until is None else max(0.0, until - time.monotonic())
