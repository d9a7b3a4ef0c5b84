"""Blocking waits that Ctrl-C can end.

CPython runs a signal's Python handler (for SIGINT, the one that raises
``KeyboardInterrupt``) on the main thread, between bytecodes. A blocking wait on the
main thread is cut short by the signal only if the signal arrives *during* the wait's
system call; one that arrives just before it (the interpreter lock released, the call
not made yet) is handled only once the wait is over: for ``agent.wait_idle()`` without
a timeout, when the turn ends, however long the model takes (the window is narrow;
``_thread.interrupt_main()`` opens it at will, see tests/runtime/test_waiting.py).

:func:`wait` waits in slices of :data:`SLICE_S` on the main thread, so such a signal is
handled within one slice; elsewhere (threads never run signal handlers) it is a plain
``event.wait(timeout)``.
"""

from __future__ import annotations

import threading
import time
from typing import Final, Protocol

from actors import Idle, WaitTarget, waiting_for, waiting_on_actors
from storage import check_timeout

__all__ = ["SLICE_S", "Flag", "OnceFlag", "check_timeout", "wait"]

SLICE_S: Final = 0.1
"""The longest a Ctrl-C that just missed a wait's system call goes unhandled."""


class Flag(Protocol):
    """What :func:`wait` waits on: a ``threading.Event`` or a :class:`OnceFlag`."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class OnceFlag:
    """A flag set once, waited on like a ``threading.Event``, that builds its event only
    when someone waits before it is set. Every agent holds one (its disposal): an
    event (a condition, a lock and a deque) is ~1 KB, most of an idle agent's locks."""

    __slots__ = ("_event", "_set")

    _building: Final = threading.Lock()  # (for every flag: taken to set or to first wait)

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with OnceFlag._building:
            self._set = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        with OnceFlag._building:
            if self._set:
                return True
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        return event.wait(timeout)


def wait(
    event: Flag,
    timeout: float | None = None,
    *,
    idle: tuple[WaitTarget, str, Idle] | None = None,
) -> bool:
    """``event.wait(timeout)`` (True once set, False on timeout) that a signal handler
    raising on the main thread (Ctrl-C) interrupts within :data:`SLICE_S` seconds. On a
    dispatcher worker (a sync listener disposing of another agent, say) the dispatcher
    lends a worker while it waits (``actors.waiting_on_actors``). ``idle``: the event
    is set once that agent (its inbox, a label naming it, what else holds it) is idle
    or disposed; the wait raises ``WaitCycleError`` if it would close a cycle of waits
    (``actors.waiting_for``)."""
    if threading.current_thread() is not threading.main_thread():
        # (the main thread runs no actor or effect: no cycle of waits can go through it)
        waits = waiting_on_actors() if idle is None else waiting_for(*idle[:2], idle=idle[2])
        with waits:
            return event.wait(timeout)
    if timeout is not None and timeout <= SLICE_S:
        return event.wait(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
        if left <= 0:
            return event.is_set()
        if event.wait(left):
            return True
