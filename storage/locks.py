"""Taking a lock on a hot path without letting Ctrl-C leave it held.

A signal that lands while the main thread waits in ``lock.acquire()`` is raised as
soon as the acquire returns, before the ``try`` whose ``finally`` would release it, and
the lock stays held for good (tests/reliability/test_ctrl_c.py shows it for each lock
below). ``with lock:`` is safe (it takes the lock where the exception already releases
it) but costs ~130 ns a call more than ``acquire()`` and ``try``: ~3 µs a turn over a
turn's appends. The hot paths therefore take the lock without waiting and, only when
it is busy, wait in :func:`wait_until_free`, safely, then try again::

    while not lock.acquire(False):
        wait_until_free(lock)
    try:
        ...
    finally:
        lock.release()

A signal raised in the wait leaves the lock as it was; one that arrives after it is
raised at the loop's jump back, before the next try to take the lock.
"""

from __future__ import annotations

from typing import Any

__all__ = ["wait_until_free"]


def wait_until_free(lock: Any) -> None:
    """Block until ``lock`` can be taken (take it and let it go at once)."""
    with lock:
        pass
