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
from typing import Final

from actors import Idle, WaitTarget, waiting_for, waiting_on_actors
from storage import check_timeout

__all__ = ["SLICE_S", "check_timeout", "wait"]

SLICE_S: Final = 0.1
"""The longest a Ctrl-C that just missed a wait's system call goes unhandled."""


def wait(
    event: threading.Event,
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
