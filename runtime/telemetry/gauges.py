"""The two gauges, ``corral.agent.inbox.depth`` and ``corral.agents.running``: kept as
plain counts from the inbox and status events, observed when a reader collects (the
hot path only counts)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from actors import AgentDisposed, AgentStatusChanged, InboxClaimed, InboxDiscarded, InboxInserted

from . import semconv as sc

if TYPE_CHECKING:
    from runtime.runtime import Runtime

__all__ = ["Gauges"]


class Gauges:
    """Counts messages waiting in inboxes and agents running a turn chain."""

    def __init__(self, rt: Runtime, meter: metrics.Meter) -> None:
        meter.create_observable_gauge(
            sc.METRIC_INBOX_DEPTH,
            [self._observe_depth],
            "{message}",
            "Messages waiting in agents' inboxes",
        )
        meter.create_observable_gauge(
            sc.METRIC_RUNNING_AGENTS,
            [self._observe_running],
            "{agent}",
            "Agents running a turn chain",
        )
        self._depth: dict[str, int] = {}
        self._waiting = 0  # the sum of _depth
        self._running_ids: set[str] = set()
        self._lock = threading.Lock()  # (several agents' threads)
        self.disposers: list[Callable[[], None]] = [
            rt.on("agent/status", self._on_status),
            rt.on("agent/inbox/inserted", self._on_inserted),
            rt.on("agent/inbox/claimed", self._on_removed),
            rt.on("agent/inbox/discarded", self._on_removed),
        ]

    def _on_status(self, event: AgentStatusChanged) -> None:
        agent_id = event.agent.id
        with self._lock:
            if event.status == "running":
                self._running_ids.add(agent_id)
            else:
                self._running_ids.discard(agent_id)

    def _on_inserted(self, event: InboxInserted) -> None:
        with self._lock:
            self._depth[event.agent.id] = self._depth.get(event.agent.id, 0) + 1
            self._waiting += 1

    def _on_removed(self, event: InboxClaimed | InboxDiscarded) -> None:
        agent_id = event.agent.id
        with self._lock:
            depth = self._depth.get(agent_id, 0)
            if depth == 0:  # inserted before instrument() was called
                return
            if depth == 1:
                del self._depth[agent_id]
            else:
                self._depth[agent_id] = depth - 1
            self._waiting -= 1

    def disposed(self, event: AgentDisposed) -> None:
        """``event.agent`` is gone: it runs nothing and waits for nothing any more."""
        agent_id = event.agent.id
        with self._lock:
            self._running_ids.discard(agent_id)
            self._waiting -= self._depth.pop(agent_id, 0)

    def _observe_depth(self, _: CallbackOptions) -> Iterable[Observation]:
        return (Observation(self._waiting),)

    def _observe_running(self, _: CallbackOptions) -> Iterable[Observation]:
        return (Observation(len(self._running_ids)),)
