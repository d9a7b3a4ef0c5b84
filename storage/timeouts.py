"""The one check of a ``timeout`` argument, shared by every layer's blocking calls."""

from __future__ import annotations

import math
import threading

__all__ = ["check_timeout"]


def check_timeout(timeout: object) -> float | None:
    """A verb's ``timeout``, checked before the verb does anything: None (wait as long
    as it takes) or a number of seconds >= 0; ``inf``, and any finite number of seconds
    from ``threading.TIMEOUT_MAX`` (~292 years on Linux) on, is None: a wait that long
    overflows the platform's clock (``OverflowError`` from deep inside the verb, after
    it acted). ``TypeError`` for anything that is not a number (a bool, a str, NaN),
    ``ValueError`` for a negative one."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout):
        raise TypeError(f"timeout is a number of seconds or None, got {timeout!r}")
    if timeout < 0:
        raise ValueError(f"timeout is a number of seconds >= 0 or None, got {timeout!r}")
    return None if timeout >= threading.TIMEOUT_MAX else timeout
