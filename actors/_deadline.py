"""Deadlines for waits that share one timeout (a close that waits for several things)."""

from __future__ import annotations

import time

__all__ = ["GRACE_S", "deadline", "extended", "remaining"]

GRACE_S = 0.1
"""What a wait for the runtime's own machinery gets when the shared deadline has run
out: an actor handling its stop message, cancelled tasks unwinding, a thread's exit take
milliseconds when nothing is stuck; none of them waits for user code to return."""


def deadline(timeout: float | None) -> float | None:
    """The monotonic time ``timeout`` seconds from now (None: no limit)."""
    return None if timeout is None else time.monotonic() + timeout


def remaining(until: float | None) -> float | None:
    """Seconds left until ``until`` (None: no limit), never negative."""
    return None if until is None else max(0.0, until - time.monotonic())


def extended(until: float | None, grace: float = GRACE_S) -> float | None:
    """``until``, or ``grace`` seconds from now if that is later: the deadline of a wait
    for the runtime's own machinery, which must not be cut to nothing because the
    waits for user code before it used up the shared deadline."""
    return None if until is None else max(until, time.monotonic() + grace)
