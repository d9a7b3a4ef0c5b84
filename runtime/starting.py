"""Starting agents: the sequences behind ``spawn``, ``spawn_many``, ``resume`` and ``fork``.

Each builds the agent's slot, handle and parts over its session, registers its actor
with the registry and has the actor announce it (``agent/created``, then
``agent/session-start``) before anything else; a start that fails part way is undone.
The table (``runtime.table``) owns what a start changes (pending, live, claimed by a
close); this module only sequences it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import count
from typing import Any, Literal

from pykka import ActorRef
from pykka.messages import ProxyCall

from actors import (
    Announce,
    Model,
    Tool,
    UsageLimits,
    UsageMeter,
    waiting_for,
    waiting_on_actors,
)
from storage import Session, Store, UnknownSessionError

from .agent import Agent
from .assembly import Parts, Spec
from .checks import check_header
from .errors import RuntimeClosedError
from .host import RuntimeHost
from .messages import MessageChecker
from .slots import AgentSlot
from .spawning import Announcements
from .table import AgentTable

__all__ = ["Starter"]


def _logged_system(session: Session) -> str | None:
    """The system prompt ``session``'s log last recorded: the one of its latest
    ``request/header`` (None if it never sent a request)."""
    header = session.state.last_header
    return None if header is None else header.system


class Starter:
    """Starts a runtime's agents into its ``table``."""

    def __init__(
        self,
        table: AgentTable,
        store: Store,
        *,
        id_prefix: str,
        meter: UsageMeter | None,
        agent_limits: UsageLimits | None,
    ) -> None:
        self._table = table
        self._store = store
        self._host = RuntimeHost(table, store)  # what the agents' handles call
        self._meter = meter
        self._agent_limits = agent_limits
        self._id_prefix = id_prefix
        self._ids = count(1)
        # Every agent's messages are checked alike (new ids from this runtime's counter):
        # one checker for them all.
        self._checker = MessageChecker(self._new_message_id, store.codec.max_event_bytes)

    def _new_message_id(self) -> str:
        return f"m-{self._id_prefix}-{next(self._ids)}"

    def _spec(
        self,
        agent_id: str,
        model: Model,
        tools: dict[str, Tool],
        system: str | None,
        limits: UsageLimits | None,
        shared: Spec | None = None,
    ) -> Spec:
        """What agent ``agent_id`` is made of: ``shared`` (one spec for the agents of a
        batch, kept by each for as long as it exists) unless it has a meter of its own."""
        own = limits if limits is not None else self._agent_limits
        if own is None and shared is not None:
            return shared
        runtime = () if self._meter is None else (self._meter,)
        mine = () if own is None else (UsageMeter(own, f"agent {agent_id}"),)
        return Spec(model=model, tools=tools, system=system, meters=mine + runtime)

    def start_many(
        self,
        size: int,
        model: Model,
        tools: dict[str, Tool],
        system: str | None,
        limits: UsageLimits | None,
    ) -> list[Agent]:
        """:meth:`start` for ``size`` new sessions: one registry message for them all,
        every announcement told before the spawning thread waits (not on a runtime
        thread: no cycle of waits can go through this one, see spawn_many)."""
        table = self._table
        built: list[tuple[AgentSlot[Agent], Session, Parts]] = []
        shared = self._spec("", model, tools, system, None)
        for session in self._store.create_sessions(size):
            spec = self._spec(session.id, model, tools, system, limits, shared)
            slot: AgentSlot[Agent] = AgentSlot(session, spec)
            slot.handle = Agent(slot, self._host, checker=self._checker)
            built.append((slot, session, table.assemble(slot, session, spec)))
        refs: list[ActorRef[Any]] = []
        announced: list[AgentSlot[Agent]] = []
        failure: BaseException | None = None
        try:
            for slot, _, _ in built:
                table.add_pending(slot)
            factories = [parts.start for _, _, parts in built]
            create = ProxyCall(attr_path=("create_many",), args=(factories,), kwargs={})
            with waiting_on_actors():
                refs = table.registry.ask(create, block=True)
            announcements: Announcements[AgentSlot[Agent]] = Announcements(len(refs))
            for (slot, session, parts), ref in zip(built, refs, strict=True):
                announce = partial(table.announce, slot, session, ref, parts, "startup")
                ref.tell(Announce(callback=partial(announcements.run, slot, announce)))
            with waiting_on_actors():
                announcements.wait()
            announced, failure = announcements.done, announcements.failure
        except BaseException as err:  # noqa: BLE001 -- the batch's start failed: undone below
            failure = err
        if failure is None:
            return [slot.handle for slot, _, _ in built]
        live = set(map(id, announced))
        for index, (slot, session, _) in enumerate(built):
            if id(slot) not in live:
                table.forget_start(slot, session, refs[index] if index < len(refs) else None)
        if table.closed and isinstance(failure, Exception):
            raise RuntimeClosedError from failure
        raise failure

    def start_logged(
        self,
        session: Session,
        model: Model,
        tools: dict[str, Tool],
        system: str | None,
        limits: UsageLimits | None,
        source: Literal["startup", "resume"],
    ) -> Agent:
        """:meth:`start` over a session with a log (resumed or forked): ``system``
        defaults to the system prompt the log last recorded, whose header with these
        tools is checked here (before a resume writes anything; a fork has seeded its
        session, which the error names)."""
        if system is None:
            system = _logged_system(session)
            try:
                check_header(self._store.codec, model, tools, system)
            except (TypeError, ValueError) as err:
                what = "forked into" if source == "startup" else "resumed from"
                raise type(err)(
                    f"{err} (the system prompt {what} session {session.id!r}'s log; give "
                    "a shorter system=, or fewer tools)"
                ) from None
        return self.start(session, model, tools, system, limits, source)

    def open_logged(self, session_id: str, open_: Callable[..., Session], *args: object) -> Session:
        """``open_(*args)`` (the store's ``open_session`` or ``fork``), its "no such
        session" error told in the runtime's terms: the store's own message points at
        ``Store.create_session``, which a runtime user does not call."""
        try:
            return open_(*args)
        except UnknownSessionError as err:
            raise UnknownSessionError(
                f"no session {session_id!r} in {self._store.path}; start an agent with "
                f"that id with rt.spawn(session_id={session_id!r}, model=...), "
                "or pick one that exists (rt.store.sessions() lists them)"
            ) from err

    def start(
        self,
        session: Session,
        model: Model,
        tools: dict[str, Tool],
        system: str | None,
        limits: UsageLimits | None,
        source: Literal["startup", "resume"],
    ) -> Agent:
        """Start an agent over ``session`` and announce it; a resume first closes its
        open tail turn durably (CONTRACT 7), seen by ``session/event`` listeners like
        any append."""
        table = self._table
        spec = self._spec(session.id, model, tools, system, limits)
        slot: AgentSlot[Agent] = AgentSlot(session, spec)
        handle = slot.handle = Agent(slot, self._host, checker=self._checker)
        agent_id = session.id
        if source == "resume":
            table.bridge_if_listened(slot)
            if session.repair():
                session.flush()  # repaired durably by the time resume returns
        parts = table.assemble(slot, session, spec)
        ref: ActorRef[Any] | None = None
        try:
            table.add_pending(slot)
            create = ProxyCall(attr_path=("create",), args=(parts.start,), kwargs={})
            # Both asks wait for other actors: on a dispatcher worker (a sync listener
            # that spawns) the dispatcher lends a worker meanwhile, or a few such
            # listeners at once would hold every worker while the registry and the new
            # actors wait for one. The wait is registered before the new actor can run
            # (a listener of its announcement that waits for the caller's agent is
            # refused: it would close a cycle; see actors.waiting_for).
            with waiting_for(parts.inbox, f"agent {agent_id} to start"):
                ref = table.registry.ask(create, block=True)
                # The actor's first message: nothing can be sent to it before (the handle
                # is bound by it), so whatever the listeners send waits behind it.
                announce = partial(table.announce, slot, session, ref, parts, source)
                ref.ask(Announce(callback=announce), block=True)
        except BaseException as err:
            table.forget_start(slot, session, ref)
            if table.closed and isinstance(err, Exception):  # a close() ended this start
                raise RuntimeClosedError from err  # (claimed it, stopped the registry, ...)
            raise
        return handle
