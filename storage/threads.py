"""Starting a thread without letting Ctrl-C hide that it started.

``Thread.start()`` launches the thread, then waits for it to signal that it runs. A
signal that lands in that wait raises ``KeyboardInterrupt`` from ``start()`` although
the thread *did* start: code that counts a thread as started once ``start()`` returned
then never stops it (a rollback that joins "the threads started so far" leaks it).
:func:`start_thread` finishes that wait before it raises, so that a caller can tell
from ``thread.ident`` (or ``is_alive()``) whether the thread runs, and ``join()`` it.
"""

from __future__ import annotations

import threading

__all__ = ["start_thread"]


def start_thread(thread: threading.Thread) -> None:
    """``thread.start()``; if that raises, the thread either never started (``ident``
    is None) or has started (``ident`` set, ``join()`` works): decide by ``ident``."""
    try:
        thread.start()
    except BaseException:
        # Interrupted in start()'s wait: the thread was launched (it is in threading's
        # "limbo" until it runs). Wait for it to run, so the caller can stop it.
        started = getattr(thread, "_started", None)  # CPython's Event that start() waits on
        launched = thread.ident is not None or thread in threading.enumerate()
        if launched and isinstance(started, threading.Event):
            started.wait()
        raise
