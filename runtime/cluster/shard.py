"""A shard: one ordinary :class:`~runtime.Runtime` in its own process, run by Ray.

:class:`Shard` is a plain class; :mod:`runtime.cluster.cluster` makes it a Ray actor
(threaded: verbs, waits and the event poll run side by side, and the runtime is
thread-safe). Its store is ``<root>/shard-<k>/`` on the local disk of the node it runs
on. When Ray restarts the process (``max_restarts``), ``__init__`` runs again with the
same arguments: it reopens the store, resumes every agent its journal lists (each
``Runtime.resume`` repairs an interrupted tail turn) and wakes those whose inbox still
holds work, which a plain resume leaves idle.

Two ways in. The verbs that change which agents the shard hosts (spawn, resume, fork,
dispose, close) and the event poll are Ray calls: each takes a batch (one call per
shard, however many agents it names) and returns one outcome per item, an exception or
``None``, so one bad item fails alone. An agent's own verbs (sends, edits, cancel,
reads, waits: :mod:`runtime.cluster.verbs`) come over the shard's direct connection
(:mod:`runtime.cluster.listener`), whose address :meth:`Shard.address` gives. A verb the
driver sends again after a restart (``retry=True``) is idempotent: a spawn of an agent
the journal has, a send of a ``MessageId`` the log already has, are done.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import msgspec

from runtime import Agent, Runtime
from storage import UnknownSessionError

from .errors import DuplicateAgentError, ShardStartError
from .events import FORWARDED, ClusterEvent, EventBuffer, portable
from .factories import AgentRecipe, build, load_factory
from .forks import fork_export
from .journal import Journal
from .layout import journal_path, shard_path
from .listener import VerbListener
from .verbs import apply
from .wire import Send, Verb

__all__ = ["Send", "Shard", "ShardInfo", "ShardOptions"]

Outcome = BaseException | None
"""One item's outcome: ``None`` when it was done, else the error that refused it."""


class ShardOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The options every shard's runtime is opened with (``Runtime.open``'s)."""

    durability: Literal["write-ahead", "turn", "none"] = "write-ahead"
    threads: int | None = None
    max_steps: int | None = None
    inbox_limit: int | None = None
    max_running_turns: int | None = None
    setup: str | None = None
    """A factory ``package.module:function`` called with the shard's ``Runtime`` once it
    is open (at every start, restarts too): it registers waterfalls and other
    extension points, which run where the agents run."""


class ShardInfo(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    pid: int
    node: str
    agents: int
    resumed: int  # agents resumed from the journal at this start
    rewoken: int  # of those, how many had pending work and were woken
    start_s: float  # how long this start took (store open, resumes)


class Shard:
    """Hosts one runtime; see the module doc."""

    def __init__(self, root: str, index: int, options: ShardOptions, node: str = "") -> None:
        # A failed start is kept and raised by every call, not raised here: Ray would
        # restart a shard whose constructor raised, over and over (max_restarts=-1).
        self._failure: BaseException | None = None
        self.index = index
        try:
            self._start(root, index, options, node)
        except Exception as err:  # noqa: BLE001 - raised by every later call
            self._failure = err

    def _start(self, root: str, index: int, options: ShardOptions, node: str) -> None:
        started = time.perf_counter()
        path = shard_path(root, index)
        self._lock = threading.Lock()  # the journal and the built recipes
        self._journal = Journal(journal_path(root, index))
        self._built: dict[AgentRecipe, tuple[Any, list[Any]]] = {}
        self._buffer = EventBuffer()
        self._listening: dict[str, Callable[[], None]] = {}
        self._rt = Runtime.open(
            path,
            durability=options.durability,
            threads=options.threads,
            max_steps=options.max_steps,
            inbox_limit=options.inbox_limit,
            max_running_turns=options.max_running_turns,
        )
        if options.setup is not None:
            load_factory(options.setup, "the shard setup")(self._rt)
        resumed, rewoken = self._resume_journal()
        self._journal.opened()
        self._verbs = VerbListener(_node_address(), self._apply, f"corral-shard-{index}")
        self._info = ShardInfo(
            index=index,
            pid=os.getpid(),
            node=node,
            agents=len(self._journal.agents),
            resumed=resumed,
            rewoken=rewoken,
            start_s=round(time.perf_counter() - started, 3),
        )

    # ------------------------------------------------------------------ start

    def _parts(self, recipe: AgentRecipe) -> tuple[Any, list[Any]]:
        """The model and tools of ``recipe``, built once per shard and shared by its
        agents, as one model object is shared by many spawns in one runtime."""
        with self._lock:
            parts = self._built.get(recipe)
            if parts is None:
                parts = self._built[recipe] = build(recipe)
            return parts

    def _resume_journal(self) -> tuple[int, int]:
        """Resume every agent of the journal. After a clean close they stay idle until
        a waking send, as ``Runtime.resume`` leaves them; after a crash, those whose
        work the crash stopped are woken (:func:`_rewake`)."""
        clean = self._journal.clean
        resumed = rewoken = 0
        for agent_id, recipe in list(self._journal.agents.items()):
            model, tools = self._parts(recipe)
            try:
                agent = self._rt.resume(agent_id, model=model, tools=tools, system=recipe.system)
            except UnknownSessionError:
                # journaled, then killed before its session was created: the spawn was
                # never acknowledged
                self._journal.disposed([agent_id])
                continue
            resumed += 1
            if not clean:
                rewoken += _rewake(agent)
        return resumed, rewoken

    # ------------------------------------------------------------------ verbs

    def _check(self) -> None:
        if self._failure is not None:
            raise ShardStartError(
                f"shard {self.index} could not start: {self._failure}"
            ) from self._failure

    def info(self) -> ShardInfo:
        self._check()
        return msgspec.structs.replace(self._info, agents=len(self._journal.agents))

    def spawn(self, items: Sequence[tuple[str, AgentRecipe]], retry: bool) -> list[Outcome]:
        """Spawn each ``(agent id, recipe)``; journaled first, flushed before returning."""
        self._check()
        outcomes: list[Outcome] = [None] * len(items)
        fresh: list[tuple[int, str, AgentRecipe]] = []
        with self._lock:
            for n, (agent_id, recipe) in enumerate(items):
                if agent_id in self._journal.agents:
                    if not (retry and self._journal.agents[agent_id] == recipe):
                        outcomes[n] = _duplicate(agent_id)
                    continue
                fresh.append((n, agent_id, recipe))
            self._journal.spawned((agent_id, recipe) for _, agent_id, recipe in fresh)
        failed = []
        for n, agent_id, recipe in fresh:
            model, tools = self._parts(recipe)
            try:
                self._rt.spawn(model=model, tools=tools, session_id=agent_id, system=recipe.system)
            except Exception as err:  # noqa: BLE001 - one item's failure is its outcome
                outcomes[n] = err
                failed.append(agent_id)
        with self._lock:
            self._journal.disposed(failed)
        self._rt.flush()
        return outcomes

    def resume(self, items: Sequence[tuple[str, AgentRecipe]]) -> list[Outcome]:
        """Resume each ``(agent id, recipe)`` from its log (a disposed agent, say); one
        this shard hosts already is left as it is."""
        self._check()
        outcomes: list[Outcome] = [None] * len(items)
        for n, (agent_id, recipe) in enumerate(items):
            with self._lock:
                if agent_id in self._journal.agents:
                    continue
                self._journal.spawned([(agent_id, recipe)])
            model, tools = self._parts(recipe)
            try:
                agent = self._rt.resume(agent_id, model=model, tools=tools, system=recipe.system)
            except Exception as err:  # noqa: BLE001 - one item's failure is its outcome
                outcomes[n] = err
                with self._lock:
                    self._journal.disposed([agent_id])
                continue
            _rewake(agent)
        return outcomes

    def dispose(self, agent_ids: Sequence[str], timeout: float | None) -> list[Outcome]:
        """Dispose each; the journal forgets those whose disposal finished."""
        self._check()
        outcomes: list[Outcome] = []
        done: list[str] = []
        agents = []
        for agent_id in agent_ids:
            try:
                agents.append(self._rt.get(agent_id))
            except KeyError:
                done.append(agent_id)  # disposed already (a retry, or twice)
        until = None if timeout is None else time.monotonic() + timeout
        for agent in agents:
            left = None if until is None else max(0.0, until - time.monotonic())
            if agent.dispose(timeout=left):
                done.append(agent.id)
            else:
                outcomes.append(TimeoutError(f"agent {agent.id} not disposed in {timeout} s"))
        with self._lock:
            self._journal.disposed(done)
        self._rt.flush()
        return [*outcomes, *([None] * (len(agent_ids) - len(outcomes)))]

    def address(self) -> str:
        """``host:port`` of this process's verb listener (see the module doc)."""
        self._check()
        return self._verbs.address

    def _apply(self, verb: Verb) -> object:
        self._check()
        return apply(self._rt, verb)

    def fork(
        self,
        source_id: str,
        boundary: int,
        child_id: str,
        recipe: AgentRecipe,
        export: bytes | None,
        retry: bool,
    ) -> None:
        """Start agent ``child_id`` as a fork of ``source_id`` at ``boundary``: from the
        source in this shard's store (``export`` None), or from the child's ``export``
        that the source's shard made (:func:`fork_export`). Journaled first; durable
        when it returns. A retry of a fork this shard did is done."""
        self._check()
        with self._lock:
            if child_id in self._journal.agents:
                if retry and self._journal.agents[child_id] == recipe:
                    return
                raise _duplicate(child_id)
            self._journal.spawned([(child_id, recipe)])
        model, tools = self._parts(recipe)
        try:
            if export is None:
                self._rt.fork(
                    source_id,
                    boundary,
                    model=model,
                    tools=tools,
                    session_id=child_id,
                    system=recipe.system,
                )
            else:
                self._rt.store.import_jsonl(io.BytesIO(export), session_id=child_id)
                self._rt.resume(child_id, model=model, tools=tools, system=recipe.system)
        except BaseException:
            with self._lock:
                self._journal.disposed([child_id])
            raise
        self._rt.flush()

    def fork_export(self, source_id: str, boundary: int, child_id: str) -> bytes:
        """The export of a fork child of ``source_id`` that another shard will host."""
        self._check()
        return fork_export(self._rt.store, source_id, boundary, child_id)

    def agents(self) -> list[str]:
        self._check()
        return [agent.id for agent in self._rt.agents()]

    def flush(self, timeout: float | None) -> None:
        self._check()
        self._rt.flush(timeout)

    # ------------------------------------------------------------------ events

    def listen(self, names: Sequence[str]) -> None:
        """Forward the live events ``names`` from now on (again after a restart)."""
        self._check()
        for name in names:
            if name not in FORWARDED or name in self._listening:
                continue
            self._listening[name] = self._rt.on(name, self._forwarder(name))

    def unlisten(self, names: Sequence[str]) -> None:
        self._check()
        for name in names:
            dispose = self._listening.pop(name, None)
            if dispose is not None:
                dispose()

    def _forwarder(self, name: str) -> Callable[[Any], None]:
        buffer, index = self._buffer, self.index

        def forward(event: Any) -> None:
            buffer.put(portable(name, event, index))

        return forward

    def poll(self, max_wait_s: float, max_events: int) -> tuple[list[ClusterEvent], int]:
        """The next batch of forwarded events (see :class:`EventBuffer`)."""
        self._check()
        return self._buffer.drain(max_wait_s, max_events)

    def close(self, timeout: float | None) -> None:
        if self._failure is not None:
            return
        for dispose in list(self._listening.values()):
            dispose()
        self._listening.clear()
        self._verbs.close()
        self._rt.close(timeout)
        with self._lock:
            self._journal.close(clean=True)
        self._buffer.wake()


def _rewake(agent: Agent) -> int:
    """Wake ``agent`` if its resumed inbox holds work that a crash stopped: a plain
    ``Runtime.resume`` leaves it idle until a waking send, and after a restart nobody
    would send one. Its pending messages are cleared and sent again with their own ids,
    in order. Work a turn ending ``blocked``, ``error`` or ``aborted`` parked (a clean
    close aborts running turns) stays parked, as in one process; so do messages
    injected without a wake after a completed turn. Returns 1 if it was woken."""
    next_turn, next_step = agent.session.pending_inbox()
    if not next_turn and not next_step:
        return 0
    last = _last_end(agent)
    stopped = last in (None, "completed", "interrupted")  # not parked by the loop
    if not ((next_turn and stopped) or (next_step and last == "interrupted")):
        return 0
    agent.clear()
    for message in next_step:
        agent.steer(message)
    for message in next_turn:
        agent.followup(message)
    return 1


def _last_end(agent: Agent) -> str | None:
    """The reason kind of the agent's last ``turn/end`` (None: no turn yet)."""
    session = agent.session
    upper = session.last_seq
    window = 64
    while upper >= 0:
        lower = max(0, upper - window + 1)
        for event in reversed(session.events(lower, upper)):
            if event.type == "turn/end":
                kind: str = event.data.reason.kind
                return kind
        upper, window = lower - 1, window * 4
    return None


def _node_address() -> str:
    """The IP address drivers reach this node at (Ray's view of it)."""
    try:
        import ray  # noqa: PLC0415 - present in a shard's process

        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - not under Ray (a test of the parts): loopback
        return "127.0.0.1"


def _duplicate(agent_id: str) -> DuplicateAgentError:
    return DuplicateAgentError(f"agent {agent_id} exists already; pick another session_id")
