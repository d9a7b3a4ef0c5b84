"""The live event bus (CONTRACT section 8): ``emit``, ``serial``, ``parallel`` and ``waterfall``.

Listeners are plain functions or ``async def``. Sync listeners run inline in the
caller's thread; async listeners run on the I/O side's loop and never block a
dispatcher thread. A listener registered with ``scope=<agent id>`` only sees events
emitted with that scope; global listeners see every event of their name.
Registration order is kept across global and scoped listeners, except that a listener
registered with ``last=True`` comes after every listener registered without it (in a
waterfall: innermost, right above the default), whenever it was registered.

``serial`` and ``waterfall`` return :class:`Ready` when every listener involved is
sync (the chain already ran inline), or :class:`Deferred` when one is async: the
caller (an actor) then runs ``deferred.run()`` on the I/O side, e.g. with
``IoSide.start_for``, and gets the result back as a message.

With no listener for a name, all three cost one dict lookup.

A little over 500 lines, one piece: the four ways of calling listeners share one
registry (order, scope, ``last=``) and one way of containing a listener's failure.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from inspect import isawaitable
from itertools import count
from typing import Final, Generic, TypeVar, cast

import msgspec

from actors._host import Host
from actors._ioside import IoSide, Outcome
from actors.errors import IoSideClosedError, ListenerError
from actors.listeners import LAST, Entry, Listener, Topic

__all__ = ["Bus", "Deferred", "Listener", "Ready"]

logger = logging.getLogger("corral.bus")

# What the bottom of a waterfall (corral's own ``default``) may raise as its failure.
# A *listener's* failure is any exception at all (see `_interrupted` and `_ours`): a
# listener's `sys.exit()`, KeyboardInterrupt, asyncio.CancelledError or own
# BaseException subclass is a fault of that listener, not an exit of the process nor a
# cancel (it runs on a dispatcher or pool thread, or the I/O loop, where a BaseException
# would end the actor that ran it, and pykka's fatal path then stops every actor of the
# process, every runtime's included; or end the I/O loop's thread).
_FAULTS: Final = (Exception, SystemExit)

T = TypeVar("T")


class Ready(msgspec.Struct, Generic[T], frozen=True):
    """The chain ran inline; ``value`` is its result."""

    value: T


class Deferred(msgspec.Struct, Generic[T], frozen=True):
    """The chain has async listeners: ``run()`` returns an awaitable to run on the loop."""

    run: Callable[[], Awaitable[T]]


READY_NONE: Ready[None] = Ready(None)


def _interrupted(err: BaseException) -> bool:
    """Whether ``err``, raised by a call of a sync listener, is not that listener's failure
    but a Ctrl-C: a KeyboardInterrupt on the main thread, where Python delivers SIGINT
    (listeners run there only inline, in an emit the application made on that thread).
    On any other thread only the listener itself can have raised it."""
    return isinstance(err, KeyboardInterrupt) and threading.current_thread() is _MAIN_THREAD


_MAIN_THREAD: Final = threading.main_thread()


def _ours(err: BaseException) -> bool:
    """Whether ``err``, out of awaiting a listener on the loop, is corral's own doing
    rather than the listener's failure: the cancel of the task running the listener (a
    cancelled turn, a close: the task has a cancel request), or the close of a coroutine
    no task steps any more. A CancelledError a listener raised on its own, with no cancel
    requested, is that listener's failure."""
    task = asyncio.current_task()
    if task is None:
        return True
    return isinstance(err, asyncio.CancelledError) and task.cancelling() > 0


@contextmanager
def _failing_as(name: str, listener: Listener) -> Iterator[None]:
    """What the block raises, of whatever kind, raised as ``listener``'s
    ``ListenerError`` (an inner listener's passes through as is, and so does our own
    cancellation, see :func:`_ours`)."""
    try:
        yield
    except ListenerError:
        raise
    except BaseException as err:
        if _ours(err):
            raise
        raise ListenerError(name, listener, err) from err


async def _awaited(name: str, listener: Listener, awaitable: Awaitable[T]) -> T:
    """The value of ``awaitable``, what a listener not known as async returned; its failure
    raised as ``ListenerError``."""
    with _failing_as(name, listener):
        return await awaitable


async def _awaited_contained(name: str, listener: Listener, awaitable: object) -> None:
    """Await what a ``parallel`` listener returned; its failure logged and contained."""
    try:
        await cast(Awaitable[object], awaitable)
    except BaseException as err:
        if _ours(err):
            raise
        logger.exception("async listener %s for %r failed", _label(listener), name)


async def _emitted(name: str, listener: Listener, start: Callable[[], object]) -> None:
    """An emitted event's async listener (or the awaitable a sync-looking one returned):
    its failure, of whatever kind, is logged and contained."""
    try:
        await cast(Awaitable[object], start())
    except BaseException as err:
        if _ours(err):
            raise
        logger.exception("async listener %s for %r failed", _label(listener), name)


class Bus:
    """Named live events with emit / serial / waterfall dispatch."""

    def __init__(self, io: IoSide) -> None:
        self._io = io
        self._lock = threading.Lock()
        self._seq = count()
        # Invariant: a name is present only while it has at least one listener.
        self._topics: dict[str, Topic] = {}
        self.maybe_listened: Callable[[str], bool] = self._topics.__contains__
        """``maybe_listened(name)``: False when no listener of any scope has ``name`` (then
        an event of that name reaches nobody and its payload need not be built); True
        when one might. A C-level membership test, cheaper than :meth:`has_listeners`."""

    # -- registration ----------------------------------------------------------------

    def on(
        self, name: str, listener: Listener, *, scope: str | None = None, last: bool = False
    ) -> Callable[[], None]:
        """Register ``listener`` for ``name``; returns an idempotent disposer.

        ``last``: after every listener registered without it, those registered later
        included (in a waterfall: the innermost, called when every other one called
        ``next``); among themselves such listeners keep their registration order. For a
        default that every other listener may override, e.g. the runtime's retry policy.
        """
        entry = Entry(next(self._seq) + (LAST if last else 0), listener, scope)
        with self._lock:
            topic = self._topics.get(name)
            if topic is None:
                topic = Topic()
                topic.add(entry)
                self._topics[name] = topic
            else:
                topic.add(entry)
        disposed = False

        def dispose() -> None:
            nonlocal disposed
            with self._lock:
                if disposed:
                    return
                disposed = True
                current = self._topics.get(name)
                if current is None:
                    return
                current.remove(entry)
                if current.is_empty():
                    del self._topics[name]

        return dispose

    def has_listeners(self, name: str, *, scope: str | None = None) -> bool:
        topic = self._topics.get(name)
        return topic is not None and bool(topic.select(scope).entries)

    def listener_count(self, name: str, *, scope: str | None = None) -> int:
        topic = self._topics.get(name)
        return 0 if topic is None else len(topic.select(scope).entries)

    def listeners(self, name: str, *, scope: str | None = None) -> tuple[Listener, ...]:
        """The listeners an event of ``name`` with ``scope`` reaches, outermost first."""
        topic = self._topics.get(name)
        return () if topic is None else tuple(e.listener for e in topic.select(scope).entries)

    # -- emit ------------------------------------------------------------------------

    def emit(self, name: str, event: object, *, scope: str | None = None) -> None:
        """Call every listener; each failure is logged and contained, none can veto."""
        topic = self._topics.get(name)
        if topic is None:
            return
        for entry in topic.select(scope).entries:
            if entry.is_async:
                self._spawn(name, entry.listener, partial(entry.listener, event))
                continue
            try:
                result = entry.listener(event)
            except BaseException as err:
                if _interrupted(err):
                    raise
                logger.exception("listener %s for %r failed", _label(entry.listener), name)
                continue
            if result is not None and isawaitable(result):  # async after all: a lambda, say
                self._spawn(name, entry.listener, partial(_identity, result))

    def _spawn(self, name: str, listener: Listener, start: Callable[[], object]) -> None:
        def on_done(outcome: Outcome[object]) -> None:
            if outcome.error is not None:
                logger.error(
                    "async listener %s for %r failed",
                    _label(listener),
                    name,
                    exc_info=outcome.error,
                )

        try:
            self._io.start(  # listener=True: a close lets it finish within its timeout
                partial(_emitted, name, listener, start), on_done=on_done, listener=True
            )
        except IoSideClosedError:
            if isinstance(start, partial) and start.func is _identity:
                _discard(start.args[0])
            logger.warning(
                "async listener %s for %r dropped: I/O side closed", _label(listener), name
            )

    # -- serial ----------------------------------------------------------------------

    def serial(
        self, name: str, event: object, *, scope: str | None = None
    ) -> Ready[None] | Deferred[None]:
        """Run listeners one after another in registration order.

        Sync listeners before the first async one run inline; if there is an async
        one, the rest of the chain is returned as :class:`Deferred` (sync listeners
        in it run in the blocking pool). The first failure stops the chain and is
        raised as ``ListenerError`` (from the original error).
        """
        topic = self._topics.get(name)
        if topic is None:
            return READY_NONE
        entries = topic.select(scope).entries
        for index, entry in enumerate(entries):
            if entry.is_async:
                return Deferred(partial(self._serial_rest, name, entries[index:], event))
            try:
                result = entry.listener(event)
            except BaseException as err:
                if _interrupted(err):
                    raise
                raise ListenerError(name, entry.listener, err) from err
            if result is not None and isawaitable(result):  # async after all: awaited on the loop
                pending = partial(_awaited, name, entry.listener, result)
                return Deferred(
                    partial(self._serial_rest, name, entries[index + 1 :], event, pending)
                )
        return READY_NONE

    async def _serial_rest(
        self,
        name: str,
        entries: tuple[Entry, ...],
        event: object,
        pending: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """The chain from an async listener on, on the loop; ``pending`` awaits first what
        the sync-looking listener before ``entries`` returned."""
        if pending is not None:
            await pending()
        loop = asyncio.get_running_loop()
        for entry in entries:
            with _failing_as(name, entry.listener):
                if entry.is_async:
                    await cast(Awaitable[object], entry.listener(event))
                    continue
                # its failure wrapped on its thread: a future refuses StopIteration
                result = await loop.run_in_executor(
                    self._io.blocking_pool, _call_serial_sync, name, entry.listener, event
                )
            if result is not None and isawaitable(result):  # async after all
                await _awaited(name, entry.listener, result)

    # -- parallel --------------------------------------------------------------------

    def parallel(
        self, name: str, event: object, *, scope: str | None = None
    ) -> Ready[None] | Deferred[None]:
        """Start every listener at once and await them all; each failure is logged and
        contained (none can veto, none stops another).

        With only sync listeners, they run inline one after another (:class:`Ready`):
        none waits on another's outcome. With an async one among them, all run on the
        I/O side (:class:`Deferred`): async listeners concurrently on the loop, sync
        ones in the blocking pool, and ``run()`` ends when the last one has.
        """
        topic = self._topics.get(name)
        if topic is None:
            return READY_NONE
        chain = topic.select(scope)
        if not chain.has_async:
            for entry in chain.entries:
                try:
                    result = entry.listener(event)
                except BaseException as err:
                    if _interrupted(err):
                        raise
                    logger.exception("listener %s for %r failed", _label(entry.listener), name)
                    continue
                if result is not None and isawaitable(result):  # async after all
                    return Deferred(partial(_awaited_contained, name, entry.listener, result))
            return READY_NONE
        return Deferred(partial(self._parallel_all, name, chain.entries, event))

    async def _parallel_all(self, name: str, entries: tuple[Entry, ...], event: object) -> None:
        loop = asyncio.get_running_loop()

        async def one(entry: Entry) -> None:
            if entry.is_async:
                try:
                    started = entry.listener(event)
                except Exception:
                    logger.exception("listener %s for %r failed", _label(entry.listener), name)
                    return
                await _awaited_contained(name, entry.listener, started)
                return
            try:
                result = await loop.run_in_executor(
                    self._io.blocking_pool, _call_serial_sync, name, entry.listener, event
                )
            except ListenerError:
                logger.exception("listener %s for %r failed", _label(entry.listener), name)
                return
            if result is not None and isawaitable(result):
                await _awaited_contained(name, entry.listener, result)

        await asyncio.gather(*(one(entry) for entry in entries))

    # -- waterfall -------------------------------------------------------------------

    def waterfall(
        self, name: str, event: object, default: Callable[[], T], *, scope: str | None = None
    ) -> Ready[T] | Deferred[T]:
        """Run middleware listeners ``(event, next)``, first registered outermost.

        A listener that does not call ``next`` short-circuits the rest; ``next()`` at
        the bottom returns ``default()``. The result is whatever the outermost
        listener returned (``None`` included: the caller decides what it means).
        In a chain with an async listener, ``next`` of an async listener returns an
        awaitable, and sync listeners run in the blocking pool where ``next()``
        blocks that pool thread until the inner chain is done; that thread runs the
        inner chain's sync listeners itself, so one chain holds at most one pool
        thread. A failure is raised as ``ListenerError``; one raised by an inner
        listener passes through as is.
        """
        topic = self._topics.get(name)
        if topic is None:
            try:
                return Ready(default())
            except _FAULTS as err:
                raise ListenerError(name, default, err) from err
        chain = topic.select(scope)
        entries = chain.entries
        if chain.has_async:
            return Deferred(lambda: self._waterfall_async(name, entries, 0, event, default))
        value = self._waterfall_sync(name, entries, 0, event, default)
        if value is not None and isawaitable(value):  # the outermost is async after all
            return Deferred(partial(_awaited, name, entries[0].listener, value))
        return Ready(value)

    @staticmethod
    def _bottom(name: str, default: Callable[[], T]) -> T:
        try:
            return default()
        except _FAULTS as err:
            raise ListenerError(name, default, err) from err

    def _waterfall_sync(
        self,
        name: str,
        entries: tuple[Entry, ...],
        index: int,
        event: object,
        default: Callable[[], T],
    ) -> T:
        if index == len(entries):
            return self._bottom(name, default)

        def next_() -> T:
            if self._io.in_loop_thread():  # from the coroutine of a listener async after all
                return cast(T, self._waterfall_async(name, entries, index + 1, event, default))
            value = self._waterfall_sync(name, entries, index + 1, event, default)
            if value is not None and isawaitable(value) and index + 1 < len(entries):
                return cast(T, self._block_on(name, entries[index + 1].listener, value))
            return value

        return _call_sync(name, entries[index].listener, event, next_)

    def _block_on(self, name: str, listener: Listener, awaitable: Awaitable[object]) -> object:
        """The value of what ``listener``, called as sync in the ``next()`` of a sync
        listener, returned: an awaitable (it is async after all), run on the loop while
        this thread, blocked in that ``next()``, runs the sync work it sends here."""
        host = Host(self._io.loop, self._io.blocking_pool)
        return host.serve(_awaited(name, listener, awaitable))

    async def _waterfall_async(
        self,
        name: str,
        entries: tuple[Entry, ...],
        index: int,
        event: object,
        default: Callable[[], T],
        host: Host | None = None,
    ) -> T:
        """The chain from ``index`` on the loop. A sync listener runs on ``host``'s thread
        when there is one (the thread blocked in the ``next()`` of the sync listener this
        part of the chain runs inside), else in the blocking pool."""
        if index == len(entries):
            return self._bottom(name, default)
        entry = entries[index]
        listener = entry.listener
        loop = asyncio.get_running_loop()
        with _failing_as(name, listener):
            if entry.is_async:

                def next_async() -> Awaitable[T]:
                    return self._waterfall_async(name, entries, index + 1, event, default, host)

                return cast(T, await cast(Awaitable[object], listener(event, next_async)))
            next_ = self._next_blocking(loop, name, entries, index + 1, event, default)
            if host is None:
                work = loop.run_in_executor(
                    self._io.blocking_pool, _call_sync, name, listener, event, next_
                )
            else:
                work = host.submit(_call_sync, name, listener, event, next_)
            value = await work
        if value is not None and isawaitable(value):  # async after all: its value
            return await _awaited(name, listener, cast(Awaitable[T], value))
        return value

    def _next_blocking(
        self,
        loop: asyncio.AbstractEventLoop,
        name: str,
        entries: tuple[Entry, ...],
        index: int,
        event: object,
        default: Callable[[], T],
    ) -> Callable[[], T]:
        """``next`` of the sync listener before ``index``: blocks its (pool) thread until
        the chain from ``index`` is done, and that thread does the chain's sync work
        meanwhile, so one waterfall holds at most one pool thread whatever its mix of
        listeners; waterfalls cannot starve the pool waiting for threads other waiting
        waterfalls hold. A following sync listener is called right there; past an async
        listener (and for the default, which runs on the loop as in any deferred chain)
        the chain runs on the loop and sends its sync listeners back to this thread."""

        def next_() -> T:
            if self._io.in_loop_thread():  # from the coroutine of a listener async after all
                return cast(T, self._waterfall_async(name, entries, index, event, default))
            if index < len(entries) and not entries[index].is_async:
                listener = entries[index].listener
                after = self._next_blocking(loop, name, entries, index + 1, event, default)
                value = _call_sync(name, listener, event, after)
                if value is not None and isawaitable(value):  # async after all
                    return cast(T, self._block_on(name, listener, value))
                return value
            host = Host(loop, self._io.blocking_pool)
            inner = self._waterfall_async(name, entries, index, event, default, host)
            return cast(T, host.serve(inner))

        return next_


def _call_serial_sync(name: str, listener: Listener, event: object) -> object:
    """A sync serial listener; its failure, of any kind, raised as ``ListenerError``; what
    it returned (an awaitable is awaited on the loop)."""
    try:
        return listener(event)
    except BaseException as err:
        if _interrupted(err):
            raise
        raise ListenerError(name, listener, err) from err


def _call_sync(name: str, listener: Listener, event: object, next_: Callable[[], T]) -> T:
    """A sync waterfall listener; its failure, of any kind, raised as ``ListenerError``
    (an inner listener's passes through as is)."""
    try:
        return cast(T, listener(event, next_))
    except ListenerError:
        raise
    except BaseException as err:
        if _interrupted(err):
            raise
        raise ListenerError(name, listener, err) from err


def _identity(value: T) -> T:
    return value


def _discard(awaitable: object) -> None:
    """Close a coroutine that will never run (no "never awaited" warning)."""
    close = getattr(awaitable, "close", None)
    if inspect.iscoroutine(awaitable) and close is not None:
        close()


def _label(listener: object) -> str:
    return getattr(listener, "__qualname__", None) or repr(listener)
