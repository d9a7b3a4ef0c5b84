"""``PooledActor``: a pykka actor that runs on a shared dispatcher, not its own thread.

Its :class:`~actors._mailbox.Mailbox` schedules it onto a :class:`Dispatcher`; a
worker handles a batch of its messages with exactly the semantics of
``pykka.Actor._actor_loop_running`` (see :meth:`PooledActor._actor_handle`).
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pykka
from pykka import ActorRef, ActorRegistry, ThreadingFuture

from actors._dispatcher import Dispatcher
from actors._mailbox import ActorDeath, DeathWatcher, Mailbox, MailboxStatistics, Overflow

if TYPE_CHECKING:
    from types import TracebackType

    from pykka import Future
    from pykka._envelope import Envelope

# The mailbox names are re-exported here: the mailbox is half of the pooled actor.
__all__ = [
    "ActorDeath",
    "DeathWatcher",
    "Mailbox",
    "MailboxStatistics",
    "Overflow",
    "PooledActor",
    "StoppedEvent",
    "forget",
    "watch",
]

pykka_logger = logging.getLogger("pykka")
_CONDITION_LOCK = threading.Lock()


class StoppedEvent(threading.Event):
    """A ``threading.Event`` that builds its Condition only when someone waits.

    Most actors are never waited on, and an Event's Condition costs ~1.1 KB and
    ~10 us per actor. ``set``/``wait`` race-freely create it under one shared lock.
    """

    def __init__(self) -> None:  # no super().__init__(): that builds the Condition
        self._flag = False
        self._condition: threading.Condition | None = None

    def _cond_or_none(self) -> threading.Condition | None:
        return self._condition

    def _get_condition(self) -> threading.Condition:
        with _CONDITION_LOCK:
            if self._condition is None:
                self._condition = threading.Condition(threading.Lock())
            return self._condition

    def _at_fork_reinit(self) -> None:
        if self._condition is not None:
            self._condition = threading.Condition(threading.Lock())

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if self._condition is None:
            with _CONDITION_LOCK:
                if self._condition is None:  # nobody waits: a waiter that comes later
                    self._flag = True  # builds the Condition and sees the flag
                    return
        condition = self._get_condition()
        with condition:
            self._flag = True
            condition.notify_all()

    def clear(self) -> None:
        with self._get_condition():
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        condition = self._get_condition()
        with condition:
            return self._flag or condition.wait(timeout)


class _Urns:
    """Actor URNs in the ``uuid4`` layout: 62 random bits drawn once per process (again
    in a forked child) and a 60-bit counter, so unique within the process (where pykka
    looks actors up by URN) and all but surely across processes."""

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        r = uuid.uuid4().hex  # version 4 at r[12], the variant at r[16]
        self.prefix = f"urn:uuid:{r[:8]}-{r[8:12]}-{r[12:16]}-{r[16]}"
        self.counter = itertools.count()

    def next(self) -> str:
        n = next(self.counter)  # (atomic: one C call under the GIL)
        return f"{self.prefix}{n >> 48 & 0xFFF:03x}-{n & 0xFFFFFFFFFFFF:012x}"


_urns = _Urns()


class PooledActor(pykka.Actor):
    """A pykka actor that runs on a shared :class:`Dispatcher` instead of its own thread.

    Everything pykka documents for ``ThreadingActor`` holds: ``start()`` registers in
    ``ActorRegistry``; ``tell``, ``ask``, ``proxy()`` and ``stop()`` behave the same;
    ``on_start`` runs on a worker before any message; a failing ``ask`` goes to the
    caller, a failing ``tell`` stops the actor through ``on_failure``; asks left in
    the mailbox of a stopped actor get ``ActorDeadError``.

    Differences: a ``BaseException`` in a handler stops this actor and asks every
    other actor to stop without waiting (``stop_all(block=False)``), because a worker
    must never block; messages that reach a stopped actor are recorded as dead
    letters on the dispatcher.

    Handlers share a few worker threads: never block in one (no blocking ``ask``
    of another actor, no I/O, no sleep). Use ``ask(block=False)``, the I/O side
    (``IoSide.start_for``) or the scheduler, and handle the result as a message.

    Options, as class attributes or set on ``self`` in ``__init__`` (read by ``start``):
    ``actor_dispatcher`` (None: ``Dispatcher.default()``), ``actor_mailbox_limit``,
    ``actor_mailbox_overflow`` (``"reject"`` | ``"block"``) and
    ``actor_mailbox_block_timeout`` (seconds, None waits forever).
    """

    actor_dispatcher: Dispatcher | None = None
    actor_mailbox_limit: int | None = None
    actor_mailbox_overflow: Overflow = "reject"
    actor_mailbox_block_timeout: float | None = 10.0

    _actor_failed: bool = False
    _actor_error: BaseException | None = None

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        """Exactly ``pykka.Actor.__init__``, with a :class:`StoppedEvent` and a URN from
        :class:`_Urns` (a ``uuid4()`` was ~6 us: ~10% of a batch spawn's agent)."""
        self.actor_urn = _urns.next()
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = StoppedEvent()
        self._actor_ref = ActorRef(self)

    @staticmethod
    def _create_actor_inbox() -> Mailbox:
        return Mailbox()

    @staticmethod
    def _create_future() -> Future[Any]:
        return ThreadingFuture()

    @property
    def actor_mailbox(self) -> Mailbox:
        inbox = self.actor_inbox
        assert isinstance(inbox, Mailbox)
        return inbox

    def actor_on_death(self, callback: DeathWatcher) -> Callable[[], None]:
        """Call ``callback(ref, death)`` when this actor stops; returns a disposer."""
        return watch(self.actor_ref, callback)

    def _start_actor_loop(self) -> None:
        runs_on_start = type(self).on_start is not pykka.Actor.on_start
        try:
            self.actor_mailbox.bind(
                self,
                self.actor_dispatcher or Dispatcher.default(),
                limit=self.actor_mailbox_limit,
                overflow=self.actor_mailbox_overflow,
                block_timeout=self.actor_mailbox_block_timeout,
                run_on_start=runs_on_start,
            )
        except BaseException:
            forget(self.actor_ref)
            raise

    def _handle_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self._actor_failed:
            self._actor_failed = True
            self._actor_error = exception_value
        super()._handle_failure(exception_type, exception_value, traceback)

    def _actor_handle(self, envelope: Envelope[Any]) -> None:
        """One iteration of ``pykka.Actor._actor_loop_running``, unchanged in meaning."""
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                pykka_logger.info(
                    f"Exception returned from {self} to caller:",
                    exc_info=sys.exc_info(),
                )
                envelope.reply_to.set_exception()
            else:
                self._told_failed()
        except BaseException as error:  # noqa: BLE001
            self._fatal(error)

    def _told_failed(self) -> None:
        """A told message's handler raised the ``Exception`` being handled: the actor
        fails through ``on_failure``, as pykka's loop does (call from the except block)."""
        self._handle_failure(*sys.exc_info())
        try:
            self.on_failure(*sys.exc_info())
        except Exception:  # noqa: BLE001
            self._handle_failure(*sys.exc_info())

    def _fatal(self, error: BaseException) -> None:
        """A handler raised a ``BaseException``: stop this actor and ask every other to."""
        pykka_logger.debug(f"{error!r} in {self}. Stopping all actors.")
        self._actor_failed = True
        self._actor_error = error
        self._stop()
        ActorRegistry.stop_all(block=False)


def watch(ref: ActorRef[Any], callback: DeathWatcher) -> Callable[[], None]:
    """Call ``callback(ref, death)`` once the pooled actor behind ``ref`` has stopped.

    If it already has, the callback runs at once in the caller's thread. Returns a
    disposer that unregisters the callback. Only ``PooledActor`` refs can be watched.
    """
    inbox = ref.actor_inbox
    if not isinstance(inbox, Mailbox):
        raise TypeError(f"only PooledActor refs can be watched, not {ref}")
    return inbox.watch(_RefWatcher(ref, callback))


class _RefWatcher:
    """``callback(ref, death)`` as a one-argument death watcher: one small object per
    watch where a closure was three (every live agent's actor is watched)."""

    __slots__ = ("callback", "ref")

    def __init__(self, ref: ActorRef[Any], callback: DeathWatcher) -> None:
        self.ref = ref
        self.callback = callback

    def __call__(self, death: ActorDeath) -> None:
        self.callback(self.ref, death)


def forget(ref: ActorRef[Any]) -> None:
    """Have pykka forget an actor that can never run again (its start failed, or its
    dispatcher shut down before it could handle its stop): out of ``ActorRegistry``,
    and stopped as far as ``is_alive()`` and ``stop()`` can tell. Nothing of it runs."""
    ActorRegistry.unregister(ref)
    ref.actor_stopped.set()
