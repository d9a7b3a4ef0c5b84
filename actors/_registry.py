"""A generic registry actor: unique ids mapped to the actors it created.

The registry is itself a :class:`PooledActor`, so creations and removals are
serialised by its mailbox. What it announces is the caller's: ``on_created`` /
``on_disposed`` callbacks (the runtime emits ``agent/created`` / ``agent/disposed``
with the agent's handle, ``actors.events.AgentCreated`` / ``AgentDisposed``; those
are the one payload of each event).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from pykka import ActorRef

from actors._dispatcher import Dispatcher
from actors._mailbox import Mailbox
from actors._pooled import PooledActor
from actors.errors import DuplicateIdError

__all__ = ["RegistryActor"]

logger = logging.getLogger("corral.actors")


OnCreated = Callable[[str, "ActorRef[Any]"], None]
OnDisposed = Callable[[str], None]


class RegistryActor(PooledActor):
    """Owns ``id -> ActorRef``; use through ``ref.proxy()`` or ``ref.ask``.

    ``create(id, factory)`` runs ``factory()`` (which must start an actor and
    return its ref quickly) on the registry's worker. ``remove(id)`` forgets the id
    and, with ``stop=True``, asks the actor to stop; ``on_disposed`` fires once that
    actor has stopped (pooled actors) or right away (other actor types).
    A failing announcement callback is logged and does not undo the change.
    """

    def __init__(
        self,
        *,
        on_created: OnCreated | None = None,
        on_disposed: OnDisposed | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        super().__init__()
        self.actor_dispatcher = dispatcher
        self._on_created = on_created
        self._on_disposed = on_disposed
        self._refs: dict[str, ActorRef[Any]] = {}

    def create(self, id_: str, factory: Callable[[], ActorRef[Any]]) -> ActorRef[Any]:
        """Start an actor under a new unique id; ``DuplicateIdError`` if it is taken."""
        if id_ in self._refs:
            raise DuplicateIdError(id_)
        ref = factory()
        self._refs[id_] = ref
        self._announce_created(id_, ref)
        return ref

    def create_many(
        self, items: Sequence[tuple[str, Callable[[], ActorRef[Any]]]]
    ) -> list[ActorRef[Any]]:
        """:meth:`create` for many ids in one message (a batch spawn: one hand-off to
        the registry instead of one per actor). All or nothing: a taken or repeated id
        refuses the whole batch (``DuplicateIdError``) before any factory runs; a
        factory that raises stops the actors this batch started before it (none is
        registered or announced yet), and the error propagates."""
        ids = [id_ for id_, _ in items]
        seen: set[str] = set()
        for id_ in ids:
            if id_ in self._refs or id_ in seen:
                raise DuplicateIdError(id_)
            seen.add(id_)
        refs: list[ActorRef[Any]] = []
        try:
            for _, factory in items:
                refs.append(factory())
        except BaseException:
            for ref in refs:
                ref.stop(block=False)
            raise
        self._refs.update(zip(ids, refs, strict=True))
        for id_, ref in zip(ids, refs, strict=True):
            self._announce_created(id_, ref)
        return refs

    def rebind(self, id_: str, ref: ActorRef[Any]) -> None:
        """Point a registered id at a new actor (the same registration, a new actor:
        e.g. an agent rehydrated after passivation). Nothing is announced."""
        if id_ not in self._refs:
            raise KeyError(f"id {id_!r} is not registered; create it first")
        self._refs[id_] = ref

    def get(self, id_: str) -> ActorRef[Any] | None:
        return self._refs.get(id_)

    def ids(self) -> list[str]:
        return list(self._refs)

    def remove(self, id_: str, *, stop: bool = True, announce: bool = True) -> bool:
        """Forget ``id_``; False if it was unknown. ``announce=False``: the caller
        announces the disposal itself, off the registry's worker (a listener there may
        ask the registry, which an announcement run on that worker would wait for): at
        once for ``stop=False``, from its own watch of the actor's death otherwise."""
        ref = self._refs.pop(id_, None)
        if ref is None:
            return False
        if not announce:
            if stop and ref.is_alive():
                ref.stop(block=False)
            return True
        if not stop:
            self._announce_disposed(id_)
            return True
        inbox = ref.actor_inbox
        if ref.is_alive():
            ref.stop(block=False)
        if isinstance(inbox, Mailbox):
            inbox.watch(lambda _death: self._announce_disposed(id_))
        else:
            self._announce_disposed(id_)
        return True

    def _announce_created(self, id_: str, ref: ActorRef[Any]) -> None:
        try:
            if self._on_created is not None:
                self._on_created(id_, ref)
        except Exception:
            logger.exception("announcing the creation of %r failed", id_)

    def _announce_disposed(self, id_: str) -> None:
        try:
            if self._on_disposed is not None:
                self._on_disposed(id_)
        except Exception:
            logger.exception("announcing the disposal of %r failed", id_)
