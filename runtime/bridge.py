"""The ``session/event`` bridge: an agent's session appends mirrored as live events.

Sessions get a bridge (an observer called on every append) only once someone listens to
``session/event``: until then appends skip observers, and while no such listener is left
the bridge emits nothing. A session is bridged once (a passivated agent is bridged again
when it goes live over a new session).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors import Bus, SessionEventLive

from .slots import AgentSlot

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["SessionBridge"]


class SessionBridge:
    """The bridge of one runtime's agents onto its ``bus``. ``lock`` is the runtime's:
    the listener count and :attr:`bridging` change under it, atomically with the
    runtime's table of agents (an agent that goes live reads :attr:`bridging` under it
    after its slot is bound; a new listener bridges the agents live by then)."""

    def __init__(self, bus: Bus, lock: threading.Lock) -> None:
        self._bus = bus
        self._lock = lock
        self._listeners = 0  # Invariant: changed under lock; appends skip the bridge at 0
        self.bridging = False
        """Someone has listened to ``session/event``: every agent that goes live from
        then on is bridged (read and set under the runtime's lock)."""
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
            if self._listeners and bus.has_listeners("session/event", scope=scope):
                bus.emit("session/event", SessionEventLive(agent=handle, event=event), scope=scope)

        return observe
