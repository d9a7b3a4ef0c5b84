"""Waking the threads that wait for a flush (:meth:`storage.lmdb.writer.LogWriter.flush`).

Blocking ``LogWriter.flush`` callers of one commit are woken in a chain, each by the
previous one as soon as it runs (see :class:`Waiter`; each waits on a pipe of its own,
:class:`_PipeGate`, up to :data:`_MAX_GATES` at once): woken all at once, dozens of
threads would queue for the GIL, and each would sleep and wake again on its way; woken
only when the previous one blocks again, each would wait out a whole thread wake-up
with the GIL idle. The writer then waits (at most its ``GATHER_S``) for the end of the
chain before it drains the next batch, so that threads that flush after every append
share one commit instead of splitting into small ones. It does not commit while the
chain still runs: that would overlap the commit's fsync (which releases the GIL) with
the chain, but the flushers then split into groups that take turns in alternate
commits, every commit carries fewer records, and the writer's Python work competes
with the chain for the GIL; measured with 64 threads flushing after every append, that
was slower, whether the writer went on from the middle of the chain or as soon as the
commit would overlap what was left of it.
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
from typing import Any, Final

from storage.records import FlushCallback

__all__ = ["SoloWaiter", "Spare", "Waiter", "call", "resolve", "spare", "wake"]

_log = logging.getLogger("storage.writer")  # the log writer's logger, as before the split


class Spare(threading.local):
    """This thread's idle waiter (``slot[0]``), reused by its next blocking flush: two
    locks less per flush; and how many of its blocking flushes wait (``slot[1]``: more
    than one when a signal handler flushes while the flush it interrupted waits). A
    list, so that a flush looks the thread's storage up once."""

    def __init__(self) -> None:
        self.slot: list[Any] = [None, 0]  # [Waiter | None, int]


spare: Final = Spare()


_MAX_GATES: Final = 128
_MAX_POLL_MS: Final = 2**31 - 1
"""The longest ``select.poll`` waits in one call."""


class _GateCount:
    """How many :class:`_PipeGate` objects are open (two file descriptors each)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0

    def take(self) -> bool:
        with self.lock:
            if self.open >= _MAX_GATES:
                return False
            self.open += 1
            return True

    def give_back(self) -> None:
        with self.lock:
            self.open -= 1


_gates: Final = _GateCount()


class _PipeGate:
    """A lock-shaped gate over a pipe: ``release`` writes a byte, ``acquire`` reads it.

    A blocking flush waits on one. The kernel wakes the reader of a pipe as a "sync"
    wake-up (the waker is about to sleep), which tends to run it on the waker's CPU: a
    thread woken in a chain then does not start on the other CPU while the waker still
    holds the GIL, sleep on the GIL and wake a second time (see benchmarks/README.md).
    Starts held; a release lets exactly one acquire through."""

    __slots__ = ("_read", "_write")

    def __init__(self, read: int, write: int) -> None:
        self._read = read
        self._write = write

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if timeout is not None and timeout >= 0:
            poller = select.poll()
            poller.register(self._read, select.POLLIN)
            # poll() takes a C int of milliseconds (~24.8 days): a longer wait polls
            # again until its deadline (a flush(timeout) may take up to TIMEOUT_MAX).
            until = time.monotonic() + timeout
            while not poller.poll(min(_MAX_POLL_MS, math.ceil(timeout * 1000))):
                timeout = until - time.monotonic()
                if timeout <= 0:
                    return False
        os.read(self._read, 1)
        return True

    def release(self) -> None:
        os.write(self._write, b"\0")

    def __del__(self) -> None:
        try:
            os.close(self._read)
            os.close(self._write)
            _gates.give_back()
        except Exception:  # noqa: BLE001, S110 - at interpreter exit the module may be gone
            pass


def _new_gate() -> Any:
    """A held gate for a waiter: a pipe while fewer than :data:`_MAX_GATES` are open,
    otherwise (or out of file descriptors) a lock, which does as well a little slower."""
    if _gates.take():
        try:
            read, write = os.pipe()
        except OSError:
            _gates.give_back()
        else:
            return _PipeGate(read, write)
    lock = threading.Lock()
    lock.acquire()
    return lock


class Waiter:
    """A blocking flush. Waiters resolved by one commit are linked (``next``) and woken
    in order, each by the previous one as soon as it runs, so that about one thread at
    a time wakes up for the GIL. A waiter that gives up (timeout, an exception such as
    KeyboardInterrupt) is skipped, or passes the turn on if it was woken meanwhile.
    A thread's next :meth:`LogWriter.flush` reuses its waiter if it was woken while
    waiting (see ``Spare``).
    """

    __slots__ = ("error", "gate", "gone", "guard", "next", "woken")

    def __init__(self) -> None:
        self.gate = _new_gate()  # held until woken
        self.guard = threading.Lock()  # orders a wake against giving up
        self.woken = False
        self.gone = False
        self.error: BaseException | None = None
        self.next: Waiter | None = None

    def __call__(self, error: BaseException | None) -> None:
        """Resolve this waiter alone (as any flush callback)."""
        self.error = error
        wake(self)

    def wait(self, timeout: float | None) -> bool:
        """Wait until woken (then wake the next waiter) or give up after ``timeout``;
        return whether woken."""
        woken = False
        try:
            woken = self.gate.acquire(timeout=-1 if timeout is None else timeout)
        finally:
            if woken:
                wake(self.next)
            else:
                woken = self.give_up()
        return woken

    def give_up(self) -> bool:
        """Leave the chain; return whether this waiter was woken meanwhile."""
        with self.guard:
            self.gone = True
            woken = self.woken
        if woken:
            wake(self.next)  # the rest of the chain waits for us to pass the turn on
        return woken


class SoloWaiter(Waiter):
    """A blocking flush that the writer wakes itself, as any other flush callback
    (:func:`_resolve` chains only plain :class:`Waiter` objects)."""

    __slots__ = ()


def wake(waiter: Waiter | None) -> None:
    """Wake the first waiter of the chain that still waits."""
    while waiter is not None:
        with waiter.guard:
            if not waiter.gone:
                waiter.woken = True
                waiter.gate.release()
                return
        waiter = waiter.next


def resolve(callbacks: list[FlushCallback], error: BaseException | None) -> Waiter | None:
    """Call every callback of a batch; chain its blocking waiters and wake the first.

    Returns a waiter at the end of the chain, woken once every waiter of the batch
    was (``None`` without waiters).
    """
    first: Waiter | None = None
    last: Waiter | None = None
    others: list[FlushCallback] = []
    for callback in callbacks:
        if type(callback) is Waiter:
            callback.error = error
            if last is None:
                first = callback
            else:
                last.next = callback
            last = callback
        else:
            others.append(callback)
    end = None
    if last is not None:
        end = last.next = Waiter()
    wake(first)
    for callback in others:
        try:  # as _call does, without a frame per callback
            callback(error)
        except Exception:  # noqa: BLE001 -- a caller's callback must not kill the writer
            _log.exception("a flush callback failed; the failure is contained")
    return end


def call(callback: FlushCallback, error: BaseException | None) -> None:
    try:
        callback(error)
    except Exception:  # noqa: BLE001 -- a caller's callback must not kill the writer
        _log.exception("a flush callback failed; the failure is contained")
