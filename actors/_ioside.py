"""The I/O side: one asyncio loop thread plus a bounded pool for blocking callables.

Actors never wait on the outside world. They start an *effect* here and get its
result back as a message (:meth:`IoSide.start_for`) or through a callback
(:meth:`IoSide.start`). Every effect reports exactly once with an :class:`Outcome`.
"""

from __future__ import annotations

import asyncio
import logging
import selectors
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from itertools import count
from typing import Any, Generic, ParamSpec, TypeVar

from pykka import ActorDeadError, ActorRef

from actors._deadletters import DeadLetters
from actors._dispatcher import LoopHandoff, mark_thread_io_loop
from actors._pool import BlockingPool
from actors.errors import IoSideClosedError, MailboxFullError
from storage import start_thread

from ._deadline import deadline, extended, remaining

__all__ = [
    "BlockingWork",
    "EffectCompleted",
    "EffectHandle",
    "IoSide",
    "IoStatistics",
    "Outcome",
    "Work",
    "blocking",
]

logger = logging.getLogger("corral.io")

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """How an effect ended. ``cancelled`` may come with the value or error of a
    blocking body that could not be interrupted and ran to its end."""

    effect_id: int
    value: T | None = None
    error: BaseException | None = None
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class EffectCompleted:
    """The message :meth:`IoSide.start_for` delivers to the actor that started an effect."""

    effect_id: int
    tag: str
    value: object
    error: BaseException | None
    cancelled: bool


@dataclass(frozen=True, slots=True)
class BlockingWork(Generic[T]):
    """Marks a plain callable to run in the blocking pool rather than on the loop."""

    fn: Callable[[], T]


def blocking(fn: Callable[[], T]) -> BlockingWork[T]:
    """Mark ``fn`` as blocking work for :meth:`IoSide.start` / :meth:`IoSide.start_for`."""
    return BlockingWork(fn)


Work = Callable[[], Awaitable[T]] | BlockingWork[T]
"""A zero-argument callable returning an awaitable (runs on the loop), or blocking work."""


class EffectHandle(Generic[T]):
    """A started effect. ``cancel()`` is thread-safe and idempotent.

    A coroutine effect gets ``asyncio.CancelledError`` at its current ``await`` and
    reports ``cancelled=True`` (or its value, if it finished first). A blocking
    effect cancelled before it starts never runs; once started its body cannot be
    interrupted, so it reports ``cancelled=True`` when the function returns.
    """

    __slots__ = (
        "_cancel_requested",
        "_done_event",
        "_io",
        "_lock",
        "_on_done",
        "_outcome",
        "_task",
        "effect_id",
        "is_blocking",
        "is_listener",
    )

    def __init__(
        self,
        effect_id: int,
        io: IoSide,
        on_done: Callable[[Outcome[T]], None],
        *,
        is_blocking: bool,
        is_listener: bool = False,
    ) -> None:
        self.effect_id = effect_id
        self.is_blocking = is_blocking
        self.is_listener = is_listener
        self._io = io
        self._on_done = on_done
        self._lock = threading.Lock()
        self._cancel_requested = False
        self._outcome: Outcome[T] | None = None  # Invariant: set once, under _lock
        self._done_event: threading.Event | None = None
        self._task: asyncio.Future[T] | None = None  # Invariant: only touched on the loop

    def __repr__(self) -> str:
        return f"<EffectHandle {self.effect_id} done={self.done()}>"

    @property
    def cancel_requested(self) -> bool:
        return self._cancel_requested

    def done(self) -> bool:
        return self._outcome is not None

    @property
    def outcome(self) -> Outcome[T] | None:
        return self._outcome

    def cancel(self) -> None:
        with self._lock:
            if self._cancel_requested or self._outcome is not None:
                return
            self._cancel_requested = True
        if not self.is_blocking:
            self._io._cancel_task(self)

    def wait(self, timeout: float | None = None) -> Outcome[T]:
        """Block until the effect reported; ``TimeoutError`` after ``timeout`` seconds."""
        with self._lock:
            if self._outcome is not None:
                return self._outcome
            if self._done_event is None:
                self._done_event = threading.Event()
            event = self._done_event
        if not event.wait(timeout):
            raise TimeoutError(f"effect {self.effect_id} did not finish within {timeout} s")
        outcome = self.outcome  # a property read: set by _finish before the event
        assert outcome is not None
        return outcome

    def _finish(self, outcome: Outcome[T]) -> None:
        with self._lock:
            if self._outcome is not None:
                return
            self._outcome = outcome
            event = self._done_event
        if event is not None:
            event.set()
        self._io._forget(self)
        try:
            self._on_done(outcome)
        except Exception:
            logger.exception("on_done callback of effect %d failed", self.effect_id)


@dataclass(frozen=True, slots=True)
class IoStatistics:
    in_flight: int
    blocking_workers: int
    started: int
    closed: bool
    abandoned_blocking: int  # blocking calls still running that their callers gave up on


class _HandoffSelector(selectors.DefaultSelector):
    """The loop's selector, handing what the pass made runnable to the dispatchers before
    it waits (see :class:`~actors._dispatcher.LoopHandoff`)."""

    def __init__(self, handoff: LoopHandoff) -> None:
        super().__init__()
        self._handoff = handoff

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self._handoff.pending:
            self._handoff.flush()
        return super().select(timeout)


def _new_loop(handoff: LoopHandoff | None) -> asyncio.AbstractEventLoop:
    """The I/O side's loop: a selector loop with the hand-off (None: the platform's
    default loop, Windows' proactor, which has no selector to hand off before)."""
    if handoff is None:
        return asyncio.new_event_loop()
    return asyncio.SelectorEventLoop(_HandoffSelector(handoff))


class IoSide:
    """One asyncio event loop in a daemon thread plus a bounded blocking pool.

    Use as a context manager or call :meth:`close`. ``dead_letters`` receives
    completions whose actor has stopped (pass the dispatcher's sink to share it).
    """

    def __init__(
        self,
        *,
        blocking_workers: int = 32,
        name: str = "corral-io",
        dead_letters: DeadLetters | None = None,
    ) -> None:
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self.blocking_workers = blocking_workers
        self.blocking_pool = BlockingPool(blocking_workers, f"{name}-pool")
        self._handoff = None if sys.platform == "win32" else LoopHandoff()
        self.loop = _new_loop(self._handoff)
        self._ids = count(1)
        self._lock = threading.Lock()
        self._closed = False  # Invariant: once True under _lock, no effect is admitted
        self._in_flight: dict[int, EffectHandle[Any]] = {}
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run_loop, args=(ready,), name=f"{name}-loop", daemon=True
        )
        try:
            start_thread(self._thread)
            ready.wait()
        except BaseException:  # (can't start new thread, a Ctrl-C): nothing is left running
            self._undo_start()
            raise

    def _undo_start(self) -> None:
        """Let go of what an ``__init__`` that failed (or was interrupted) started: the
        loop's thread if it started (it closes the loop as it ends), else the loop's
        descriptors; and the blocking pool (no thread of it ran yet)."""
        self._closed = True
        if self._thread.ident is not None:
            # Stops run_forever() whether it runs already or not yet (then at once).
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        else:
            self.loop.close()
        self.blocking_pool.shutdown(wait=False)

    def __enter__(self) -> IoSide:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    # -- effects ---------------------------------------------------------------------

    def start(
        self,
        work: Work[T],
        *,
        on_done: Callable[[Outcome[T]], None],
        listener: bool = False,
    ) -> EffectHandle[T]:
        """Start ``work`` and call ``on_done(outcome)`` exactly once when it ends.

        ``on_done`` runs on the loop thread (coroutine work) or on a pool thread
        (blocking work); it must be quick. Raises ``IoSideClosedError`` after close.
        ``listener``: the work is an emitted event's async listener, which :meth:`close`
        lets finish within its timeout instead of cancelling it at once.
        """
        handle: EffectHandle[T] = EffectHandle(
            next(self._ids),
            self,
            on_done,
            is_blocking=isinstance(work, BlockingWork),
            is_listener=listener,
        )
        with self._lock:
            if self._closed:
                raise IoSideClosedError
            self._in_flight[handle.effect_id] = handle
        try:
            if isinstance(work, BlockingWork):
                self.blocking_pool.call(self._run_blocking, handle, work.fn)
            else:
                self.loop.call_soon_threadsafe(self._spawn, handle, work)
        except RuntimeError as error:  # the pool or loop closed under us
            self._forget(handle)
            raise IoSideClosedError from error
        return handle

    def start_blocking(
        self, fn: Callable[[], T], *, on_done: Callable[[Outcome[T]], None]
    ) -> EffectHandle[T]:
        """Run a blocking callable in the pool; see :meth:`start`."""
        return self.start(BlockingWork(fn), on_done=on_done)

    def call_blocking(self, fn: Callable[..., object], /, *args: object) -> None:
        """Run ``fn(*args)`` in the blocking pool with no :class:`EffectHandle`: ``fn``
        reports its own outcome (what it returns is dropped, what it raises is logged).
        For the hottest blocking work (a sync tool body with no ``tools/execute``
        listener and no timeout), whose handle, outcome and completion callback cost
        more than the body. What a handle gives :meth:`close` is ``fn``'s to do: once
        :attr:`closed` (read it on the pool thread before the work starts), work not
        started yet must not start. Such work is not counted in
        :attr:`IoStatistics.in_flight`; :meth:`close` waits for it as for every
        pool callable. Raises ``IoSideClosedError`` after close."""
        if self._closed:
            raise IoSideClosedError
        try:
            self.blocking_pool.call(fn, *args)
        except RuntimeError as error:  # the pool shut down under us
            raise IoSideClosedError from error

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has begun (no effect is admitted any more)."""
        return self._closed

    def start_for(self, actor_ref: ActorRef[Any], work: Work[T], *, tag: str) -> EffectHandle[T]:
        """Start ``work`` and ``tell`` its :class:`EffectCompleted` to ``actor_ref``.

        If the actor stopped meanwhile (or its bounded mailbox refuses), the
        completion is recorded in ``dead_letters`` instead of raising on the loop.
        """

        def deliver(outcome: Outcome[T]) -> None:
            message = EffectCompleted(
                effect_id=outcome.effect_id,
                tag=tag,
                value=outcome.value,
                error=outcome.error,
                cancelled=outcome.cancelled,
            )
            try:
                actor_ref.tell(message)
            except ActorDeadError:
                self.dead_letters.record(str(actor_ref), message, "effect ended after actor stop")
            except MailboxFullError:
                logger.exception("completion of effect %d refused: mailbox full", message.effect_id)
                self.dead_letters.record(str(actor_ref), message, "mailbox full")

        return self.start(work, on_done=deliver)

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the loop thread soon (thread-safe)."""
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError as error:
            raise IoSideClosedError from error

    def statistics(self) -> IoStatistics:
        return IoStatistics(
            in_flight=len(self._in_flight),
            blocking_workers=self.blocking_workers,
            started=next(self._ids) - 1,
            closed=self._closed,
            abandoned_blocking=self.blocking_pool.abandoned,
        )

    # -- lifecycle -------------------------------------------------------------------

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop loop and pool within ``timeout`` seconds in all (None: no limit).

        Listener work (``start(..., listener=True)``: the async listeners of emitted
        events, started or still to start) is let finish first, within the timeout;
        every other effect in flight (model streams, tool bodies, deferred chains) is
        cancelled at once. At the timeout the listener calls not finished are cancelled
        (those not started yet never run), and a warning says how many. Work started
        after close began is refused (``IoSideClosedError``).

        Running blocking bodies cannot be interrupted: close waits for them until the
        timeout, then leaves them running (logged as a warning): their threads end when
        their bodies return, and what those report then goes nowhere or to dead letters.
        Once the timeout has run out, cancelled tasks and the loop thread still get a
        moment (``GRACE_S`` each) to end.
        """
        if self.in_loop_thread():
            raise RuntimeError("IoSide.close() cannot run on its own loop thread")
        until = deadline(timeout)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._in_flight.values())
        listeners = [handle for handle in pending if handle.is_listener]
        for handle in pending:
            if not handle.is_listener:
                handle.cancel()
        late = self._finish_listeners(listeners, until)
        drain = asyncio.run_coroutine_threadsafe(self._drain_tasks(), self.loop)
        try:  # cancelled tasks unwind in a moment, even when the time has run out
            drain.result(remaining(extended(until)))
        except TimeoutError:
            logger.warning("I/O side closed with coroutine effects still running")
        # Those that finished before their cancel landed are not counted.
        late = [h for h in late if h.outcome is None or h.outcome.cancelled]
        if late:
            logger.warning(
                "I/O side closed with %d async listener call%s not finished after %s s: "
                "cancelled (or dropped, not started yet)",
                len(late),
                "" if len(late) == 1 else "s",
                timeout,
            )
        self.blocking_pool.shutdown(wait=False)
        running = self.blocking_pool.wait_idle(remaining(until))
        if running:
            logger.warning(
                "I/O side closed with %d blocking call%s (tool bodies, sync listeners) not "
                "finished after %s s: their pool threads cannot be stopped and are left "
                "to end when the calls return",
                running,
                "" if running == 1 else "s",
                timeout,
            )
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(remaining(extended(until)))

    @staticmethod
    def _finish_listeners(
        listeners: list[EffectHandle[Any]], until: float | None
    ) -> list[EffectHandle[Any]]:
        """Wait for listener work until ``until``, then cancel what is left (returned)."""
        for handle in listeners:
            try:
                handle.wait(remaining(until))
            except TimeoutError:
                break
        late = [handle for handle in listeners if not handle.done()]
        for handle in late:
            handle.cancel()
        return late

    # -- internals -------------------------------------------------------------------

    def _run_loop(self, ready: threading.Event) -> None:
        mark_thread_io_loop(self._handoff)
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        try:
            self.loop.run_forever()
        finally:
            try:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.close()
            finally:
                if self._handoff is not None:
                    self._handoff.flush()  # what the last pass made runnable
                mark_thread_io_loop(None)

    async def _drain_tasks(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks(self.loop) if t is not current]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _forget(self, handle: EffectHandle[Any]) -> None:
        with self._lock:
            self._in_flight.pop(handle.effect_id, None)

    def _spawn(self, handle: EffectHandle[T], work: Callable[[], Awaitable[T]]) -> None:
        if handle.cancel_requested:
            handle._finish(Outcome(handle.effect_id, cancelled=True))
            return
        try:
            task: asyncio.Future[T] = asyncio.ensure_future(_contained(work), loop=self.loop)
        except Exception as error:  # noqa: BLE001 - reported as the effect's outcome
            handle._finish(Outcome(handle.effect_id, error=error))
            return
        handle._task = task
        task.add_done_callback(lambda t: self._task_done(handle, t))

    @staticmethod
    def _task_done(handle: EffectHandle[T], task: asyncio.Future[T]) -> None:
        if task.cancelled():
            outcome: Outcome[T] = Outcome(handle.effect_id, cancelled=True)
        elif (error := task.exception()) is not None:
            outcome = Outcome(handle.effect_id, error=error)
        else:
            outcome = Outcome(handle.effect_id, value=task.result())
        handle._finish(outcome)

    def _cancel_task(self, handle: EffectHandle[Any]) -> None:
        def cancel_on_loop() -> None:
            task = handle._task
            if task is not None and not task.done():
                task.cancel()
            # No task yet: _spawn runs after this on the loop and sees the flag.

        if self.in_loop_thread():
            cancel_on_loop()
            return
        try:
            self.loop.call_soon_threadsafe(cancel_on_loop)
        except RuntimeError:
            logger.debug("effect %d cancelled after the loop closed", handle.effect_id)

    @staticmethod
    def _run_blocking(handle: EffectHandle[T], fn: Callable[[], T]) -> None:
        if handle.cancel_requested:
            handle._finish(Outcome(handle.effect_id, cancelled=True))
            return
        try:
            value = fn()
        except BaseException as error:  # noqa: BLE001 - reported, never lost in the pool
            outcome: Outcome[T] = Outcome(
                handle.effect_id, error=error, cancelled=handle.cancel_requested
            )
        else:
            outcome = Outcome(handle.effect_id, value=value, cancelled=handle.cancel_requested)
        handle._finish(outcome)


async def _contained(work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work``; a ``SystemExit`` it raises becomes its failure. Raised inside an
    asyncio task, SystemExit propagates out of the event loop and ends the I/O thread
    (every model stream, async tool and async listener of the runtime with it)."""
    try:
        return await work()
    except SystemExit as exit_:
        raise RuntimeError(f"the work raised SystemExit({exit_.code!r})") from exit_
