"""The registry's actor: starts and stops the actors of a registry its owner keeps, one
message at a time.

Which ids are registered, and the announcements of their creation and disposal, are the
owner's: the runtime's agent table (``runtime.table``) keeps the one map of its agents,
under its own lock, and announces ``agent/created`` on the new agent's own actor and
``agent/disposed`` from its death watch, never on this actor's worker, which a listener
of those events may ask. What the actor gives its owner is what only an actor gives:
the starts run on its worker, in its mailbox's order (a stop told after a start is
handled after it), and a thread that asks it registers the wait like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pykka import ActorRef

from actors._dispatcher import Dispatcher
from actors._pooled import PooledActor

__all__ = ["RegistryActor"]

Factory = Callable[[], "ActorRef[Any]"]


class RegistryActor(PooledActor):
    """Starts actors (``create``, ``create_many``) and stops them (``stop_actor``) on its
    worker; use through ``ref.proxy()`` or ``ref.ask``. It keeps no map of them."""

    def __init__(self, *, dispatcher: Dispatcher | None = None) -> None:
        super().__init__()
        self.actor_dispatcher = dispatcher

    def create(self, factory: Factory) -> ActorRef[Any]:
        """Run ``factory()``, which must start an actor and return its ref quickly."""
        return factory()

    def create_many(self, factories: Sequence[Factory]) -> list[ActorRef[Any]]:
        """:meth:`create` for many actors in one message (a batch spawn: one hand-off to
        the registry instead of one per actor), in order. All or nothing: a factory that
        raises stops the actors this batch started before it, and the error propagates."""
        refs: list[ActorRef[Any]] = []
        try:
            for factory in factories:
                refs.append(factory())
        except BaseException:
            for ref in refs:
                ref.stop(block=False)
            raise
        return refs

    def stop_actor(self, ref: ActorRef[Any]) -> None:
        """Ask the actor to stop, if it is alive (told: its stop is handled in its turn)."""
        if ref.is_alive():
            ref.stop(block=False)
