"""The dispatcher: a small pool of worker threads that run many actors.

A worker takes one schedulable (an actor's mailbox) off a FIFO run queue and
lets it handle a batch of at most ``throughput`` messages; if the actor has more,
it goes to the back of the run queue, so one busy actor cannot starve the others.
The mailbox, not the dispatcher, guarantees that an actor is never on the run
queue twice (see ``actors._mailbox.Mailbox``).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import count
from typing import Any, ClassVar, ParamSpec, Protocol, TypeVar

from actors._deadletters import DeadLetters
from actors.errors import DispatcherShutdownError
from storage import start_thread

from ._deadline import deadline, remaining

__all__ = [
    "Dispatcher",
    "DispatcherStatistics",
    "LendingLock",
    "LoopHandoff",
    "Schedulable",
    "in_io_loop_thread",
    "in_nonblocking_thread",
    "in_runtime_thread",
    "loop_handoff",
    "mark_thread_blocking_pool",
    "mark_thread_io_loop",
    "mark_thread_nonblocking",
    "offer_rest",
    "rest_offered",
    "waiting_on_actors",
    "work_for",
    "working_for",
]

logger = logging.getLogger("corral.actors")

_thread_role = threading.local()


def mark_thread_nonblocking() -> None:
    """Mark the calling thread as one that must never block (a worker, the I/O loop).

    Code that would otherwise wait (a ``"block"`` mailbox overflow) fails fast instead.
    """
    _thread_role.nonblocking = True


def in_nonblocking_thread() -> bool:
    """True on a dispatcher worker, the I/O loop thread or the scheduler thread."""
    return getattr(_thread_role, "nonblocking", False)


def mark_thread_io_loop(handoff: LoopHandoff | None = None) -> None:
    """Mark the calling thread as an I/O side's event loop thread (nonblocking too);
    ``handoff``: where :func:`loop_handoff` finds the loop's :class:`LoopHandoff`."""
    _thread_role.nonblocking = True
    _thread_role.io_loop = True
    _thread_role.handoff = handoff


def loop_handoff() -> LoopHandoff | None:
    """The calling I/O loop thread's :class:`LoopHandoff` (None on any other thread)."""
    return getattr(_thread_role, "handoff", None)


class LoopHandoff:
    """Run-queue puts made on an I/O loop thread, handed to their dispatchers together
    just before the loop next waits for I/O (:meth:`flush`, called by the loop's
    selector), one run-queue item a dispatcher.

    At realistic streaming rates one pass of the loop reads a chunk from each of several
    connections, and each chunk made an agent runnable: put one by one, each woke a
    dispatcher worker, which took the GIL from the loop thread in the middle of its pass
    (its next ``recv`` released it), so every read paid two GIL handoffs. Handed over at
    the end of the pass, the worker wakes once and runs them all. Only the loop thread
    touches it; what it holds is put before the loop sleeps, so nothing waits longer
    than the rest of one pass."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[tuple[Dispatcher, Schedulable]] = []

    def schedule(self, dispatcher: Dispatcher, runnable: Schedulable) -> None:
        self.pending.append((dispatcher, runnable))

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        if len(pending) == 1:
            dispatcher, runnable = pending[0]
            dispatcher._run_queue.put(runnable)
            return
        by_dispatcher: dict[Dispatcher, list[Schedulable]] = {}
        for dispatcher, runnable in pending:
            by_dispatcher.setdefault(dispatcher, []).append(runnable)
        for dispatcher, runnables in by_dispatcher.items():
            queue_ = dispatcher._run_queue
            queue_.put(runnables[0] if len(runnables) == 1 else _Together(runnables, queue_))


class _Together:
    """Runnables handed over at once (see :class:`LoopHandoff`): one worker runs a batch
    of each, in order; one with more to do goes back on the run queue on its own."""

    __slots__ = ("queue", "runnables")

    def __init__(self, runnables: list[Schedulable], queue_: queue.SimpleQueue[Any]) -> None:
        self.runnables = runnables
        self.queue = queue_

    def run_batch(self, throughput: int) -> tuple[int, bool]:
        handled = 0
        for runnable in self.runnables:
            try:
                done, more = runnable.run_batch(throughput)
            except Exception:
                # A mailbox contains every actor failure itself; reaching here is a bug,
                # and the others must run all the same.
                logger.exception("internal error while running %r", runnable)
                continue
            handled += done
            if more:
                self.queue.put(runnable)
        return handled, False


def in_io_loop_thread() -> bool:
    """True on an I/O side's event loop thread: async listeners, async tool bodies and
    model streams run there, so a blocking wait there stalls every agent of its runtime."""
    return getattr(_thread_role, "io_loop", False)


def mark_thread_blocking_pool() -> None:
    """Mark the calling thread as a thread of an I/O side's blocking pool (sync tool
    bodies, sync listeners run off the dispatcher). It may block, but the runtime waits
    for it when it closes."""
    _thread_role.pool = True


def in_runtime_thread() -> bool:
    """True on any thread a runtime owns: a dispatcher worker, the scheduler, the I/O
    loop or a thread of its blocking pool."""
    role = _thread_role
    return getattr(role, "nonblocking", False) or getattr(role, "pool", False)


def offer_rest(rest: Callable[[], None] | None) -> Callable[[], None] | None:
    """Say that the caller runs a batch of several actors' work, one after the other
    (a flush outcome calling back each agent it covers), and that ``rest()`` puts the
    part of it not begun yet back on the run queue: a wait on this thread
    (:func:`waiting_on_actors`) first hands that part off, so that an actor waited for
    does not wait behind the waiter. Returns the previous offer (to restore)."""
    role = _thread_role
    previous: Callable[[], None] | None = getattr(role, "rest", None)
    role.rest = rest
    return previous


def rest_offered() -> Callable[[], None] | None:
    """The rest offered on this thread (see :func:`offer_rest`); None once a wait took it."""
    return getattr(_thread_role, "rest", None)


@contextmanager
def waiting_on_actors() -> Iterator[None]:
    """Around a wait that needs other actors to run (an ask, a future's ``get``): on a
    dispatcher's worker, the dispatcher lends a worker for as long as the wait lasts, so
    that a pool of one or two threads whose workers all wait on actors (sync listeners
    that each spawn an agent, say) still runs them. Anywhere else it does nothing.
    First, the rest of a batch that the thread runs for other actors is handed off
    (see :func:`offer_rest`): one of them may be the actor waited for."""
    rest = getattr(_thread_role, "rest", None)
    if rest is not None:
        _thread_role.rest = None
        rest()
    dispatcher: Dispatcher | None = getattr(_thread_role, "dispatcher", None)
    if dispatcher is None:
        yield
        return
    dispatcher._lend()
    try:
        yield
    finally:
        dispatcher._take_back()


class LendingLock:
    """A re-entrant lock whose waiter lends its dispatcher worker while it waits (see
    :func:`waiting_on_actors`): for a lock whose holder may itself wait for actors (an
    agent's live lock, which a passivation holds while it asks the agent's actor), so
    that a sync listener blocked on it does not keep the actor waited for from a
    worker. Uncontended, it costs what an ``RLock`` does."""

    __slots__ = ("_lock", "on_contention")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        # Called by a thread about to block on the lock: a holder that waits for
        # something it may give up on (a passivation) sets it, to yield to the waiter.
        self.on_contention: Callable[[], None] | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """``RLock.acquire``, lending the worker while it blocks."""
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        contention = self.on_contention
        if contention is not None:
            contention()
        with waiting_on_actors():
            return self._lock.acquire(True, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self._lock.release()


P = ParamSpec("P")
T = TypeVar("T")

# The agent (its inbox, as a token) an effect runs for. The agent actor starts its tool
# executions and deferred listener chains inside ``work_for``; the I/O loop's tasks
# copy the context they were started in, and the blocking pool runs each callable in a
# copy of its submitter's context (as ``asyncio.to_thread`` does), so the token follows
# the work wherever it runs: a sync tool body, a tools/execute listener, a sync listener
# of a deferred chain, a thread an async body started with ``asyncio.to_thread``.
_working_for: ContextVar[object | None] = ContextVar("corral_working_for", default=None)


def work_for(owner: object, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` with :func:`working_for` answering ``owner`` in what it
    starts (tasks, pool work)."""
    token = _working_for.set(owner)
    try:
        return fn(*args, **kwargs)
    finally:
        _working_for.reset(token)


def working_for() -> object | None:
    """The owner token of the agent whose effect the caller runs (see :func:`work_for`),
    or None."""
    return _working_for.get()


class Schedulable(Protocol):
    """What a dispatcher runs: a mailbox that handles a batch of its actor's messages."""

    def run_batch(self, throughput: int) -> tuple[int, bool]:
        """Handle up to ``throughput`` messages; return (handled, has_more)."""
        ...


@dataclass(frozen=True, slots=True)
class DispatcherStatistics:
    name: str
    workers: int  # every worker thread, standby and lent ones included
    standby: int
    throughput: int
    run_queue_depth: int
    batches: int
    messages: int
    dead_letters: int
    shut_down: bool


_SHUTDOWN = None


class _Retire:
    """A run queue marker: the worker that takes it ends (a lent worker's time is up)."""


_RETIRE = _Retire()
_names = count(1)


def default_worker_count() -> int:
    """Workers for the default dispatcher: one per core, at most four."""
    return max(1, min(4, os.cpu_count() or 1))


class Dispatcher:
    """A pool of worker threads running actor batches off one FIFO run queue.

    ``workers`` defaults to ``min(4, os.cpu_count())``. ``throughput`` is how many
    messages one actor may handle before it yields its worker. Workers are daemon
    threads: call :meth:`shutdown` to stop them; messages still queued then are
    not handled.

    ``standby`` workers take batches only while the others are stuck: when no worker
    finished a batch for ``stall_s`` seconds although work is queued (a handler blocked,
    e.g. a listener waiting on another actor), they run batches until a worker moves
    again. Under a GIL, one worker plus a standby one runs Python actors faster than two
    workers (no GIL contention between them) and still survives a blocking handler.

    A worker that waits on other actors inside :func:`waiting_on_actors` is lent a worker for
    the wait (a thread started for it, which ends once the wait is over and it takes
    the marker the wait leaves on the run queue), so such waits never take the whole
    pool however many there are at once.
    """

    _default: ClassVar[Dispatcher | None] = None
    _default_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        workers: int | None = None,
        *,
        throughput: int = 32,
        name: str | None = None,
        dead_letters: DeadLetters | None = None,
        standby: int = 0,
        stall_s: float = 0.005,
    ) -> None:
        size = default_worker_count() if workers is None else workers
        if size < 1:
            raise ValueError(f"a dispatcher needs at least one worker, got workers={size}")
        if standby < 0 or stall_s <= 0:
            raise ValueError(f"standby must be >= 0 and stall_s > 0, got {standby}, {stall_s}")
        if throughput < 1:
            raise ValueError(f"throughput must be at least 1, got {throughput}")
        self.name = name or f"corral-dispatcher-{next(_names)}"
        self.throughput = throughput
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self._run_queue: queue.SimpleQueue[Schedulable | _Retire | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False  # Invariant: set under _lock (read without it).
        self._stall_s = stall_s
        # Invariant: a slot is written only by the worker that holds it (exact counts
        # without a lock). Slots [size, size + standby) are the standby workers'; a lent
        # worker takes a free slot past them, and frees it when it ends.
        self._standby = range(size, size + standby)
        self._batches = [0] * (size + standby)
        self._messages = [0] * (size + standby)
        self._free_slots: list[int] = []  # Invariant: only changed under _lock.
        self._working = size  # Invariant: live non-standby workers; only under _lock.
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"{self.name}-{i}", daemon=True)
            for i in range(size)
        ]
        self._threads += [
            threading.Thread(
                target=self._stand_by, args=(i,), name=f"{self.name}-standby-{i}", daemon=True
            )
            for i in self._standby
        ]
        try:
            for thread in self._threads:
                start_thread(thread)
        except BaseException:  # (can't start new thread, a Ctrl-C): none is left running
            self._stop_started()
            raise

    def _stop_started(self) -> None:
        """Stop the workers that started (of a dispatcher whose next worker failed to
        start, or a Ctrl-C in a start: that thread did start); they have taken no work
        yet. Started is decided by ``ident``, not by ``start()`` having returned."""
        with self._lock:
            self._closed = True
        workers = self._threads[: len(self._threads) - len(self._standby)]
        for _ in (thread for thread in workers if thread.ident is not None):
            self._run_queue.put(_SHUTDOWN)  # standby workers see _closed within stall_s
        for thread in self._threads:
            if thread.ident is not None:
                thread.join()

    @classmethod
    def default(cls) -> Dispatcher:
        """The shared dispatcher used by actors that name none; created on first use."""
        current = cls._default
        if current is not None and not current._closed:
            return current
        with cls._default_lock:
            if cls._default is None or cls._default._closed:
                cls._default = cls(name="corral-dispatcher-default")
            return cls._default

    def __repr__(self) -> str:
        return f"<Dispatcher {self.name} workers={len(self._threads)}>"

    def schedule(self, runnable: Schedulable) -> None:
        """Put a runnable at the back of the run queue. Never blocks."""
        if self._closed:
            raise DispatcherShutdownError(self.name)
        self._run_queue.put(runnable)

    @property
    def is_shut_down(self) -> bool:
        return self._closed

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop the workers after the batches they are running; True if all joined."""
        with self._lock:
            self._closed = True
            working = self._working
            threads = list(self._threads)
        for _ in range(working):  # standby workers see _closed within stall_s
            self._run_queue.put(_SHUTDOWN)
        me = threading.current_thread()
        until = deadline(timeout)
        for thread in threads:
            if thread is me:
                continue
            thread.join(remaining(until))
        return not any(t.is_alive() for t in threads if t is not me)

    def statistics(self) -> DispatcherStatistics:
        with self._lock:
            workers = self._working + len(self._standby)
        return DispatcherStatistics(
            name=self.name,
            workers=workers,
            standby=len(self._standby),
            throughput=self.throughput,
            run_queue_depth=self._run_queue.qsize(),
            batches=sum(self._batches),
            messages=sum(self._messages),
            dead_letters=self.dead_letters.count,
            shut_down=self._closed,
        )

    # -- lending (see waiting_on_actors()) ------------------------------------------------------

    def _lend(self) -> None:
        """A worker of this dispatcher is about to wait on other actors: start a worker
        to stand in for it while it waits."""
        with self._lock:
            if self._closed:
                return
            if self._free_slots:
                index = self._free_slots.pop()
            else:
                index = len(self._batches)
                self._batches.append(0)
                self._messages.append(0)
            thread = threading.Thread(
                target=self._work, args=(index,), name=f"{self.name}-lent-{index}", daemon=True
            )
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            self._working += 1
            thread.start()

    def _take_back(self) -> None:
        """The wait is over: one worker (whichever takes the marker, after the work queued
        before it) ends, and the pool is its size again."""
        with self._lock:
            if self._closed:
                return
        self._run_queue.put(_RETIRE)

    def _end_worker(self, index: int) -> None:
        with self._lock:
            self._working -= 1
            self._free_slots.append(index)

    # -- workers ---------------------------------------------------------------------

    def _work(self, index: int) -> None:
        mark_thread_nonblocking()
        _thread_role.dispatcher = self
        run_queue = self._run_queue
        get, put, throughput = run_queue.get, run_queue.put, self.throughput
        batches, messages = self._batches, self._messages
        while True:
            runnable = get()
            if runnable is None:
                return
            if runnable is _RETIRE:
                self._end_worker(index)
                return
            try:  # _run, inline (one call less per batch)
                handled, more = runnable.run_batch(throughput)  # type: ignore[union-attr]
            except Exception:
                logger.exception("internal error while running %r", runnable)
                runnable = None
                continue
            batches[index] += 1
            messages[index] += handled
            if more:
                put(runnable)
            # Let go of it before waiting for the next: what a batch ran (a flush group's
            # outcome holds its members' sessions) must not stay alive while idle.
            runnable = None

    def _run(self, index: int, runnable: Schedulable) -> None:
        try:
            handled, more = runnable.run_batch(self.throughput)
        except Exception:
            # A mailbox contains every actor failure itself; reaching here is a bug, and
            # the worker must survive it.
            logger.exception("internal error while running %r", runnable)
            return
        self._batches[index] += 1
        self._messages[index] += handled
        if more:
            self._run_queue.put(runnable)

    def _working_batches(self) -> int:
        """Batches finished by every worker but the standby ones."""
        standby = self._standby
        return sum(n for i, n in enumerate(self._batches) if i not in standby)

    def _stand_by(self, index: int) -> None:
        """A standby worker: look every ``stall_s``; while the other workers finish no
        batch although work is queued, run batches too."""
        mark_thread_nonblocking()
        _thread_role.dispatcher = self
        run_queue, stall_s = self._run_queue, self._stall_s
        seen = -1
        while not self._closed:
            time.sleep(stall_s)  # a look every stall_s is all it costs while they run
            done = self._working_batches()
            if done != seen or run_queue.empty():
                seen = done
                continue
            while not self._closed and self._working_batches() == done:
                # Not get(timeout=stall_s): on CPython 3.11 a timed get that is woken for
                # an item another worker takes first, after its deadline, waits with a
                # negative timeout, i.e. until the next put; at shutdown there is none,
                # and Runtime.close waited its whole timeout for this thread (seen under
                # load: tests/cli/test_log.py, 1 run in 177).
                try:
                    runnable = run_queue.get_nowait()
                except queue.Empty:
                    time.sleep(stall_s)
                    continue
                if runnable is None:  # a shutdown marker meant for another worker
                    run_queue.put(runnable)
                    return
                if runnable is _RETIRE:  # meant for a working worker: a standby one stays
                    run_queue.put(runnable)
                    time.sleep(stall_s)
                    continue
                self._run(index, runnable)  # type: ignore[arg-type]
                runnable = None  # let go of it while idle (see _work)
            seen = self._working_batches()
