"""The pooled actor's mailbox: pykka's inbox protocol on top of a dispatcher.

``put`` appends the envelope and, if the actor is not already queued or running,
puts the mailbox on its dispatcher's run queue. A worker then calls
:meth:`Mailbox.run_batch`, which hands each envelope to the actor. Bounds, dead
letters and death watching live here too.

It imports pykka's ``Envelope`` and ``_ActorStop``, which pykka does not export: an
inbox that stands in for pykka's own must build envelopes and recognise a stop request
(``pyproject.toml`` keeps pykka below 5, the API this follows).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pykka import ActorDeadError, ActorRef
from pykka._envelope import Envelope
from pykka.messages import _ActorStop

from actors._deadletters import DeadLetters
from actors._dispatcher import Dispatcher, LoopHandoff, in_nonblocking_thread, loop_handoff
from actors.errors import DispatcherShutdownError, MailboxFullError

__all__ = [
    "ActorDeath",
    "DeathWatcher",
    "Mailbox",
    "MailboxStatistics",
    "Overflow",
]

logger = logging.getLogger("corral.actors")


class MailboxOwner(Protocol):
    """What the mailbox needs from its actor (``PooledActor`` provides it)."""

    actor_urn: str
    actor_stopped: threading.Event
    _actor_failed: bool
    _actor_error: BaseException | None

    @property
    def actor_ref(self) -> ActorRef[Any]: ...

    def _actor_loop_setup(self) -> None: ...

    def _actor_handle(self, envelope: Envelope[Any]) -> None: ...


Overflow = Literal["reject", "block"]


@dataclass(frozen=True, slots=True)
class ActorDeath:
    """How an actor ended: ``failed`` is False only for a requested stop."""

    actor_urn: str
    failed: bool
    error: BaseException | None


DeathWatcher = Callable[["ActorRef[Any]", ActorDeath], None]


@dataclass(frozen=True, slots=True)
class MailboxStatistics:
    depth: int
    limit: int | None
    overflow: Overflow
    scheduled: bool
    closed: bool


class Mailbox:
    """A pooled actor's inbox: two lists swapped under one lock, plus a "scheduled" flag.

    Senders append to ``_in`` under ``_lock``. The worker running the actor owns
    ``_out`` and swaps in the whole of ``_in`` when ``_out`` is used up, so it takes
    the lock once per swap, not once per message.

    Bounds: with ``limit`` set, a full mailbox either rejects (``MailboxFullError``)
    or, with ``overflow="block"``, makes the sender wait up to ``block_timeout``
    seconds. A sender on a dispatcher worker, the I/O loop or the scheduler thread
    never waits: there ``"block"`` degrades to ``"reject"``. Stop requests are never
    refused. Limits apply from ``start()`` on; messages sent from ``__init__`` queue.
    """

    __slots__ = (
        "_actor",
        "_block_timeout",
        "_closed",
        "_death",
        "_dispatcher",
        "_in",
        "_label",
        "_limit",
        "_lock",
        "_out",
        "_overflow",
        "_pos",
        "_scheduled",
        "_space",
        "_started",
        "_watchers",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in: list[Envelope[Any] | None] = []
        self._out: list[Envelope[Any] | None] = []  # Invariant: only the running worker touches it
        self._pos = 0  # next index in _out
        # Invariant: True from the moment the mailbox is put on the run queue until a
        # worker finds it empty under _lock; so it is never queued or run twice.
        self._scheduled = False
        self._closed = False  # Invariant: once True, every put is a dead letter.
        self._started = True
        self._actor: MailboxOwner | None = None
        self._dispatcher: Dispatcher | None = None
        self._limit: int | None = None
        self._overflow: Overflow = "reject"
        self._block_timeout: float | None = None
        self._space: threading.Condition | None = None
        self._watchers: list[Callable[[ActorDeath], None]] | None = None
        self._death: ActorDeath | None = None
        self._label: str | None = None

    def bind(
        self,
        actor: MailboxOwner,
        dispatcher: Dispatcher,
        *,
        limit: int | None = None,
        overflow: Overflow = "reject",
        block_timeout: float | None = None,
        run_on_start: bool = True,
    ) -> None:
        """Attach the mailbox to its actor and dispatcher; schedule on_start / queued mail."""
        if limit is not None and limit < 1:
            raise ValueError(f"actor_mailbox_limit must be None or at least 1, got {limit}")
        if overflow not in ("reject", "block"):
            raise ValueError(
                f"actor_mailbox_overflow must be 'reject' or 'block', not {overflow!r}"
            )
        if dispatcher.is_shut_down:
            raise DispatcherShutdownError(dispatcher.name)
        with self._lock:
            if self._dispatcher is not None:
                raise RuntimeError(f"mailbox of {actor} is already bound")
            self._actor = actor
            self._dispatcher = dispatcher
            self._limit = limit
            self._overflow = overflow
            self._block_timeout = block_timeout
            if limit is not None and overflow == "block":
                self._space = threading.Condition(self._lock)
            self._started = not run_on_start
            if not (run_on_start or self._in):
                return
            self._scheduled = True
        dispatcher.schedule(self)

    # -- pykka's ActorInbox protocol -------------------------------------------------

    def put(self, envelope: Envelope[Any], /) -> None:
        self._put(envelope, None)

    def put_soon(self, envelope: Envelope[Any], /) -> None:
        """:meth:`put`, but on an I/O loop thread the actor is made runnable at the end
        of the loop's pass, with the others made runnable in it (see
        :class:`~actors._dispatcher.LoopHandoff`); elsewhere exactly :meth:`put`."""
        self._put(envelope, loop_handoff())

    def _put(self, envelope: Envelope[Any], handoff: LoopHandoff | None) -> None:
        # `with`, not a bare acquire(): any thread sends, the main thread too, where a
        # Ctrl-C may raise inside the section (see storage.locks).
        with self._lock:
            bound = self._dispatcher
            if not (self._closed or self._limit is not None or bound is None or bound._closed):
                self._in.append(envelope)
                if not self._scheduled:
                    self._scheduled = True
                    # Dispatcher.schedule, its closed check done above; under the lock so
                    # that an exception cannot leave the mailbox scheduled but not queued.
                    if handoff is None:
                        bound._run_queue.put(self)
                    else:
                        handoff.schedule(bound, self)
                return
        self._put_checked(envelope)

    def run_now(self, envelope: Envelope[Any], /) -> None:
        """:meth:`put`, for a dispatcher worker that is running anyway: if the actor is
        idle (nothing queued, not on the run queue, started, not stopping) it handles
        ``envelope`` here and now, as its next batch would, instead of after a trip
        through the run queue; otherwise the envelope is put. Call it only on a worker
        of the actor's dispatcher (the actor's code runs on the calling thread).

        Mail sent to the actor while it handles ``envelope`` (an agent's listener that
        sends it the next followup) is handled next, here, as in a batch: up to the
        dispatcher's ``throughput`` messages in all; the rest waits on the run queue.
        Put on the run queue instead, the actor's next message ran after every other
        runnable actor, its objects long gone from the CPU's caches.

        The first message is handled outside :meth:`run_batch` (its loop and list swap
        cost as many opcodes per turn as the trip through the run queue saves)."""
        actor = self._actor
        lock = self._lock
        lock.acquire()  # not `with`: once per flush of an agent (hot path)
        bound = self._dispatcher
        if (
            self._scheduled
            or self._in
            or self._closed
            or self._limit is not None
            or bound is None
            or bound._closed
            or not self._started
            or actor is None
            or actor.actor_stopped._flag  # type: ignore[attr-defined]
        ):
            lock.release()
            self.put(envelope)
            return
        self._scheduled = True  # Invariant: no worker runs it meanwhile (see _scheduled)
        lock.release()
        actor._actor_handle(envelope)
        # The rest of the batch: mail sent meanwhile, a stop, or going idle again.
        if self.run_batch(bound.throughput - 1)[1]:
            bound._run_queue.put(self)

    def _put_checked(self, envelope: Envelope[Any]) -> None:
        """:meth:`put` for a mailbox that is closed, bounded or not bound to a running
        dispatcher."""
        with self._lock:
            if not self._closed and self._limit is not None and self._depth() >= self._limit:
                self._wait_for_space(envelope)
            bound = self._dispatcher
            if self._closed:
                reason = "sent after the actor stopped"
            elif bound is not None and bound._closed:  # is_shut_down, without a call
                reason = "sent after its dispatcher shut down"
            else:
                self._in.append(envelope)
                if self._scheduled or bound is None:
                    return
                self._scheduled = True
                reason = ""
        if reason:
            self._refuse(envelope, reason)
            return
        assert bound is not None
        bound.schedule(self)

    def tell(self, message: object) -> None:
        """``ActorRef.tell`` without its liveness check, for an actor's own completions:
        a message that reaches a stopped actor is recorded as a dead letter here."""
        self.put(Envelope(message))

    def get(self) -> Envelope[Any]:
        """Take the next envelope; only the thread running the actor may call this."""
        if self._pos >= len(self._out):
            with self._lock:
                self._swap()
        if self._pos >= len(self._out):
            raise LookupError("the mailbox is empty")
        envelope = self._out[self._pos]
        self._out[self._pos] = None
        self._pos += 1
        assert envelope is not None
        return envelope

    def empty(self) -> bool:
        return not self._in and self._pos >= len(self._out)

    def busy(self) -> bool:
        """Whether envelopes are queued or a batch is running (a snapshot): an envelope
        put before this call and not yet handled makes it True."""
        return self._scheduled or not self.empty()

    # -- observation -----------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages queued and not yet handled (a snapshot)."""
        return self._depth()

    def statistics(self) -> MailboxStatistics:
        return MailboxStatistics(
            depth=self._depth(),
            limit=self._limit,
            overflow=self._overflow,
            scheduled=self._scheduled,
            closed=self._closed,
        )

    def watch(self, callback: Callable[[ActorDeath], None]) -> Callable[[], None]:
        """Call ``callback(death)`` once the actor has stopped (at once if it has).

        Returns a disposer. Callbacks run on the worker that tore the actor down,
        so they must be quick and must not block.
        """
        with self._lock:
            death = self._death
            if death is None:
                if self._watchers is None:
                    self._watchers = []
                self._watchers.append(callback)
        if death is not None:
            callback(death)
            return _noop

        def dispose() -> None:
            with self._lock:
                if self._watchers is not None and callback in self._watchers:
                    self._watchers.remove(callback)

        return dispose

    # -- running (dispatcher side) ---------------------------------------------------

    def run_batch(self, throughput: int) -> tuple[int, bool]:
        actor = self._actor
        assert actor is not None, "an unbound mailbox was scheduled"
        # The stopped flag is read directly (``threading.Event`` and ``StoppedEvent`` keep
        # it in ``_flag``): ``is_set()`` is a Python call per message on a StoppedEvent.
        stopped = actor.actor_stopped
        if not self._started:
            self._started = True
            actor._actor_loop_setup()
        handled = 0
        lock = self._lock  # taken without `with` below: once or twice per batch (hot path)
        while handled < throughput and not stopped._flag:  # type: ignore[attr-defined]
            out = self._out
            pos = self._pos
            if pos >= len(out):
                lock.acquire()
                fresh = self._in
                if not fresh:
                    self._scheduled = False
                    lock.release()
                    return handled, False
                out.clear()  # _swap, inline: reuse the drained list as the inbox
                self._in = out
                self._out = out = fresh
                self._pos = pos = 0
                lock.release()
            envelope = out[pos]
            out[pos] = None
            self._pos = pos + 1
            if self._space is not None:
                with self._lock:
                    self._space.notify()
            assert envelope is not None
            actor._actor_handle(envelope)
            handled += 1
        if stopped._flag:  # type: ignore[attr-defined]
            self._teardown(actor)
            return handled, False
        lock.acquire()
        more = bool(self._in) or self._pos < len(self._out)
        if not more:
            self._scheduled = False
        lock.release()
        return handled, more

    # -- internals -------------------------------------------------------------------

    def _depth(self) -> int:
        return len(self._in) + len(self._out) - self._pos

    def _swap(self) -> None:
        # Caller holds _lock. Reuse the drained list as the new inbox.
        drained = self._out
        drained.clear()
        self._out = self._in
        self._in = drained
        self._pos = 0

    def _wait_for_space(self, envelope: Envelope[Any]) -> None:
        # Caller holds _lock; returns with space available or the mailbox closed.
        limit = self._limit
        assert limit is not None
        if isinstance(envelope.message, _ActorStop):
            return
        space = self._space
        if space is None or in_nonblocking_thread():
            raise MailboxFullError(self._describe(), limit)
        timeout = self._block_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._depth() >= limit and not self._closed:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise MailboxFullError(self._describe(), limit, waited=timeout)
            space.wait(remaining)

    def _teardown(self, actor: MailboxOwner) -> None:
        ref = actor.actor_ref
        death = ActorDeath(
            actor_urn=actor.actor_urn,
            failed=actor._actor_failed,
            error=actor._actor_error,
        )
        with self._lock:
            self._closed = True
            self._label = str(ref)
            leftovers = [e for e in self._out[self._pos :] if e is not None]
            leftovers.extend(e for e in self._in if e is not None)
            self._in = []
            self._out = []
            self._pos = 0
            self._death = death
            watchers, self._watchers = self._watchers, None
            if self._space is not None:
                self._space.notify_all()
        for envelope in leftovers:
            self._refuse(envelope, "the actor stopped before handling it")
        self._actor = None  # break the actor <-> mailbox cycle
        for callback in watchers or ():
            try:
                callback(death)
            except Exception:
                logger.exception("death watcher of %s failed", ref)

    def _refuse(self, envelope: Envelope[Any], reason: str) -> None:
        reply_to = envelope.reply_to
        if isinstance(envelope.message, _ActorStop):
            if reply_to is not None:
                reply_to.set(None)
            return
        label = self._describe()
        self._dead_letters().record(label, envelope.message, reason)
        if reply_to is not None:
            error = ActorDeadError(f"{label} stopped before handling the message")
            reply_to.set_exception(exc_info=(ActorDeadError, error, None))

    def _dead_letters(self) -> DeadLetters:
        dispatcher = self._dispatcher or Dispatcher.default()
        return dispatcher.dead_letters

    def _describe(self) -> str:
        if self._actor is not None:
            return str(self._actor)
        return self._label or "an unstarted actor"


def _noop() -> None:
    return None
