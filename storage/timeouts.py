"""The one check of a ``timeout`` argument, shared by every layer's blocking calls."""

from __future__ import annotations

import math

__all__ = ["check_timeout"]


def check_timeout(timeout: object) -> float | None:
    """A verb's ``timeout``, checked before the verb does anything: None (wait as long
    as it takes) or a number of seconds >= 0; ``inf`` is None (a wait that long
    overflows the platform's clock). ``TypeError`` for anything that is not a number
    (a bool, a str, NaN), ``ValueError`` for a negative one."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout):
        raise TypeError(f"timeout is a number of seconds or None, got {timeout!r}")
    if timeout < 0:
        raise ValueError(f"timeout is a number of seconds >= 0 or None, got {timeout!r}")
    return None if timeout == math.inf else timeout
