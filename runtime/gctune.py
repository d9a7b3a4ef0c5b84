"""Garbage-collector thresholds for a process that hosts many agents.

A runtime keeps every agent's session log in memory and allocates many short-lived
objects per turn (coroutine frames, envelopes, closures). CPython's default thresholds
(700, 10, 10) then spend a large share of each turn in young-generation collections that
rescan the same surviving log objects; ``bench_turns`` measures 20-30% more turns/s with
the thresholds below. Reference counting still frees acyclic garbage at once: only the
cadence of cycle collection changes.

The setting is process-wide, so it is reference-counted across runtimes: the first
runtime that asks raises the thresholds, the last one to close restores what was there.

A batch spawn (``rt.spawn_many``) makes ~100 long-lived container objects an agent and
no garbage worth a collection, yet every young-generation pass during it scans the
agents made since the last one, and each generation-1 pass (one every ~30,000 agents)
rescans them all again: ~30% of a 100,000-agent spawn's CPU. :func:`collection_paused`
holds automatic collection off for one batch and then moves what survived straight into
the oldest generation (``gc.freeze()`` then ``gc.unfreeze()``: two list splices, no
scan), where only a full collection looks at it, as it would have after two passes.
Cyclic garbage other threads made during the batch is collected by the next full
collection instead of the next young one.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

__all__ = ["GC_THRESHOLDS", "collection_paused", "release_gc_tuning", "tune_gc"]

GC_THRESHOLDS: Final = (50_000, 50, 1_000)


class _Tuner:
    """The process-wide state: the collector is process-wide too."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.saved: tuple[int, int, int] | None = None
        self.pausing = 0
        """Batches under way in :func:`collection_paused`."""
        self.resume = False
        """Whether the last batch to end re-enables collection (it was enabled when the
        first one began: a caller that disabled it keeps it disabled)."""


_tuner = _Tuner()


def tune_gc() -> None:
    """Raise the collector thresholds (never lowers a threshold that is already higher)."""
    with _tuner.lock:
        _tuner.users += 1
        if _tuner.users == 1:
            current = gc.get_threshold()
            _tuner.saved = (current[0], current[1], current[2])
            raised = (max(a, b) for a, b in zip(current, GC_THRESHOLDS, strict=True))
            gc.set_threshold(*raised)


def release_gc_tuning() -> None:
    """Undo one :func:`tune_gc`; the last release restores the saved thresholds."""
    with _tuner.lock:
        if _tuner.users == 0:
            return
        _tuner.users -= 1
        if _tuner.users == 0 and _tuner.saved is not None:
            gc.set_threshold(*_tuner.saved)
            _tuner.saved = None


@contextmanager
def collection_paused() -> Iterator[None]:
    """No automatic collection while the block runs (in any thread, while any such
    block runs); when the last one ends, every object that survived is moved into the
    oldest generation unscanned and collection is enabled again, if it was before."""
    with _tuner.lock:
        _tuner.pausing += 1
        if _tuner.pausing == 1:
            _tuner.resume = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _tuner.lock:
            _tuner.pausing -= 1
            if _tuner.pausing == 0:
                gc.freeze()  # every tracked object into the permanent generation,
                gc.unfreeze()  # and from there into the oldest one: no pass rescans them
                if _tuner.resume:
                    gc.enable()
