"""``Runtime``: the facade over one store, one dispatcher, one I/O side and one bus.

``Runtime.open()`` is a context manager; ``close()`` cancels running turns (keeping
their inboxes for a later resume), stops every agent, flushes and closes the store.

The facade keeps the public verbs, each delegating: which agents exist and in what
lifecycle state, with every transition between states, is the agent table's
(``runtime.table``); starting them (spawn, resume, fork) is ``runtime.starting``'s; the
per-agent lifecycle is the slot's (``runtime.slots``); the close stages and their
bodies are ``runtime.close``'s; the parts started together, ``runtime.machinery``'s.
Elsewhere: the ``session/event`` bridge (``bridge``), building an agent's parts
(``assembly``), the checks made before anything starts (``checks``), messages
(``messages``) and the error tree (``errors``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any

from actors import (
    Clock,
    Durability,
    Model,
    Tool,
    UsageLimits,
    deadline,
    in_runtime_thread,
    log_clock,
    remaining,
)
from storage import Store, check_session_id

from . import gctune
from .agent import Agent
from .bridge import SessionTap
from .checks import (
    agent_settings,
    check_arity,
    check_clock,
    check_count,
    check_flag,
    check_limits,
)
from .close import close_at_exit
from .machinery import start_machinery
from .policy import RetryPolicy
from .spawning import SPAWN_BATCH
from .supervision import RestartPolicy
from .waiting import check_timeout

__all__ = ["Runtime"]

_DURABILITY = ("write-ahead", "turn", "none")
_DEFAULT_POLICY: Any = object()


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
        clock: Clock | None = None,
    ) -> None:
        if durability not in _DURABILITY:
            raise ValueError(f"durability must be one of {_DURABILITY}, got {durability!r}")
        check_flag("tune_gc", tune_gc)
        check_clock("clock", clock)
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
        self._pause_gc = tune_gc  # spawn_many's batches pause collection (runtime.gctune)
        # What is started here is stopped again if a later part fails to start (out of
        # threads, say): a failed open leaves nothing running and the GC as it was.
        with contextlib.ExitStack() as undo:
            if tune_gc:
                gctune.tune_gc()
                undo.callback(gctune.release_gc_tuning)
            parts = start_machinery(
                undo,
                store,
                durability=durability,
                threads=threads,
                blocking_workers=blocking_workers,
                max_steps=max_steps,
                inbox_limit=inbox_limit,
                limits=limits,
                agent_limits=agent_limits,
                max_running_turns=max_running_turns,
                owns_store=owns_store,
                tune_gc=tune_gc,
                clock=clock,
            )
            self.dispatcher, self.io, self.scheduler, self.bus = parts[:4]
            self._table, self._starter, self._closing = parts.table, parts.starter, parts.closing
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
            self._close_at_exit = close_at_exit(weakref.ref(self))
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
        clock: Clock | None = None,
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
        - ``clock``: what retry and restart back-offs, tool timeouts and the log's
          timestamps read (default the system clock); ``ManualClock()`` for tests,
          which move it with ``clock.advance(seconds)`` (see docs/testing.md).
        """
        if durability not in _DURABILITY:
            raise ValueError(f"durability must be one of {_DURABILITY}, got {durability!r}")
        check_count("max_event_bytes", max_event_bytes, optional=False)
        check_count("map_size", map_size, optional=False)
        check_flag("tune_gc", tune_gc)
        check_clock("clock", clock)
        store = Store.open(
            path,
            durability=durability,
            max_event_bytes=max_event_bytes,
            map_size=map_size,
            clock=None if clock is None else log_clock(clock),
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
                clock=clock,
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
        return self._table.listen(name, listener, None)

    def tap_sessions(self, observer: SessionTap) -> Callable[[], None]:
        """Call ``observer(agent, event)`` after every append to every live agent's
        session (those live now and later); returns a disposer. The facts
        ``session/event`` carries, at a fraction of its cost: straight from the append,
        under the session's lock, before the ``session/event`` listeners, with no live
        payload and no bus (see :meth:`runtime.bridge.SessionBridge.tap` for its rules).
        For plugins that pick a few types out of every append (``runtime.telemetry``)."""
        return self._table.tap(observer)

    # ------------------------------------------------------------------ agents

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
        self._table.check_open()
        resolved, tool_map = agent_settings(
            self.store.codec, model, tools, system, limits, self.scheduler
        )
        with self._table.starting_agent():
            session = self.store.create_session(session_id)
            agent = self._starter.start(session, resolved, tool_map, system, limits, "startup")
        if restart is not None:
            resume = partial(self.resume, agent.id, model=model, tools=tools, limits=limits)
            self._table.supervise(agent, restart, resume)
        return agent

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
        self._table.check_open()
        if type(count) is not int or count < 0:
            raise ValueError(f"count is the number of agents to spawn (an int >= 0), got {count!r}")
        if in_runtime_thread():
            return [
                self.spawn(model=model, tools=tools, system=system, limits=limits)
                for _ in range(count)
            ]
        resolved, tool_map = agent_settings(
            self.store.codec, model, tools, system, limits, self.scheduler
        )
        agents: list[Agent] = []
        with self._table.starting_agent():
            for first in range(0, count, SPAWN_BATCH):
                size = min(SPAWN_BATCH, count - first)
                # (no collection pass rescans the agents made: see runtime.gctune)
                with gctune.collection_paused() if self._pause_gc else nullcontext():
                    agents += self._starter.start_many(size, resolved, tool_map, system, limits)
        return agents

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
        self._table.check_open()
        check_session_id(session_id)
        resolved, tool_map = agent_settings(
            self.store.codec, model, tools, system, limits, self.scheduler
        )
        with self._table.starting_agent(resuming=session_id):
            opened = self._starter.open_logged(session_id, self.store.open_session, session_id)
            return self._starter.start_logged(opened, resolved, tool_map, system, limits, "resume")

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
        self._table.check_open()
        check_session_id(source_id)
        if type(boundary) is not int:
            raise TypeError(
                f"boundary is the int seq of the last event to inherit, got {boundary!r}"
            )
        resolved, tool_map = agent_settings(
            self.store.codec, model, tools, system, limits, self.scheduler
        )
        starter = self._starter
        with self._table.starting_agent():
            opened = starter.open_logged(
                source_id, self.store.fork, source_id, boundary, session_id
            )
            return starter.start_logged(opened, resolved, tool_map, system, limits, "startup")

    def passivate_idle(self, timeout: float | None = 10.0) -> int:
        """Passivate every idle agent (evict it from memory until its next send);
        returns how many were passivated now (not those that were passive already)."""
        timeout = check_timeout(timeout)
        self._table.check_open()
        return self._table.passivate_idle(timeout)

    def get(self, agent_id: str) -> Agent:
        """The live agent with this id; ``KeyError`` if none."""
        return self._table.get(agent_id)

    def agents(self) -> list[Agent]:
        """Every agent of this runtime, live or passivated."""
        return self._table.agents()

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
        self._table.check_open()
        until = deadline(timeout)
        self._table.await_told(timeout)
        self.store.flush(remaining(until))

    async def aflush(self) -> None:
        """:meth:`flush` for asyncio code: ``await rt.aflush()`` (see ``Store.aflush``)."""
        self._table.check_open()
        table = self._table
        busy = table.busy_agents()
        if busy:
            await asyncio.get_running_loop().run_in_executor(None, table.await_told, None, busy)
        await self.store.aflush()

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
        self._closing.close(timeout, self._close_at_exit)
