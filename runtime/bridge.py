"""The ``session/event`` bridge: an agent's session appends mirrored as live events.

Sessions get a bridge (an observer called on every append) only once someone listens to
``session/event`` or taps the sessions (:meth:`SessionBridge.tap`): until then appends
skip observers, and while no such listener is left the bridge emits nothing. A session
is bridged once (a passivated agent is bridged again when it goes live over a new
session).

A tap is the cheap way to see every append: it is called ``(agent, event)`` straight
from the session's observer, before the ``session/event`` listeners, with no live
payload built and no bus in between (``runtime.telemetry`` taps: a chunk then costs
it one call that returns at once, where a ``session/event`` listener costs an emit).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors import Bus, SessionEventLive
from storage import Event

from .slots import AgentSlot

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["SessionBridge", "SessionTap"]

log = logging.getLogger("corral.runtime")

SessionTap = Callable[["Agent", Event], None]
"""A direct observer of every live agent's session appends (see :meth:`SessionBridge.tap`)."""


class SessionBridge:
    """The bridge of one runtime's agents onto its ``bus``. ``lock`` is the runtime's:
    the listener count and :attr:`bridging` change under it, atomically with the
    runtime's table of agents (an agent that goes live reads :attr:`bridging` under it
    after its slot is bound; a new listener bridges the agents live by then)."""

    def __init__(self, bus: Bus, lock: threading.Lock) -> None:
        self._bus = bus
        self._lock = lock
        self._listeners = 0  # Invariant: changed under lock; appends skip the bridge at 0
        # Replaced (never changed in place) under lock: an append reads it once.
        self._taps: tuple[SessionTap, ...] = ()
        self.bridging = False
        """Someone has listened to ``session/event`` or tapped: every agent that goes
        live from then on is bridged (read and set under the runtime's lock)."""
        # Held while a bridge is registered, so that a bridge is never registered twice
        # and an on() that finds it registered returns after it is. Lock order: this
        # lock, then a session's lock (a session observer must not bridge: see bridge).
        self._bridge_lock = threading.Lock()

    @property
    def listeners(self) -> int:
        """How many ``session/event`` listeners are registered."""
        return self._listeners

    def counted(self, dispose: Callable[[], None]) -> Callable[[], None]:
        """Count in a new ``session/event`` listener (under the runtime's lock) and turn
        bridging on; returns its ``dispose``, which also counts it out. Idempotent."""
        self._listeners += 1
        self.bridging = True
        done = False

        def dispose_session_listener() -> None:
            nonlocal done
            with self._lock:
                if done:
                    return
                done = True
                self._listeners -= 1
            dispose()

        return dispose_session_listener

    def tap(self, observer: SessionTap) -> Callable[[], None]:
        """Call ``observer(agent, event)`` on every later append to a bridged session
        (under the runtime's lock; the caller then bridges the agents live by now, as
        for a listener) and turn bridging on; returns its idempotent ``dispose``.

        The observer runs in the appending thread while the append holds the session's
        lock, before the ``session/event`` listeners, as a session observer does: it may
        read the session, not append to it; keep it short. A raising one is logged
        (logger ``corral.runtime``) and contained: the event stays committed, the other
        taps and the listeners still see it."""
        self._taps = (*self._taps, observer)
        self.bridging = True
        done = False

        def dispose_tap() -> None:
            nonlocal done
            with self._lock:
                if done:
                    return
                done = True
                taps = list(self._taps)
                taps.remove(observer)
                self._taps = tuple(taps)

        return dispose_tap

    def bridge(self, slot: AgentSlot[Agent]) -> None:
        """Mirror the agent's session appends as live ``session/event`` events (once per
        session; a passivated agent is bridged when it goes live again).

        A session that is already bridged is not touched, so the session's own observers
        (which run under its lock) may register listeners. The session's lock is never
        taken under the runtime's lock: its observers call back into the runtime."""
        with self._bridge_lock:
            session = slot.session
            if session is None or slot.bridged is session:
                return
            session.on_event(self._observer(slot.handle))
            with self._lock:
                slot.bridged = session

    def _observer(self, handle: Agent) -> Callable[[Any], None]:
        bus, scope = self._bus, handle.id

        def observe(event: Any) -> None:
            for tap in self._taps:
                try:
                    tap(handle, event)
                except Exception:  # contained, as a session observer's failure is
                    log.exception(
                        "session tap %r failed on %r seq %d of agent %s; contained",
                        tap,
                        event.type,
                        event.seq,
                        scope,
                    )
            if self._listeners and bus.has_listeners("session/event", scope=scope):
                bus.emit("session/event", SessionEventLive(agent=handle, event=event), scope=scope)

        return observe
