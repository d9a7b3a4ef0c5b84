"""What the bus tests share: running a Deferred chain the way an actor does."""

from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from actors import Deferred, IoSide, Ready

WAIT = 5.0
T = TypeVar("T")


def run_deferred(io: IoSide, result: Ready[T] | Deferred[T]) -> T:
    """What an actor does with a Deferred: run it on the I/O side, wait for the outcome."""
    assert isinstance(result, Deferred)
    outcome = io.start(result.run, on_done=lambda _o: None).wait(WAIT)
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[return-value]


def cast_run(result: Ready[T] | Deferred[T]) -> Callable[[], Awaitable[T]]:
    assert isinstance(result, Deferred)
    return result.run


class Abort(BaseException):
    """A BaseException of the application's own (what some libraries raise to unwind)."""


def on_worker(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread other than the main one, as the bus's callers run (an actor's
    dispatcher thread): its result, or what it raised."""
    box: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

    def run() -> None:
        try:
            box.put((True, fn()))
        except BaseException as err:
            box.put((False, err))

    threading.Thread(target=run, name="worker").start()
    ok, value = box.get(timeout=WAIT)
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def eventually(check: Callable[[], bool]) -> bool:
    """``check()`` once the loop has run what it had queued (a log written in a task)."""
    for _ in range(100):
        if check():
            return True
        threading.Event().wait(0.01)
    return check()
