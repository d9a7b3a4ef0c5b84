"""``Cluster``: the facade over N shards, with the verbs of a ``Runtime``.

``Cluster.open(path, shards=N)`` starts (or, with ``address``, joins) a Ray cluster and
one shard actor per shard; each hosts an ordinary ``Runtime`` over
``<path>/shard-<k>/``. An agent lives in the shard its id routes to
(:class:`~runtime.cluster.routing.Router`) until a reshard
(:mod:`runtime.cluster.reshard`). The batched verbs make one request per shard, all
shards in parallel: :meth:`spawn_many` and :meth:`dispose` through Ray,
:meth:`send_many` and :meth:`wait_idle` on the shards' direct connections
(:mod:`runtime.cluster.connection`).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from itertools import count
from typing import Any, Literal

from runtime import UserMessage

from .connection import ShardConnection
from .errors import ClusterClosedError, RayMissingError
from .events import ClusterEvent
from .factories import AgentRecipe, recipe
from .forwarding import Forwarding
from .handle import ClusterAgent
from .layout import claim_layout, layout_shards, reshard_plan
from .outbox import Outbox
from .reshard import reshard as reshard_store
from .routing import Router
from .shard import Send, Shard, ShardInfo, ShardOptions
from .transport import ORDERED_GROUP, ShardLink
from .wire import Status, Verb, WaitIdle

__all__ = ["Cluster"]


def _ray() -> Any:
    try:
        import ray  # noqa: PLC0415 - an optional extra
    except ImportError as err:
        raise RayMissingError from err
    return ray


def start_local_ray(shards: int, shard_cpus: float) -> None:
    """Start a local Ray instance with room for ``shards`` shards. Its workers run at
    niceness 0: Ray's default, 15, makes a shard yield its core to any other process of
    the machine, which a shard that owns a core should not."""
    ray = _ray()
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(
        address="local",  # a new instance, even if another one runs on this machine
        num_cpus=max(1, round(shards * shard_cpus)),
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )


class Cluster:
    """Hosts agents in shards. Build with :meth:`open`; close with :meth:`close`."""

    def __init__(self, ray: Any, root: str, links: list[ShardLink], owns_ray: bool) -> None:
        self._ray = ray
        self.path = root
        self._links = links
        self._owns_ray = owns_ray
        self.router = Router(len(links))
        self._events = Forwarding(ray, links)
        self._closed = False
        self._lock = threading.Lock()
        self._prefix = uuid.uuid4().hex[:12]
        self._ids = count(1)
        self._connections: list[ShardConnection] = []
        try:
            for link in links:
                self._connections.append(ShardConnection(link))
        except BaseException:
            for connection in self._connections:
                connection.close()
            raise
        self._outboxes = [Outbox(c) for c in self._connections]  # every send, in order

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        shards: int | None = None,
        address: str | None = None,
        durability: Literal["write-ahead", "turn", "none"] = "write-ahead",
        threads: int | None = None,
        max_steps: int | None = None,
        inbox_limit: int | None = None,
        max_running_turns: int | None = None,
        setup: str | None = None,
        shard_cpus: float = 1.0,
        max_restarts: int = -1,
        pin_to_nodes: bool = True,
        verb_timeout: float = 120.0,
        max_concurrency: int = 32,
        reshard: bool = False,
    ) -> Cluster:
        """Open the cluster store at ``path`` with ``shards`` shards.

        - ``shards``: default, the count the store at ``path`` was made with, else the
          CPUs of the Ray cluster (of this machine when local). Another count than the
          store's raises ``ClusterLayoutError``, unless ``reshard``.
        - ``reshard``: move the agents whose shard changes to ``shards`` shards first
          (:func:`~runtime.cluster.reshard.reshard`, in this process: every shard's store
          must be reachable from here), or finish an interrupted reshard.
        - ``address``: a running Ray cluster's (``"auto"``, ``"ray://..."``, host:port);
          None starts a local Ray instance with ``shards * shard_cpus`` CPUs (unless this
          process already called ``ray.init``).
        - ``durability``, ``threads``, ``max_steps``, ``inbox_limit``,
          ``max_running_turns``: each shard's ``Runtime.open`` options.
        - ``setup``: a factory ``package.module:function`` each shard calls with its
          ``Runtime`` at every start (waterfalls, policies, session/flush listeners).
        - ``shard_cpus``: the Ray CPUs a shard holds (1: one shard per core).
        - ``max_restarts``: how often Ray restarts a dead shard process (-1: always).
        - ``pin_to_nodes``: place shard ``k`` on a fixed node, and restart it there (its
          store is on that node's local disk); False lets Ray place and restart it
          anywhere, which needs ``path`` on a filesystem every node shares.
        - ``verb_timeout``: how long a verb waits for a restarting shard before it
          raises ``ShardUnavailableError``.
        """
        ray = _ray()
        root = os.path.abspath(os.fspath(path))
        plan = reshard_plan(root)
        if shards is None:
            shards = layout_shards(root)  # a store made before keeps its count
        if reshard and shards is not None and (plan is not None or layout_shards(root)):
            reshard_store(root, shards)
        owns_ray = not ray.is_initialized()
        if owns_ray:
            if address is None:
                start_local_ray(shards if shards is not None else os.cpu_count() or 1, shard_cpus)
            else:
                ray.init(address=address, log_to_driver=False)
        try:
            if shards is None:
                shards = max(1, int(ray.cluster_resources().get("CPU", 1) // shard_cpus))
            claim_layout(root, shards)
            options = ShardOptions(
                durability=durability,
                threads=threads,
                max_steps=max_steps,
                inbox_limit=inbox_limit,
                max_running_turns=max_running_turns,
                setup=setup,
            )
            # (concurrency groups are a class option: Ray refuses them in .options())
            actor = ray.remote(concurrency_groups={ORDERED_GROUP: 1})(Shard)
            base = {
                "num_cpus": shard_cpus,
                "max_restarts": max_restarts,
                "max_task_retries": 0,
                "max_concurrency": max_concurrency,
            }
            nodes = _shard_nodes(ray, shard_cpus) if pin_to_nodes else []
            links: list[ShardLink] = []
            for k in range(shards):
                node = nodes[k % len(nodes)] if nodes else ""
                placement = {}
                if node:
                    placement["scheduling_strategy"] = (
                        ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                            node_id=node, soft=False
                        )
                    )
                placed = actor.options(**base, **placement)
                handle = placed.remote(root, k, options, node)
                links.append(ShardLink(ray, k, handle, verb_timeout))
            cluster = cls(ray, root, links, owns_ray)
            cluster.shard_info()  # every shard started (or the first error)
        except BaseException:
            for link in locals().get("links", []):
                ray.kill(link.handle, no_restart=True)
            if owns_ray:
                ray.shutdown()
            raise
        return cluster

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def link(self, shard: int) -> ShardLink:
        self._check_open()
        return self._links[shard]

    def verb(self, shard: int, verb: Verb, timeout: float | None = None) -> Any:
        """``verb``'s value from ``shard``, over its direct connection (``timeout``: the
        verb's own wait, if it has one)."""
        self._check_open()
        pending = self._outboxes[shard].submit(verb)
        return pending.result(
            None if timeout is None else timeout + self._links[shard].verb_timeout
        )

    @property
    def shards(self) -> int:
        return len(self._links)

    def new_message_id(self) -> str:
        return f"m-{self._prefix}-{next(self._ids)}"

    def _check_open(self) -> None:
        if self._closed:
            raise ClusterClosedError

    def _each(
        self,
        method: str,
        per_shard: dict[int, tuple[Any, ...]],
        *,
        retried: bool = False,
        timeout: float | None = None,
    ) -> dict[int, Any]:
        """``method`` on several shards at once: their results by shard."""
        self._check_open()
        refs = {
            k: self._links[k].submit(method, *args, retried=retried)
            for k, args in per_shard.items()
        }
        return {
            k: self._links[k].wait(ref, method, per_shard[k], retried, timeout)
            for k, ref in refs.items()
        }

    @staticmethod
    def _raise_first(outcomes: Iterable[Iterable[BaseException | None]]) -> None:
        for batch in outcomes:
            for outcome in batch:
                if outcome is not None:
                    raise outcome

    # ------------------------------------------------------------------ agents

    def spawn(
        self,
        *,
        model: str,
        tools: Sequence[str] = (),
        session_id: str | None = None,
        system: str | None = None,
    ) -> ClusterAgent:
        """Create an agent in the shard its id routes to (see :meth:`spawn_many`)."""
        ids = None if session_id is None else [session_id]
        return self.spawn_many(1, model=model, tools=tools, session_ids=ids, system=system)[0]

    def spawn_many(
        self,
        count: int,
        *,
        model: str,
        tools: Sequence[str] = (),
        session_ids: Sequence[str] | None = None,
        system: str | None = None,
    ) -> list[ClusterAgent]:
        """Create ``count`` agents alike (ids generated, or ``session_ids``): one call per
        shard. ``model`` is a model string or a factory ``package.module:function``,
        ``tools`` factories (see :mod:`runtime.cluster.factories`). Durable (journal and
        session) when it returns."""
        spec = recipe(model, tools, system)
        ids = (
            list(session_ids)
            if session_ids is not None
            else [f"a-{uuid.uuid4().hex}" for _ in range(count)]
        )
        if len(ids) != count:
            raise ValueError(f"{count} agents but {len(ids)} session_ids")
        groups = self.router.group(ids)
        items: dict[int, list[tuple[str, AgentRecipe]]] = {
            k: [(agent_id, spec) for agent_id in group] for k, group in groups.items()
        }
        results = self._each("spawn", {k: (batch,) for k, batch in items.items()}, retried=True)
        self._raise_first(results.values())
        return [ClusterAgent(self, agent_id, self.router.shard_of(agent_id)) for agent_id in ids]

    def resume(
        self,
        session_id: str,
        *,
        model: str,
        tools: Sequence[str] = (),
        system: str | None = None,
    ) -> ClusterAgent:
        """Bring back an agent from its log (a disposed one: a live one is left as it is)."""
        spec = recipe(model, tools, system)
        k = self.router.shard_of(session_id)
        self._raise_first([self.link(k).call("resume", [(session_id, spec)])])
        return ClusterAgent(self, session_id, k)

    def fork(
        self,
        source_id: str,
        boundary: int,
        *,
        model: str,
        tools: Sequence[str] = (),
        session_id: str | None = None,
        system: str | None = None,
    ) -> ClusterAgent:
        """As :meth:`runtime.Runtime.fork`: a new agent whose session is seeded with
        ``source_id``'s log up to ``boundary`` (an inclusive seq outside an open turn).
        With no ``session_id`` the child gets an id that routes to the source's shard
        (the fork is made there, in one store); a ``session_id`` that routes to another
        shard gets the child's log copied there (:mod:`runtime.cluster.forks`)."""
        spec = recipe(model, tools, system)
        if type(boundary) is not int:
            raise TypeError(
                f"boundary is the int seq of the last event to inherit, got {boundary!r}"
            )
        source = self.router.shard_of(source_id)
        child = session_id
        while child is None or (session_id is None and self.router.shard_of(child) != source):
            child = f"a-{uuid.uuid4().hex}"  # ~shards tries
        target = self.router.shard_of(child)
        export = None
        if target != source:
            export = self.link(source).call("fork_export", source_id, boundary, child)
        self.link(target).call("fork", source_id, boundary, child, spec, export, retried=True)
        return ClusterAgent(self, child, target)

    def get(self, agent_id: str) -> ClusterAgent:
        """The live agent with this id; ``AgentDisposedError`` if its shard has none."""
        k = self.router.shard_of(agent_id)
        self.verb(k, Status(agent_id))
        return ClusterAgent(self, agent_id, k)

    def agents(self) -> list[ClusterAgent]:
        """Every live agent of every shard."""
        results = self._each("agents", dict.fromkeys(range(self.shards), ()))
        return [ClusterAgent(self, a, k) for k in sorted(results) for a in results[k]]

    def send_batch(self, shard: int, sends: list[Send], wait: bool = True) -> None:
        """Hand ``sends`` (of agents in ``shard``) to its outbox, in order; with
        ``wait``, once applied, raising the first refusal. Without, at once:
        :meth:`flush` raises its refusal, if any."""
        self._check_open()
        self._raise_first([self._outboxes[shard].put(sends, wait)])

    def send_many(
        self,
        messages: Iterable[tuple[ClusterAgent | str, str | UserMessage]],
        *,
        lane: Literal["next-turn", "next-step"] = "next-turn",
        wake: bool = True,
    ) -> list[str]:
        """``followup`` (or, by ``lane``/``wake``, ``steer``/``inject``) each
        ``(agent, message)``: one request per shard. Returns the ``MessageId``s in order."""
        per_shard: dict[int, list[Send]] = {}
        ids = []
        for agent, message in messages:
            agent_id = agent.id if isinstance(agent, ClusterAgent) else agent
            mid = message.id if isinstance(message, UserMessage) else self.new_message_id()
            ids.append(mid)
            send = Send(agent=agent_id, message=message, id=mid, lane=lane, wake=wake)
            per_shard.setdefault(self.router.shard_of(agent_id), []).append(send)
        self._check_open()
        tickets = [self._outboxes[k].queue(sends, True) for k, sends in per_shard.items()]
        self._raise_first(ticket() for ticket in tickets)  # every shard's in flight at once
        return ids

    def dispose(self, agents: Iterable[ClusterAgent | str], timeout: float | None = None) -> bool:
        """Dispose each agent (one call per shard); whether all finished in ``timeout``."""
        groups = self.router.group(a.id if isinstance(a, ClusterAgent) else a for a in agents)
        results = self._each("dispose", {k: (ids, timeout) for k, ids in groups.items()})
        return all(outcome is None for batch in results.values() for outcome in batch)

    def wait_idle(
        self, agents: Iterable[ClusterAgent | str] | None = None, timeout: float | None = None
    ) -> bool:
        """Whether ``agents`` (every agent, for None) went idle within ``timeout``."""
        per_shard: dict[int, list[str] | None]
        if agents is None:
            per_shard = dict.fromkeys(range(self.shards))
        else:
            ids = (a.id if isinstance(a, ClusterAgent) else a for a in agents)
            per_shard = dict(self.router.group(ids).items())
        self._check_open()
        waits = [self._outboxes[k].submit(WaitIdle(ids, timeout)) for k, ids in per_shard.items()]
        slack = None if timeout is None else timeout + self._links[0].verb_timeout
        return all(bool(wait.result(slack)) for wait in waits)

    # ------------------------------------------------------------------ events, durability

    def on(self, name: str, listener: Callable[[ClusterEvent], object]) -> Callable[[], None]:
        """Listen to a live event of every agent of every shard (a
        :class:`ClusterEvent`); returns a disposer. Notifications only: see
        :data:`~runtime.cluster.events.FORWARDED`."""
        return self.listen(name, listener, None)

    def listen(
        self, name: str, listener: Callable[[ClusterEvent], object], scope: str | None
    ) -> Callable[[], None]:
        self._check_open()
        return self._events.on(name, listener, scope)

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything every shard appended, and every send handed to one
        before the call, is durable on its disk (the acknowledgement of those sends: a
        shard's crash loses nothing a flush acknowledged). Raises the refusal of a send
        made with ``wait=False``, if any."""
        errors = [error for outbox in self._outboxes for error in outbox.drain()]
        if errors:
            raise errors[0]
        self._each("flush", dict.fromkeys(range(self.shards), (timeout,)))

    def shard_info(self) -> list[ShardInfo]:
        """Each shard's process, node and start (``pid`` is what a test SIGKILLs)."""
        results = self._each("info", dict.fromkeys(range(self.shards), ()))
        return [results[k] for k in range(self.shards)]

    def close(self, timeout: float | None = 30.0) -> None:
        """Close every shard's runtime (agents stop, inboxes kept), then the Ray actors,
        and the local Ray instance if this cluster started it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            for outbox in self._outboxes:  # what is queued is sent before the shards close
                outbox.close()
            for connection in self._connections:
                connection.close()
            refs = [link.submit("close", timeout) for link in self._links]
            for link, ref in zip(self._links, refs, strict=True):
                try:
                    link.wait(ref, "close", (timeout,), False, None)
                finally:
                    self._ray.kill(link.handle, no_restart=True)
        finally:
            self._events.close()
            if self._owns_ray:
                self._ray.shutdown()


def _shard_nodes(ray: Any, shard_cpus: float) -> list[str]:
    """The alive nodes with room for a shard, in a stable order."""
    nodes = [
        node["NodeID"]
        for node in ray.nodes()
        if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) >= shard_cpus
    ]
    return sorted(nodes)
