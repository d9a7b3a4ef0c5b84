"""Live events in the driver: one pump thread per shard, listeners by name.

A pump long-polls its shard (:meth:`Shard.poll`: it returns as soon as events wait, with
up to ``batch`` of them) and calls the driver's listeners of each event's name in the
order the shard emitted them, so an agent's events arrive in order. A listener's failure
is logged and contained, as on a runtime's bus (``emit``).

A shard forwards only the names someone listens to. When its process restarts, the pump
finds the poll failing, waits for the shard to answer again and tells it the names once
more; events emitted by the dead process and not yet polled are lost (live events are
not durable: the session log is, and ``agent.events()`` reads it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .events import FORWARDED, ClusterEvent
from .transport import ShardLink

__all__ = ["Forwarding"]

log = logging.getLogger("corral.cluster")

Listener = Callable[[ClusterEvent], object]

_POLL_S = 0.5  # the longest a poll waits for a first event
_BATCH = 4096


class Forwarding:
    """The listeners of a cluster and the pumps that feed them."""

    def __init__(self, ray: Any, links: list[ShardLink]) -> None:
        self._ray = ray
        self._links = links
        self._lock = threading.Lock()
        # name -> (agent id or None for every agent, listener), in registration order
        self._listeners: dict[str, list[tuple[str | None, Listener]]] = {}
        self._pumps: list[threading.Thread] = []
        self._closed = threading.Event()
        self.dropped = 0  # events a shard dropped because nobody polled in time

    def on(self, name: str, listener: Listener, scope: str | None) -> Callable[[], None]:
        if type(name) is not str:
            raise TypeError(f"a live event name is a str, got {name!r}")
        if name not in FORWARDED:
            known = ", ".join(sorted(FORWARDED))
            raise ValueError(
                f"live event {name!r} is not forwarded from shards (waterfalls and awaited "
                "events run where the agent runs: register them in the cluster's setup "
                f"factory); forwarded: {known}"
            )
        if not callable(listener):
            raise TypeError(f"a listener must be callable, got {listener!r}")
        entry = (scope, listener)
        with self._lock:
            first = name not in self._listeners
            self._listeners.setdefault(name, []).append(entry)
            if not self._pumps:
                self._start_pumps()
        if first:  # every shard forwards it before on() returns
            refs = [link.submit("listen", [name]) for link in self._links]
            for link, ref in zip(self._links, refs, strict=True):
                link.wait(ref, "listen", ([name],), False, None)

        def dispose() -> None:
            with self._lock:
                entries = self._listeners.get(name, [])
                if entry in entries:
                    entries.remove(entry)
                last = not entries and name in self._listeners
                if last:
                    del self._listeners[name]
            if last and not self._closed.is_set():
                for link in self._links:
                    link.submit("unlisten", [name])

        return dispose

    def names(self) -> list[str]:
        with self._lock:
            return list(self._listeners)

    def _start_pumps(self) -> None:
        for link in self._links:
            pump = threading.Thread(
                target=self._pump, args=(link,), name=f"corral-events-{link.index}", daemon=True
            )
            pump.start()
            self._pumps.append(pump)

    def _pump(self, link: ShardLink) -> None:
        exceptions = self._ray.exceptions
        while not self._closed.is_set():
            try:
                events, dropped = self._ray.get(link.handle.poll.remote(_POLL_S, _BATCH))
            except exceptions.RayActorError:
                if self._closed.is_set():
                    return
                self._relisten(link)
                continue
            except Exception:  # the shard's poll itself failed: keep the pump alive
                log.exception("shard %d: event poll failed", link.index)
                if self._closed.wait(_POLL_S):
                    return
                continue
            if dropped:
                self.dropped += dropped
                log.warning(
                    "shard %d dropped %d live events (polled too late)", link.index, dropped
                )
            for event in events:
                self._deliver(event)

    def _relisten(self, link: ShardLink) -> None:
        """Wait for a restarted shard and tell it the names listened to."""
        backoff = 0.05
        while not self._closed.is_set():
            try:
                self._ray.get(link.handle.listen.remote(self.names()))
            except self._ray.exceptions.RayActorError:
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            return

    def _deliver(self, event: ClusterEvent) -> None:
        with self._lock:
            entries = list(self._listeners.get(event.name, ()))
        for scope, listener in entries:
            if scope is not None and scope != event.agent:
                continue
            try:
                listener(event)
            except Exception:
                log.exception("a listener of %s failed (contained)", event.name)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the pumps (each ends within one poll once its shard closed)."""
        self._closed.set()
        until = time.monotonic() + timeout
        for pump in self._pumps:
            pump.join(max(0.0, until - time.monotonic()))
