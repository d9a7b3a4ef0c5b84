"""``Runtime``: the facade over one store, one dispatcher, one I/O side and one bus.

``Runtime.open()`` is a context manager; ``close()`` cancels running turns (keeping
their inboxes for a later resume), stops every agent, flushes and closes the store.

Beside the facade this module holds the agents' start gating (spawn, resume and fork
under way; a start a close gave up on) and the transitions of their slots that need the
runtime (going live, rehydration, disposal, death), which is why it is over 500 lines:
they all change the runtime's table of agents (live, pending, resuming) under its one
lock, with ``get``, ``agents``, ``on`` and ``close``. Elsewhere: the per-agent lifecycle
(``slots``), the close stages (``close``), the ``session/event`` bridge (``bridge``),
building an agent's parts (``assembly``), the checks made before anything starts
(``checks``), messages (``messages``) and the error tree (``errors``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from itertools import count
from typing import Any, Literal

from pykka import ActorDeadError, ActorRef, Timeout
from pykka.messages import ProxyCall

from actors import (
    AGENT_EVENTS,
    ActorDeath,
    Admission,
    AgentCreated,
    AgentDisposed,
    AgentDisposedError,
    AgentSessionStart,
    Announce,
    AwaitIdle,
    Bus,
    Cancel,
    Dispatcher,
    DispatcherShutdownError,
    Durability,
    FlushGroup,
    IoSide,
    Model,
    RegistryActor,
    Scheduler,
    Tool,
    UsageLimits,
    UsageMeter,
    deadline,
    extended,
    forget,
    in_nonblocking_thread,
    in_runtime_thread,
    remaining,
    waiting_for,
    waiting_on_actors,
    watch,
)
from storage import (
    DiskFullError,
    DisposedCause,
    Session,
    Store,
    UnknownSessionError,
    check_session_id,
)

from . import gctune, waiting
from .agent import Agent
from .assembly import Assembly, Parts, Spec
from .bridge import SessionBridge
from .checks import (
    agent_settings,
    check_arity,
    check_count,
    check_flag,
    check_header,
    check_limits,
)
from .close import (
    CloseStages,
    Deadline,
    Stage,
    close_models,
    shut_down_dispatcher,
    stop_registry,
    stop_stragglers,
)
from .errors import RuntimeClosedError
from .policy import RetryPolicy
from .slots import AgentSlot
from .spawning import SPAWN_BATCH, Announcements
from .supervision import RestartPolicy, Supervision
from .waiting import check_timeout

__all__ = ["Runtime"]

log = logging.getLogger("corral.runtime")
_DURABILITY = ("write-ahead", "turn", "none")
_DEFAULT_POLICY: Any = object()
_UNDO_S = 5.0
"""What each part of a runtime whose open failed gets to stop (it ran nothing yet)."""


def _logged_system(session: Session) -> str | None:
    """The system prompt ``session``'s log last recorded: the one of its latest
    ``request/header`` (None if it never sent a request)."""
    header = session.state.last_header
    return None if header is None else header.system


def _dispatcher(threads: int | None) -> Dispatcher:
    """``threads`` workers; by default, under a GIL, one worker plus a standby one that
    steps in while it is stuck in a blocking listener: two busy workers would only
    contend for the GIL (bench_turns measures ~25% more turns/s with one)."""
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    if threads is None and gil:
        return Dispatcher(1, standby=1, name="corral")
    return Dispatcher(threads, name="corral")


class Runtime:
    """Hosts agents. Build with :meth:`open`."""

    def __init__(
        self,
        store: Store,
        *,
        durability: Durability = "write-ahead",
        threads: int | None = None,
        blocking_workers: int = 32,
        retry_policy: RetryPolicy | None = _DEFAULT_POLICY,
        max_steps: int | None = None,
        inbox_limit: int | None = None,
        limits: UsageLimits | None = None,
        agent_limits: UsageLimits | None = None,
        max_running_turns: int | None = None,
        owns_store: bool = True,
        tune_gc: bool = True,
    ) -> None:
        if durability not in _DURABILITY:
            raise ValueError(f"durability must be one of {_DURABILITY}, got {durability!r}")
        check_flag("tune_gc", tune_gc)
        check_count("threads", threads)
        check_count("blocking_workers", blocking_workers, optional=False)
        check_count("max_steps", max_steps)
        check_count("inbox_limit", inbox_limit)
        check_limits("limits", limits)
        check_limits("agent_limits", agent_limits)
        if (
            retry_policy is not None
            and retry_policy is not _DEFAULT_POLICY
            and not callable(retry_policy)
        ):
            raise TypeError(
                "retry_policy must be an agent/request-error listener (e.g. RetryPolicy()) "
                f"or None, got {retry_policy!r}"
            )
        if retry_policy is not None and retry_policy is not _DEFAULT_POLICY:
            check_arity("agent/request-error", retry_policy)
        self.store = store
        self.durability: Durability = durability
        self.max_steps = max_steps
        self.inbox_limit = inbox_limit
        self.agent_limits = agent_limits
        self._meter = None if limits is None else UsageMeter(limits, "the runtime")
        self._admission = None if max_running_turns is None else Admission(max_running_turns)
        self._owns_store = owns_store
        self._tuned_gc = tune_gc
        self._lock = threading.Lock()
        # The live and passivated agents, by id (their handles: slot.handle).
        self._agents: dict[str, AgentSlot[Agent]] = {}
        self._host = _Host(self)  # what the agents' handles call (runtime.slots.AgentHost)
        self._starting = 0  # spawns, resumes and forks under way: see _starting_agent()
        # The sessions of the resumes among them, until their agent is live (each held
        # by its resume's token).
        self._resuming: dict[str, object] = {}
        # Agents being started: registered, not announced yet. Not in _agents (get() and
        # agents() hand out live agents only) until their actor announces them.
        self._pending: dict[str, AgentSlot[Agent]] = {}
        # A close() gave up waiting for the starts under way: it claimed those pending,
        # and one that was not pending yet is refused when it gets there (see _start).
        self._starts_claimed = False
        self._started = threading.Condition(self._lock)
        self._models: dict[int, Model] = {}
        self._scoped: dict[str, set[Callable[[], None]]] = {}  # agent id -> its disposers
        self._closed = False  # close() began: nothing new starts
        self._close = CloseStages(self._close_stages())  # what no close() has done yet
        self._supervisions: list[Supervision] = []  # (closed by close(): no restart)
        self._closing_agents: list[AgentSlot[Agent]] = []  # the agents close() stops
        self._disposals_cut: str | None = None  # what interrupted close's wait for them
        self._released = False  # close() let go of the store: nothing can be read
        self._id_prefix = uuid.uuid4().hex[:12]
        self._ids = count(1)
        # What is started here is stopped again if a later part fails to start (out of
        # threads, say): a failed open leaves nothing running and the GC as it was.
        with contextlib.ExitStack() as undo:
            if tune_gc:
                gctune.tune_gc()
                undo.callback(gctune.release_gc_tuning)
            self.dispatcher = _dispatcher(threads)
            undo.callback(self.dispatcher.shutdown, _UNDO_S)
            self.io = IoSide(
                blocking_workers=blocking_workers, dead_letters=self.dispatcher.dead_letters
            )
            undo.callback(self.io.close, _UNDO_S)
            self.scheduler = Scheduler(dead_letters=self.dispatcher.dead_letters)
            undo.callback(self.scheduler.close, _UNDO_S)
            self.bus = Bus(self.io)
            self._bridge = SessionBridge(self.bus, self._lock)  # session/event
            # The agents' durability waits: one log flush per round of the run queue.
            flushes = FlushGroup(store, self.dispatcher)
            self._assembly = Assembly(
                bus=self.bus,
                io=self.io,
                scheduler=self.scheduler,
                dispatcher=self.dispatcher,
                flushes=flushes,
                durability=durability,
                max_steps=max_steps,
                inbox_limit=inbox_limit,
                admission=self._admission,
            )
            # The registry announces nothing: a new agent is announced by its own actor
            # (see _announce), a disposal by the runtime's death watch or the disposer
            # (_on_death, _forget), never on the registry's worker, which their listeners
            # may ask.
            self._registry: ActorRef[RegistryActor] = RegistryActor.start(
                on_created=_announced_elsewhere,
                on_disposed=_announced_elsewhere,
                dispatcher=self.dispatcher,
            )
            undo.callback(self._registry.stop, timeout=_UNDO_S)
            # (Under the undo too: a Ctrl-C here left everything above running.)
            if retry_policy is _DEFAULT_POLICY:
                retry_policy = RetryPolicy()
            if retry_policy is not None:
                # Innermost, whenever the others are added: every rt.on / agent.on
                # listener sees a failure first and may own its recovery; the policy
                # decides what they pass on with next().
                self.bus.on("agent/request-error", retry_policy, last=True)
            # A script that ends without close() still closes: sends not handled yet are
            # logged (pending, for a resume), running turns end aborted, all flushed.
            self._close_at_exit = _close_at_exit(weakref.ref(self))
            atexit.register(self._close_at_exit)
            undo.callback(atexit.unregister, self._close_at_exit)
            undo.pop_all()  # opened: close() stops it all from here

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        durability: Durability = "write-ahead",
        threads: int | None = None,
        retry_policy: RetryPolicy | None = _DEFAULT_POLICY,
        max_steps: int | None = None,
        inbox_limit: int | None = None,
        limits: UsageLimits | None = None,
        agent_limits: UsageLimits | None = None,
        max_running_turns: int | None = None,
        tune_gc: bool = True,
        blocking_workers: int = 32,
        max_event_bytes: int = 4 << 20,
        map_size: int = 64 << 20,
        hooks: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    ) -> Runtime:
        """Open a runtime over the embedded LMDB store at ``path`` (default ``./.corral/``).

        - ``durability``: ``"write-ahead"`` (the facts leading to a model request or a
          tool run are durable before it is sent or run), ``"turn"`` (durable at each
          settled turn) or ``"none"`` (durable at ``flush()``).
        - ``threads``: dispatcher workers; ``None`` is one worker plus a standby that
          steps in while the worker is stuck in a blocking handler.
        - ``retry_policy``: the ``agent/request-error`` listener deciding retries
          (default ``RetryPolicy()``; ``None`` for no retries); the innermost one, so
          listeners added with ``on`` see each failure first.
        - ``max_steps`` per turn, ``inbox_limit`` per agent (``InboxFullError`` past
          it), ``limits`` (``UsageLimits`` of the whole runtime), ``agent_limits`` (of
          each agent), ``max_running_turns`` (more wait in a FIFO queue): ``None`` is
          no limit.
        - ``tune_gc``: raise the garbage collector's thresholds while the runtime runs
          (many small long-lived objects; see :mod:`runtime.gctune`).
        - ``blocking_workers``: threads for sync tool bodies, listeners and blocking
          effects.
        - ``max_event_bytes`` (4 MiB) and ``map_size`` (64 MiB, grows by itself): the
          store's record limit and initial map.
        - ``hooks``: a Claude Code / Codex command-hook settings file (or its mapping)
          whose hooks run for every agent (see :mod:`runtime.hooks`, docs/hooks.md).
        """
        if durability not in _DURABILITY:
            raise ValueError(f"durability must be one of {_DURABILITY}, got {durability!r}")
        check_count("max_event_bytes", max_event_bytes, optional=False)
        check_count("map_size", map_size, optional=False)
        check_flag("tune_gc", tune_gc)
        store = Store.open(
            path, durability=durability, max_event_bytes=max_event_bytes, map_size=map_size
        )
        try:
            rt = cls(
                store,
                durability=durability,
                threads=threads,
                blocking_workers=blocking_workers,
                retry_policy=retry_policy,
                max_steps=max_steps,
                inbox_limit=inbox_limit,
                limits=limits,
                agent_limits=agent_limits,
                max_running_turns=max_running_turns,
                tune_gc=tune_gc,
            )
        except BaseException:
            store.close()
            raise
        if hooks is not None:
            from .hooks import install  # noqa: PLC0415 - only a runtime with hooks loads it

            try:
                install(rt, hooks)
            except BaseException:
                rt.close()
                raise
        return rt

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ events

    def on(self, name: str, listener: Callable[..., Any]) -> Callable[[], None]:
        """Listen to a live event of every agent; returns a disposer."""
        return self._listen(name, listener, None)

    def _listen(
        self, name: str, listener: Callable[..., Any], owner: AgentSlot[Agent] | None
    ) -> Callable[[], None]:
        """Register ``listener``; with ``owner``, for that agent's events only, and only
        while that handle is the live one of its id: a disposed agent's handle is
        refused even after its session was resumed under the same id (a new handle)."""
        if not callable(listener):
            raise TypeError(f"a listener must be callable, got {listener!r}")
        if type(name) is not str:
            raise TypeError(f"a live event name is a str, got {name!r}")
        if name not in AGENT_EVENTS:
            known = ", ".join(sorted(AGENT_EVENTS))
            raise ValueError(f"unknown live event {name!r}; known: {known}")
        check_arity(name, listener)
        session_event = name == "session/event"
        scope = None if owner is None else owner.id
        with self._lock:  # atomic with the disposal's sweep of the agent's listeners
            self._check_open()
            if scope is not None and self._agents.get(scope) is not owner:
                resumed = scope in self._agents  # the id lives on in a new handle
                since = f"; rt.get({scope!r}) returns its resumed agent" if resumed else ""
                raise AgentDisposedError(
                    f"agent {scope} is disposed; a listener of it would never be called{since}"
                )
            dispose = self.bus.on(name, listener, scope=scope)
            if session_event:
                dispose = self._bridge.counted(dispose)  # (bridging from now on)
                agents = self._agents
                slots = list(agents.values()) if scope is None else [agents[scope]]
            if scope is not None:
                dispose = self._scoped_disposer(scope, dispose)
        if session_event:
            for slot in slots:  # before returning: the listener sees every later append
                self._bridge.bridge(slot)
        return dispose

    def _scoped_disposer(self, scope: str, dispose: Callable[[], None]) -> Callable[[], None]:
        """``dispose``, also called when the agent ``scope`` is disposed (its listeners
        go with it: a long-lived runtime would otherwise keep every disposed agent's).
        Under ``self._lock``."""
        disposers = self._scoped.setdefault(scope, set())

        def dispose_scoped() -> None:
            with self._lock:
                disposers.discard(dispose_scoped)
            dispose()

        disposers.add(dispose_scoped)
        return dispose_scoped

    # ------------------------------------------------------------------ agents

    def _new_message_id(self) -> str:
        return f"m-{self._id_prefix}-{next(self._ids)}"

    def spawn(
        self,
        *,
        model: Model | str,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        session_id: str | None = None,
        system: str | None = None,
        limits: UsageLimits | None = None,
        restart: RestartPolicy | None = None,
    ) -> Agent:
        """Create an agent with a new session. It stays idle until a waking send.

        ``limits`` caps this agent's model requests and tokens (default: the runtime's
        ``agent_limits``). ``restart``: resume it from its log when it crashes, within
        that policy (see :mod:`runtime.supervision`: after a restart ``rt.get(id)`` is
        the new handle)."""
        self._check_open()
        resolved, tool_map = agent_settings(self.store.codec, model, tools, system, limits)
        with self._starting_agent():
            session = self.store.create_session(session_id)
            agent = self._start(session, resolved, tool_map, system, limits, "startup")
        if restart is not None:
            resume = partial(self.resume, agent.id, model=model, tools=tools, limits=limits)
            self._supervise(agent, restart, resume)
        return agent

    def _supervise(self, agent: Agent, policy: RestartPolicy, resume: Callable[[], Agent]) -> None:
        """Put ``agent`` under a :class:`~runtime.supervision.Supervision` (its restarts
        resume it with ``resume``)."""
        if not isinstance(policy, RestartPolicy):
            raise TypeError(f"restart is a RestartPolicy or None, got {policy!r}")

        def ref_of(handle: Agent) -> ActorRef[Any]:
            with self._lock:
                slot = self._agents.get(handle.id)
            if slot is None or slot.handle is not handle or slot.ref is None:
                raise AgentDisposedError(f"agent {handle.id} is no longer running")
            return slot.ref

        supervision = Supervision(
            agent.id,
            policy,
            scheduler=self.scheduler,
            bus=self.bus,
            ref_of=ref_of,
            resume=resume,
        )
        with self._lock:
            self._supervisions.append(supervision)
        supervision.adopt(agent)

    def spawn_many(
        self,
        count: int,
        *,
        model: Model | str,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        system: str | None = None,
        limits: UsageLimits | None = None,
    ) -> list[Agent]:
        """``count`` agents, each with a new session, made as ``count`` calls of
        :meth:`spawn` with these arguments would make them (each announced on its own
        actor by ``agent/created`` then ``agent/session-start``), in spawn order. Faster:
        the settings are checked once, the sessions made together, the registry starts
        a few hundred actors per message, and the announcements run while the spawning
        thread waits once for them all.

        Called on a thread of the runtime (a listener, a tool body) it spawns them one
        at a time, as :meth:`spawn` does there (each wait registered for cycle
        detection). If it fails part way (the runtime closed), the agents announced
        before the failure stay (``rt.agents()``)."""
        self._check_open()
        if type(count) is not int or count < 0:
            raise ValueError(f"count is the number of agents to spawn (an int >= 0), got {count!r}")
        if in_runtime_thread():
            return [
                self.spawn(model=model, tools=tools, system=system, limits=limits)
                for _ in range(count)
            ]
        resolved, tool_map = agent_settings(self.store.codec, model, tools, system, limits)
        agents: list[Agent] = []
        with self._starting_agent():
            for first in range(0, count, SPAWN_BATCH):
                size = min(SPAWN_BATCH, count - first)
                agents += self._start_many(size, resolved, tool_map, system, limits)
        return agents

    def _start_many(
        self,
        size: int,
        model: Model,
        tools: dict[str, Tool],
        system: str | None,
        limits: UsageLimits | None,
    ) -> list[Agent]:
        """:meth:`_start` for ``size`` new sessions: one registry message for them all,
        every announcement told before the spawning thread waits (not on a runtime
        thread: no cycle of waits can go through this one, see spawn_many)."""
        built: list[tuple[AgentSlot[Agent], Session, Parts]] = []
        for session in self.store.create_sessions(size):
            meters = self._meters_for(session.id, limits)
            spec = Spec(model=model, tools=tools, system=system, meters=meters)
            slot: AgentSlot[Agent] = AgentSlot(session, spec)
            slot.handle = Agent(
                slot,
                self._host,
                new_id=self._new_message_id,
                max_message_bytes=self.store.codec.max_event_bytes,
            )
            built.append((slot, session, self._assemble(slot, session, spec)))
        refs: list[ActorRef[Any]] = []
        announced: list[AgentSlot[Agent]] = []
        failure: BaseException | None = None
        try:
            for slot, _, _ in built:
                self._add_pending(slot)
            items = [(slot.id, parts.start) for slot, _, parts in built]
            create = ProxyCall(attr_path=("create_many",), args=(items,), kwargs={})
            with waiting_on_actors():
                refs = self._registry.ask(create, block=True)
            announcements: Announcements[AgentSlot[Agent]] = Announcements(len(refs))
            for (slot, session, parts), ref in zip(built, refs, strict=True):
                announce = partial(self._announce, slot, session, ref, parts, "startup")
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
                self._forget_start(slot, session, refs[index] if index < len(refs) else None)
        if self._closed and isinstance(failure, Exception):
            raise RuntimeClosedError from failure
        raise failure

    def _forget_start(
        self, slot: AgentSlot[Agent], session: Session, ref: ActorRef[Any] | None
    ) -> None:
        """Undo what a failed start of ``slot`` did (it was never announced)."""
        agent_id = slot.id
        with self._lock:
            self._pending.pop(agent_id, None)
            if self._agents.get(agent_id) is slot:
                del self._agents[agent_id]
            if ref is not None and slot.ref is ref:  # (_go_live's)
                slot.registered = False
            if slot.bridged is session:
                slot.bridged = None
        if ref is not None:  # registered, never announced: nothing may keep it running
            self._unstart(agent_id, ref)

    def resume(
        self,
        session_id: str,
        *,
        model: Model | str,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        system: str | None = None,
        limits: UsageLimits | None = None,
    ) -> Agent:
        """Rebuild an agent from its durable log: repair an open tail turn, restore the
        inbox from its splices, continue turn numbers. It stays idle until a waking send.

        ``system`` defaults to the system prompt the log last recorded (its latest
        ``request/header``; none if the session never sent a request); one given here
        replaces it, and the next ``request/header`` records the change (``""`` sends no
        system prompt). ``tools`` and ``limits`` are not in the log: give them again."""
        self._check_open()
        check_session_id(session_id)
        resolved, tool_map = agent_settings(self.store.codec, model, tools, system, limits)
        with self._starting_agent(resuming=session_id):
            opened = self._open_logged(session_id, self.store.open_session, session_id)
            return self._start_logged(opened, resolved, tool_map, system, limits, "resume")

    def fork(
        self,
        source_id: str,
        boundary: int,
        *,
        model: Model | str,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        session_id: str | None = None,
        system: str | None = None,
        limits: UsageLimits | None = None,
    ) -> Agent:
        """A new agent whose session is seeded with ``source_id``'s log up to ``boundary``
        (an inclusive seq that must not end inside an open turn). Turn numbers continue;
        the parent's pending inbox is not inherited. ``system`` defaults to the system
        prompt the seeded prefix last recorded, as for :meth:`resume`."""
        self._check_open()
        check_session_id(source_id)
        if type(boundary) is not int:
            raise TypeError(
                f"boundary is the int seq of the last event to inherit, got {boundary!r}"
            )
        resolved, tool_map = agent_settings(self.store.codec, model, tools, system, limits)
        with self._starting_agent():
            opened = self._open_logged(source_id, self.store.fork, source_id, boundary, session_id)
            return self._start_logged(opened, resolved, tool_map, system, limits, "startup")

    def _start_logged(
        self,
        session: Session,
        model: Model,
        tools: dict[str, Tool],
        system: str | None,
        limits: UsageLimits | None,
        source: Literal["startup", "resume"],
    ) -> Agent:
        """:meth:`_start` over a session with a log (resumed or forked): ``system``
        defaults to the system prompt the log last recorded, whose header with these
        tools is checked here (before a resume writes anything; a fork has seeded its
        session, which the error names)."""
        if system is None:
            system = _logged_system(session)
            try:
                check_header(self.store.codec, model, tools, system)
            except (TypeError, ValueError) as err:
                what = "forked into" if source == "startup" else "resumed from"
                raise type(err)(
                    f"{err} (the system prompt {what} session {session.id!r}'s log; give "
                    "a shorter system=, or fewer tools)"
                ) from None
        return self._start(session, model, tools, system, limits, source)

    def _open_logged(
        self, session_id: str, open_: Callable[..., Session], *args: object
    ) -> Session:
        """``open_(*args)`` (the store's ``open_session`` or ``fork``), its "no such
        session" error told in the runtime's terms: the store's own message points at
        ``Store.create_session``, which a runtime user does not call."""
        try:
            return open_(*args)
        except UnknownSessionError as err:
            raise UnknownSessionError(
                f"no session {session_id!r} in {self.store.path}; start an agent with "
                f"that id with rt.spawn(session_id={session_id!r}, model=...), "
                "or pick one that exists (rt.store.sessions() lists them)"
            ) from err

    @contextmanager
    def _starting_agent(self, *, resuming: str | None = None) -> Iterator[None]:
        """Held by a spawn, resume or fork from before it touches the store until its
        agent is registered and live (or it failed). :meth:`close` refuses new ones and
        waits for those under way before it stops every agent: an agent started while
        it swept would be left running over a closed store.

        ``resuming``: the session a resume rebuilds, one resume at a time per id (a
        second one would open the session again, so the first one's session object
        would refuse every later append, and its failed start would unregister the
        agent the first one started)."""
        with self._lock:
            self._check_open()  # again, under the lock close() takes to set it
            if resuming is not None:
                taken = (self._agents, self._pending, self._resuming)
                if any(resuming in ids for ids in taken):
                    raise ValueError(
                        f"agent {resuming!r} is already in this runtime (live, passivated or "
                        f"being resumed); rt.get({resuming!r}) returns it"
                    )
                self._resuming[resuming] = token = object()
            self._starting += 1
        try:
            yield
        finally:
            with self._lock:
                self._starting -= 1
                if resuming is not None and self._resuming.get(resuming) is token:
                    del self._resuming[resuming]  # (a live agent releases it at once)
                if not self._starting:
                    self._started.notify_all()

    def _start(
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
        meters = self._meters_for(session.id, limits)
        spec = Spec(model=model, tools=tools, system=system, meters=meters)
        slot: AgentSlot[Agent] = AgentSlot(session, spec)
        handle = slot.handle = Agent(
            slot,
            self._host,
            new_id=self._new_message_id,
            max_message_bytes=self.store.codec.max_event_bytes,
        )
        agent_id = session.id
        if source == "resume":
            with self._lock:
                bridging = self._bridge.bridging
            if bridging:
                self._bridge.bridge(slot)
            if session.repair():
                session.flush()  # repaired durably by the time resume returns
        parts = self._assemble(slot, session, spec)
        ref: ActorRef[Any] | None = None
        try:
            self._add_pending(slot)
            create = ProxyCall(attr_path=("create",), args=(agent_id, parts.start), kwargs={})
            # Both asks wait for other actors: on a dispatcher worker (a sync listener
            # that spawns) the dispatcher lends a worker meanwhile, or a few such
            # listeners at once would hold every worker while the registry and the new
            # actors wait for one. The wait is registered before the new actor can run
            # (a listener of its announcement that waits for the caller's agent is
            # refused: it would close a cycle; see actors.waiting_for).
            with waiting_for(parts.inbox, f"agent {agent_id} to start"):
                ref = self._registry.ask(create, block=True)
                # The actor's first message: nothing can be sent to it before (the handle
                # is bound by it), so whatever the listeners send waits behind it.
                announce = partial(self._announce, slot, session, ref, parts, source)
                ref.ask(Announce(callback=announce), block=True)
        except BaseException as err:
            self._forget_start(slot, session, ref)
            if self._closed and isinstance(err, Exception):  # a close() ended this start
                raise RuntimeClosedError from err  # (claimed it, stopped the registry, ...)
            raise
        return handle

    def _add_pending(self, slot: AgentSlot[Agent]) -> None:
        """``slot``'s start is under way: pending until its actor announces it (see
        _announce). ``RuntimeClosedError`` if a close() gave up waiting for the starts
        under way (it claimed those pending then): this one ends here, never announced."""
        with self._lock:
            if self._starts_claimed:
                raise RuntimeClosedError
            self._pending[slot.id] = slot

    def _unstart(self, agent_id: str, ref: ActorRef[Any]) -> None:
        """Stop the actor of a start that failed (or that a close gave up on) and take
        it out of the registry; nothing is announced (it never was)."""
        self._unregister(agent_id, stop=False)
        # Stopped here, not by the registry: a close() may stop the registry, or the
        # dispatcher, before the registry got to it.
        with contextlib.suppress(ActorDeadError, DispatcherShutdownError):
            ref.stop(block=False)
        if self.dispatcher.is_shut_down:  # (by a close): that stop may have been refused;
            forget(ref)  # the actor never ran anything but its start: pykka forgets it

    def _announce(
        self,
        slot: AgentSlot[Agent],
        session: Session,
        ref: ActorRef[Any],
        parts: Parts,
        source: Literal["startup", "resume"],
    ) -> None:
        """On the new agent's actor, before anything else: make the handle live, then
        ``agent/created`` and ``agent/session-start`` (CONTRACT 2). A send from their
        listeners (allowed: the handle is live) is handled after both, so the agent's
        first turn never starts between them. From here ``rt.get`` and ``rt.agents()``
        return the agent (not before: its handle could not be used yet)."""
        self._go_live(slot, session, ref, parts)
        agent_id, handle = slot.id, slot.handle
        with self._lock:
            claimed = self._pending.pop(agent_id, None) is not slot
            if not claimed:
                self._agents[agent_id] = slot
                self._resuming.pop(agent_id, None)  # _agents keeps a second resume out
        if claimed:  # by a close() that gave up waiting for this start: it ends here
            raise RuntimeClosedError
        with parts.inbox.queueing_sends():  # what their listeners send comes after both
            self.bus.emit("agent/created", AgentCreated(agent=handle), scope=agent_id)
            start = AgentSessionStart(agent=handle, source=source)
            self.bus.emit("agent/session-start", start, scope=agent_id)

    def _assemble(self, slot: AgentSlot[Agent], session: Session, spec: Spec) -> Parts:
        """Build an agent's parts over ``session`` (its model is closed by close())."""
        self._models.setdefault(id(spec.model), spec.model)
        return self._assembly.parts(slot.handle, session, spec)

    def _go_live(
        self, slot: AgentSlot[Agent], session: Session, ref: ActorRef[Any], parts: Parts
    ) -> None:
        machine = parts.machine
        slot.bind(
            ref,
            session,
            parts.inbox,
            lambda: machine.status,
            machine.active_signal,
            machine.is_unwinding,
        )
        with self._lock:
            slot.registered = True
            bridging = self._bridge.bridging  # read after bind: see _listen
        if bridging:
            self._bridge.bridge(slot)
        agent_id = slot.id
        watch(ref, lambda dead, death: self._on_death(agent_id, death, dead))

    # ------------------------------------------------------------------ passivation

    def passivate_idle(self, timeout: float | None = 10.0) -> int:
        """Passivate every idle agent (evict it from memory until its next send);
        returns how many were passivated now (not those that were passive already)."""
        timeout = check_timeout(timeout)
        self._check_open()
        with self._lock:
            self._check_open()  # (as agents() does)
            slots = list(self._agents.values())
        return sum(
            1
            for slot in slots
            if not slot.passive and slot.status() == "idle" and slot.passivate(timeout)
        )

    def _rehydrate(self, slot: AgentSlot[Agent]) -> None:
        """Rebuild a passivated agent from its log (the caller holds its live lock)."""
        self._check_open()
        session = self.store.open_session(slot.id)
        session.repair()
        parts = self._assemble(slot, session, slot.spec)
        ref = parts.start()
        self._registry.tell(ProxyCall(attr_path=("rebind",), args=(slot.id, ref), kwargs={}))
        self._go_live(slot, session, ref, parts)

    def _on_death(self, agent_id: str, death: ActorDeath, ref: ActorRef[Any]) -> None:
        """An agent actor died (on the worker that ran its last batch: never the
        registry's, whose handlers a listener of ``agent/disposed`` may ask). Stopped by
        its disposal (the registry stopped it): announce ``agent/disposed``; stopped by a
        passivation: nothing. A failure ends its registration like a dispose would; the
        session keeps its open turn, which ``resume`` repairs."""
        if not death.failed:
            slot = self._agents.get(agent_id)
            if slot is not None and slot.stopped_by_disposal(ref):
                self._announce_disposed(agent_id)
            return
        log.error("agent %s crashed: %r", agent_id, death.error)
        slot = self._agents.get(agent_id)
        if slot is not None:
            slot.handle.crash = death.error
            slot.begin_disposing()
        self._unregister(agent_id, stop=False)
        self._announce_disposed(agent_id)

    def _meters_for(self, agent_id: str, limits: UsageLimits | None) -> list[UsageMeter]:
        meters = [] if self._meter is None else [self._meter]
        own = limits if limits is not None else self.agent_limits
        if own is not None:
            meters.insert(0, UsageMeter(own, f"agent {agent_id}"))
        return meters

    def _announce_disposed(self, agent_id: str) -> None:
        """Emit ``agent/disposed`` (once) on the calling thread: the dying actor's worker
        after a stop, the disposer's or the crashed actor's thread when no actor was
        left to stop (never the registry's worker: a listener may spawn or dispose,
        which asks the registry)."""
        with self._lock:
            slot = self._agents.pop(agent_id, None)
            if slot is not None:
                slot.registered = False
                slot.bridged = None
        if slot is None:
            return
        slot.announcer = threading.get_ident()  # its dispose() there does not wait
        try:
            self.bus.emit("agent/disposed", AgentDisposed(agent=slot.handle), scope=agent_id)
        finally:
            slot.announcer = None
        with self._lock:
            disposers = self._scoped.pop(agent_id, set())
        for dispose in list(disposers):  # its agent.on listeners go with it
            dispose()
        slot.disposed.set()

    def _begin_disposal(self, slot: AgentSlot[Agent], *, keep_inbox: bool) -> None:
        """Start this agent's one disposal, unless one began (``dispose()``, or the
        runtime's ``close()``, which keeps the inbox for a resume)."""
        if not slot.begin_disposing():
            return
        with slot.exclusive():
            if not keep_inbox and slot.passive:
                # the disposal discards the pending inbox durably: the actor does
                with slot.lock:
                    if slot.passive:
                        self._rehydrate(slot)
            running = self._dispose_live(slot, keep_inbox=keep_inbox)
        if not running:  # passive (kept inbox) or crashed: no actor to stop
            self._forget(slot)

    def _dispose_live(self, slot: AgentSlot[Agent], *, keep_inbox: bool = False) -> bool:
        """Start disposing the agent's actor, if it runs: cancel (``disposed``), then stop
        it once idle, which announces ``agent/disposed``. False if no actor runs (passivated
        or crashed): then :meth:`_forget` it.

        Call it holding the handle's live lock, or on the agent's own actor: otherwise a
        passivation could stop the actor between the check and the two messages, which
        would then never be handled, and the disposal never end."""
        ref = slot.ref if slot.registered else None
        if ref is None or not ref.is_alive():
            return False

        def stop() -> None:
            # The registry stops it (unless a close that gave up on the agent stopped the
            # registry); _on_death announces the disposal.
            self._unregister(slot.id, stop=True)

        ref.tell(Cancel(cause=DisposedCause(), keep_inbox=keep_inbox))
        ref.tell(AwaitIdle(callback=stop))
        return True

    def _forget(self, slot: AgentSlot[Agent]) -> None:
        """Dispose an agent that has no actor running: the registry forgets it, and
        ``agent/disposed`` is announced here (called without the live lock: a listener
        of that event may use the agent). Told, not asked: a spawn or resume of the id
        from a listener reaches the registry after the removal (one mailbox, in order),
        and nothing waits for the registry (a close must not)."""
        self._unregister(slot.id, stop=False)
        self._announce_disposed(slot.id)

    def _unregister(self, agent_id: str, *, stop: bool) -> bool:
        """Tell the registry to forget the agent (``stop``: and stop its actor), announcing
        nothing (the runtime announces disposals itself). False if the registry is gone
        (after a close)."""
        remove = ProxyCall(
            attr_path=("remove",), args=(agent_id,), kwargs={"stop": stop, "announce": False}
        )
        try:
            self._registry.tell(remove)
        except ActorDeadError:
            return False
        return True

    def get(self, agent_id: str) -> Agent:
        """The live agent with this id; ``KeyError`` if none."""
        with self._lock:
            self._check_open()
            try:
                return self._agents[agent_id].handle
            except KeyError:
                raise KeyError(f"no live agent {agent_id!r} in this runtime") from None

    def agents(self) -> list[Agent]:
        """Every agent of this runtime, live or passivated."""
        with self._lock:
            self._check_open()
            return [slot.handle for slot in self._agents.values()]

    # ------------------------------------------------------------------ durability

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything appended before the call is durable on disk, and with
        it what every message told to an agent before the call made it append: the
        splice of a send (``followup``, ``steer``, ``inject``), the discards of a
        ``cancel()``. An agent appends those when it handles the message; the flush
        waits for that first. Called on a dispatcher or I/O thread (from a listener or a
        tool) it covers only what was appended: the agents it would wait for may need
        that thread. Raises ``TimeoutError`` after ``timeout`` seconds."""
        timeout = check_timeout(timeout)
        self._check_open()
        until = deadline(timeout)
        self._await_told(timeout)
        self.store.flush(remaining(until))

    async def aflush(self) -> None:
        """:meth:`flush` for asyncio code: ``await rt.aflush()`` (see ``Store.aflush``)."""
        self._check_open()
        busy = self._busy_agents()
        if busy:
            await asyncio.get_running_loop().run_in_executor(None, self._await_told, None, busy)
        await self.store.aflush()

    def _busy_agents(self) -> list[AgentSlot[Agent]]:
        """The agents whose actors have messages queued or are handling some: one pass
        over every agent, ~1 µs each (11 ms with 10,000 idle agents)."""
        with self._lock:
            agents = list(self._agents.values())
        return [slot for slot in agents if slot.busy()]

    def _await_told(
        self, timeout: float | None, busy: list[AgentSlot[Agent]] | None = None
    ) -> None:
        """Wait until every agent handled the messages told to it before the call
        (``busy``: the :meth:`_busy_agents` found just before it, if any)."""
        if in_nonblocking_thread():
            return
        agents = self._busy_agents() if busy is None else busy
        futures = [f for slot in agents if (f := slot.told_handled()) is not None]
        until = deadline(timeout)
        for future in futures:
            try:
                future.get(timeout=remaining(until))
            except ActorDeadError:
                pass  # stopped or crashed: what it had not handled went with it
            except Timeout as err:
                raise TimeoutError(
                    f"messages to {len(futures)} agents were not handled within {timeout} s"
                ) from err

    def _check_open(self) -> None:
        """Raise :class:`RuntimeClosedError` once :meth:`close` began."""
        if self._closed:
            raise RuntimeClosedError

    def _check_released(self) -> None:
        """Raise :class:`RuntimeClosedError` once :meth:`close` let go of the store (its
        listeners may still read sessions while it runs)."""
        if self._released:
            raise RuntimeClosedError

    def close(self, timeout: float | None = 30.0) -> None:
        """Cancel running turns (inboxes kept), stop agents, flush, release everything.

        ``timeout`` bounds the whole close (None: no limit): each stage gets what the
        ones before it left. Async listeners of the events emitted until then (the
        ``agent/disposed`` of each agent among them) may finish within it. What is still
        running when it runs out is logged as a warning and left: an agent whose disposal
        did not end is stopped with its turn open in the log (its outcome unknown, as
        after a crash: ``resume`` repairs it), a blocked sync listener or tool body
        keeps its thread until it returns (the agent then stops without writing more),
        async listener calls not finished are cancelled. The store is flushed and closed
        whatever time is left. Once the time has run out, each stage that waits for the
        runtime's own machinery (an actor's stop, cancelled tasks, a thread's exit) still
        gets a moment (``GRACE_S``, 0.1 s) to end.

        A stage that fails (or is interrupted) does not stop the ones after it: the
        first error is raised once every stage ran, and the next ``close()`` runs the
        stages that failed, and those that worked on what a failed one left them (the
        disposals, after a failed wait for the starts); a close that ended cleanly
        leaves nothing: the next one returns at once.

        Not from the runtime's own threads (a sync listener or hook, an async one, a tool
        body, the scheduler): it would wait for the agents that thread runs. That raises
        ``RuntimeError``, and the runtime stays open."""
        timeout = check_timeout(timeout)
        if in_runtime_thread():
            raise RuntimeError(
                "rt.close() was called on a dispatcher or I/O thread (from a listener, a "
                "hook or a tool body): it would wait for the agents and tool calls that "
                "thread runs; close the runtime from another thread, e.g. tell the main "
                "thread to"
            )
        until = deadline(timeout)
        with self._lock:
            if self._close.running or self._close.done:
                return  # another close() is under way, or one closed everything
            self._closed = True
            self._close.running = True
            if "starts" in self._close.left:  # the agents live now, whatever "starts" gets to
                self._closing_agents = list(self._agents.values())
            supervisions, self._supervisions = self._supervisions, []
        for supervision in supervisions:  # a pending restart is cancelled, none starts
            supervision.close()
        try:
            self._close.run(Deadline(until, timeout))
        finally:
            with self._lock:
                self._close.running = False
                if self._close.done:
                    atexit.unregister(self._close_at_exit)  # (kept to finish a failed close)

    def _close_stages(self) -> tuple[Stage, ...]:
        """The stages of :meth:`close`, in order."""
        return (
            # wait for spawns under way; the agents to stop
            Stage("starts", self._close_starts),
            # their disposals (inboxes kept), waited for
            Stage("agents", self._dispose_for_close, needs="starts"),
            # the actors of those that did not end, stopped
            Stage("stragglers", self._close_stragglers, needs="agents"),
            Stage("registry", lambda d: stop_registry(self._registry, self.dispatcher, d)),
            Stage("scheduler", lambda d: self.scheduler.close(remaining(extended(d.until)))),
            Stage("models", lambda d: close_models(self._models.values(), self.io.loop, d)),
            Stage("io", lambda d: self.io.close(remaining(d.until))),
            Stage("dispatcher", lambda d: shut_down_dispatcher(self.dispatcher, d)),
            Stage("store", self._close_store),
            Stage("gc", self._close_gc),
        )

    def _close_starts(self, d: Deadline) -> None:
        with self._lock:
            try:
                if not self._started.wait_for(lambda: not self._starting, remaining(d.until)):
                    log.warning("an agent was still starting after %s s; closing anyway", d.timeout)
            finally:  # (a Ctrl-C in the wait too: the later stages need the agents)
                self._closing_agents = list(self._agents.values())
                # A start still under way (given up on above) is claimed: it ends
                # without announcing its agent (its spawn raises RuntimeClosedError),
                # which then never ran, so it has nothing to dispose (see _announce
                # and _start).
                for slot in self._pending.values():
                    slot.claim()
                self._pending.clear()
                self._starts_claimed = True  # and those not pending yet, once they are

    def _close_stragglers(self, d: Deadline) -> None:
        stuck = [slot for slot in self._closing_agents if not slot.disposed.is_set()]
        cut, self._disposals_cut = self._disposals_cut, None
        stop_stragglers(stuck, d.until, d.timeout, cut)

    def _close_store(self, _d: Deadline) -> None:
        self._released = True
        if self._owns_store:
            self.store.close()

    def _close_gc(self, _d: Deadline) -> None:
        if self._tuned_gc:
            # Cleared first: once per runtime, even if this stage runs again (a
            # Ctrl-C after the release would have released another runtime's).
            self._tuned_gc = False
            gctune.release_gc_tuning()

    def _dispose_for_close(self, d: Deadline) -> None:
        """Begin every agent's disposal (inbox kept) and wait for them by ``until``; the
        stage after stops those that did not end. One agent's failure to begin does
        not keep the others from theirs (the first is raised after the wait)."""
        agents = self._closing_agents
        failed: Exception | None = None
        for slot in agents:
            try:
                self._begin_disposal(slot, keep_inbox=True)
            except Exception as err:  # noqa: BLE001 - raised below, once all were asked
                failed = failed or err
        # In slices on the main thread (runtime.waiting): a Ctrl-C that lands just before
        # the wait's system call is handled within one, not once every turn has ended
        # (corral run's handler says the close goes on, or quits at the next press).
        try:
            for slot in agents:
                waiting.wait(slot.disposed, remaining(d.until))
        except BaseException as err:  # (a Ctrl-C): the stage after stops them at once
            self._disposals_cut = type(err).__name__
            raise
        if failed is not None:
            raise failed


class _Host:
    """What a runtime's agent handles call (``runtime.slots.AgentHost``): the handle
    calls nothing else of the runtime."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def check_open(self) -> None:
        self._runtime._check_open()

    def check_released(self) -> None:
        self._runtime._check_released()

    def check_room(self) -> None:
        full = self._runtime.store.disk_full
        if full is not None:
            raise DiskFullError(
                f"the disk that holds the store is full ({full.free:,} bytes free), so a "
                "send is refused and nothing was logged; send again once there is room",
                full.free,
                full.needed,
            ) from full

    def rehydrate(self, slot: AgentSlot[Agent]) -> None:
        self._runtime._rehydrate(slot)

    def begin_disposal(self, slot: AgentSlot[Agent], *, keep_inbox: bool) -> None:
        self._runtime._begin_disposal(slot, keep_inbox=keep_inbox)

    def listen(
        self, name: str, listener: Callable[..., Any], slot: AgentSlot[Agent]
    ) -> Callable[[], None]:
        return self._runtime._listen(name, listener, slot)


def _announced_elsewhere(*_: object) -> None:
    """The registry's announcement callbacks: the runtime announces agents itself."""


def _close_at_exit(ref: weakref.ref[Runtime]) -> Callable[[], None]:
    """An exit hook that closes the runtime if it is still open (it holds it weakly).
    Not in a child forked from its process: the runtime's threads did not go with it."""
    pid = os.getpid()

    def close() -> None:
        runtime = ref()
        if runtime is None or os.getpid() != pid:
            return
        try:
            runtime.close()
        except Exception:  # the interpreter is exiting: say so, do not stop the exit
            log.exception("closing a runtime at exit failed")

    return close
