"""``AgentSlot``: one agent's place in its runtime, the single owner of its lifecycle.

An agent is *live* (an actor runs it over an in-memory session), *passive* (evicted by a
passivation: its next use rebuilds it from the log), *disposing* (a disposal began: it
takes no more sends) and at last *disposed*. The slot holds that state, the lock that
guards it (the live lock) and the live parts (actor, session, inbox, turn machine) the
handle's verbs use. The handle (``runtime.agent``) reads it; the runtime (its
:class:`AgentHost`) moves it from one state to the next.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, Protocol, TypeVar

from pykka import ActorDeadError, ActorRef, Future, Timeout

from actors import (
    Barrier,
    Inbox,
    LendingLock,
    Mailbox,
    Quiescent,
    TurnSignal,
    WaitCycleError,
    waiting_for,
    waiting_on_actors,
    working_for,
)

from .waiting import OnceFlag

if TYPE_CHECKING:
    from storage import Session

__all__ = ["AgentHost", "AgentSlot", "TurnView"]

log = logging.getLogger("corral.runtime")

H = TypeVar("H")


class TurnView(Protocol):
    """What the slot reads of its live agent's turn machine (``actors.TurnMachine``
    is one): the handle's ``status``, what ``cancel`` targets, whether a wake must wait
    for a turn that is unwinding."""

    @property
    def status(self) -> Literal["idle", "running"]:
        """The agent's activity: ``"running"`` from a turn's claim to its chain's end."""

    def active_signal(self) -> TurnSignal | None:
        """The running turn's signal (what a cancel sets), if a turn runs."""

    def is_unwinding(self) -> bool:
        """Whether a turn is ending (cancelled, or past its last step) but not ended."""


class _NoTurn:
    """The turn view of an agent with no machine running it (not live yet, or
    passive): idle, nothing to cancel, nothing unwinding."""

    __slots__ = ()
    status: Final = "idle"

    def active_signal(self) -> TurnSignal | None:
        return None

    def is_unwinding(self) -> bool:
        return False


_NO_TURN: Final = _NoTurn()


_DISPOSE_LOCK: Final = threading.Lock()
"""Guards every slot's ``disposing`` (set once per agent, in two lines: one lock for all
of them, not ~50 bytes of every agent)."""


class AgentSlot(Generic[H]):
    """The lifecycle of the agent ``id``, whose handle is ``handle``."""

    __slots__ = (
        "announcer",
        "bridged",
        "disposed",
        "disposing",
        "handle",
        "id",
        "inbox",
        "lock",
        "passivating",
        "passive",
        "ref",
        "registered",
        "session",
        "spec",
        "turn",
    )

    def __init__(self, session: Session, spec: Any) -> None:
        self.id = session.id
        self.handle: H
        """The agent's handle (set by the runtime once it is built)."""
        self.spec = spec
        """What the agent was made of (to rebuild it after passivation)."""
        # Held while sending and while passivating, so a send never reaches an actor
        # that is being stopped; a passivated agent is rehydrated by its next use.
        self.lock = LendingLock()  # (a passivation holds it while it asks the actor)
        self.passive = False  # Invariant: changed under ``lock`` only
        self.passivating = False  # a passivation stops its actor (no disposal: on death)
        self.disposing = False  # Invariant: set once, under ``_DISPOSE_LOCK``
        self.disposed = OnceFlag()  # (an event would be ~1 KB of every agent)
        self.announcer: int | None = None  # the thread emitting its agent/disposed
        self.registered = False
        """Its actor (``ref``) is the one the runtime knows for this id: from going live
        until its disposal is announced (or its start failed)."""
        self.bridged: Session | None = None
        """The session whose appends are mirrored as ``session/event`` (see the runtime's
        bridge), if any."""
        self.ref: ActorRef[Any] | None = None
        self.session: Session | None = session
        self.inbox: Inbox | None = None
        self.turn: TurnView = _NO_TURN
        """What the slot reads of the turn machine running the agent (while live)."""

    # ------------------------------------------------------------------ live parts

    def bind(self, ref: ActorRef[Any], session: Session, inbox: Inbox, turn: TurnView) -> None:
        """Live: ``ref`` runs the agent over ``session``, its turns run by ``turn``."""
        self.ref = ref
        self.session = session
        self.inbox = inbox
        self.passive = False
        self.turn = turn

    def unbind(self) -> None:
        """Passive: forget the stopped actor and the in-memory session."""
        self.passive = True
        self.session = None
        self.inbox = None
        self.bridged = None
        self.turn = _NO_TURN

    def status(self) -> Literal["idle", "running"]:
        """The agent's activity (idle while passive)."""
        return self.turn.status

    def active_signal(self) -> TurnSignal | None:
        """The running turn's signal, if a turn runs."""
        return self.turn.active_signal()

    def unwinding(self) -> bool:
        """Whether a turn is ending but not ended."""
        return self.turn.is_unwinding()

    # ------------------------------------------------------------------ threads

    def on_own_thread(self) -> bool:
        """Whether the caller runs on this agent's actor (one of its own listeners)."""
        inbox = self.inbox
        return inbox is not None and inbox.owner == threading.get_ident()

    def runs_own_effect(self) -> bool:
        """Whether the caller runs in one of this agent's effects (a tool body, a
        ``tools/execute`` listener, a listener of a deferred chain), whose end the turn
        waits for; see ``actors._dispatcher.work_for``."""
        owner = working_for()
        return owner is not None and owner is self.inbox

    def exclusive(self) -> AbstractContextManager[object]:
        """What a caller holds from making the agent live until its message is in the
        actor's mailbox: the live lock, which a passivation holds while it stops the
        actor (a message told meanwhile would never be handled). Not on the agent's own
        actor: that runs the caller's listener, so no passivation can stop it, and one
        that waits for it holds the lock."""
        return nullcontext() if self.on_own_thread() else self.lock

    # ------------------------------------------------------------------ its actor's queue

    def busy(self) -> bool:
        """Whether the agent's actor has messages queued or is handling some."""
        ref = self.ref
        mailbox = None if self.passive or ref is None else ref.actor_inbox
        return isinstance(mailbox, Mailbox) and mailbox.busy()

    def told_handled(self) -> Future[Any] | None:
        """A future answered once the agent handled every message told to it before
        this call (a send, a cancel: their facts are then appended), or None when
        nothing is queued or running."""
        with self.exclusive():  # not while a passivation stops the actor
            ref = self.ref
            if self.passive or ref is None or not self.busy():
                return None
            try:
                return ref.ask(Barrier(), block=False)
            except ActorDeadError:
                return None  # what it had not handled died with it (or was kept: a crash)

    # ------------------------------------------------------------------ transitions

    def begin_disposing(self) -> bool:
        """Mark the disposal begun; whether this call was the first to."""
        with _DISPOSE_LOCK:
            first = not self.disposing
            self.disposing = True
        return first

    def claim(self) -> None:
        """Its start was given up on by a close: it never ran, and is disposed as is."""
        self.disposing = True
        self.disposed.set()

    def stopped_by_disposal(self, ref: ActorRef[Any]) -> bool:
        """Whether ``ref``, which stopped, was this agent's actor stopped by its disposal
        (not by a passivation, nor an actor passivated before)."""
        return (
            self.disposing
            and not self.passivating
            and not self.passive
            and self.registered
            and self.ref is ref
        )

    def passivate(self, timeout: float | None) -> bool:
        """Stop the idle agent's actor and drop its in-memory session; the next use
        rehydrates it from its log. False if it is busy (or gone)."""
        if self.on_own_thread():
            return False  # one of its own listeners is running: busy (asking would stall)
        with self.lock:
            if self.passive:
                return True
            ref = self.ref if self.registered else None
            if self.disposing or ref is None or not ref.is_alive():
                return False
            if not self._quiescent(ref, timeout):
                return False
            if self.disposing:  # (a disposal from its own actor meanwhile)
                return False
            self.passivating = True  # its death is no disposal (see stopped_by_disposal)
            try:
                with waiting_on_actors():
                    ref.stop(block=True, timeout=timeout)
            except ActorDeadError:
                self.passivating = False
                return False
            except Timeout:
                # Its stop is queued behind nothing (it was quiescent, and the live lock
                # keeps sends out): it stops without doing anything more. It is passive
                # from here; its next use rebuilds it from the log.
                log.debug("agent %s stops later than passivate's timeout", self.id)
            self.unbind()
            self.passivating = False
            return True

    def _quiescent(self, ref: ActorRef[Any], timeout: float | None) -> bool:
        """Whether the agent's actor, asked under its live lock, says it is idle with
        nothing queued. False (busy) when it is not, when it does not answer within
        ``timeout`` (in one handler all that while), when the wait would close a cycle,
        and as soon as another thread blocks on the live lock: that one wants to use the
        agent, and might be what the actor's handler waits for (a cycle through the
        lock, which no wait registers)."""
        lock = self.lock
        answered = threading.Event()
        answer: list[bool] = []

        def answer_with(quiescent: bool) -> None:  # on the agent's actor
            answer.append(quiescent)
            answered.set()

        lock.on_contention = answered.set
        try:
            ref.tell(Quiescent(callback=answer_with))
            assert self.inbox is not None
            with waiting_for(self.inbox, f"agent {self.id} to be passivated"):
                answered.wait(timeout)
        except (ActorDeadError, WaitCycleError):  # gone, or busy in a handler that waits
            return False  # for the caller
        finally:
            lock.on_contention = None
        return answer == [True]


class AgentHost(Protocol[H]):
    """What an agent's handle needs of its runtime, which passes it down: the handle
    never calls into the runtime otherwise."""

    def check_open(self) -> None:
        """Raise ``RuntimeClosedError`` once the runtime's ``close()`` began."""

    def check_released(self) -> None:
        """Raise ``RuntimeClosedError`` once ``close()`` let go of the store."""

    def check_room(self) -> None:
        """Raise ``DiskFullError`` while the store's disk is full: a send is refused,
        nothing logged (the store holds only what turns under way append)."""

    def rehydrate(self, slot: AgentSlot[H]) -> None:
        """Rebuild the passive agent from its log (the caller holds ``slot.lock``)."""

    def begin_disposal(self, slot: AgentSlot[H], *, keep_inbox: bool) -> None:
        """Start the agent's one disposal, unless one began."""

    def listen(
        self, name: str, listener: Callable[..., Any], slot: AgentSlot[H]
    ) -> Callable[[], None]:
        """Register ``listener`` for this agent's events only; returns a disposer."""
