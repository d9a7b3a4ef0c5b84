"""Live events as they leave a shard: plain records, buffered, drained in batches.

A shard listens (``rt.on``) only to the names some driver listener asked for; each event
becomes a :class:`ClusterEvent` (its agent as an id, its other fields as JSON-shaped
builtins) in one FIFO buffer, which the driver drains with a long poll. An agent's events
are appended by that agent's own actor, in order, so they reach the driver in order.

Only notifications cross (:data:`FORWARDED`): a waterfall or an awaited event (pre-step,
request, request-error, turn-stopping, the tools pipeline, session/flush) decides what
the agent does next and runs where the agent runs; register those with the cluster's
``setup`` factory.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Final

import msgspec

__all__ = ["FORWARDED", "ClusterEvent", "EventBuffer", "portable"]

FORWARDED: Final = frozenset(
    {
        "agent/created",
        "agent/session-start",
        "agent/disposed",
        "agent/status",
        "agent/inbox/inserted",
        "agent/inbox/claimed",
        "agent/inbox/discarded",
        "agent/settled",
        "agent/error",
        "session/event",
        "tools/result",
    }
)
"""The live events a driver can listen to."""

_LIVE_ONLY: Final = frozenset({"agent", "signal"})  # fields that cannot leave the process


class ClusterEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A live event of an agent in some shard, as the driver's listeners receive it.

    ``data`` holds the event's fields but the agent (``agent`` is its id) as builtins:
    ``agent/settled`` has ``{"turn": 3, "reason": {"kind": "completed"}}``,
    ``session/event`` has ``{"event": {"type": ..., "seq": ..., "time": ..., "data": ...}}``.
    """

    name: str
    agent: str
    shard: int
    data: dict[str, Any]


def portable(name: str, event: Any, shard: int) -> ClusterEvent:
    """``event`` (a live event struct) as a :class:`ClusterEvent`."""
    fields = {
        field: msgspec.to_builtins(getattr(event, field))
        for field in event.__struct_fields__
        if field not in _LIVE_ONLY
    }
    return ClusterEvent(name=name, agent=event.agent.id, shard=shard, data=fields)


class EventBuffer:
    """The shard's outgoing events, drained by the driver's long poll.

    Bounded: past ``limit`` events the oldest are dropped and counted (a driver that
    stopped polling must not grow the shard without bound); :meth:`drain` reports the
    count so the driver can say what it lost."""

    def __init__(self, limit: int = 1_000_000) -> None:
        self._events: deque[ClusterEvent] = deque()
        self._limit = limit
        self._dropped = 0
        self._ready = threading.Condition()

    def put(self, event: ClusterEvent) -> None:
        with self._ready:
            if len(self._events) >= self._limit:
                self._events.popleft()
                self._dropped += 1
            self._events.append(event)
            if len(self._events) == 1:
                self._ready.notify_all()

    def drain(self, max_wait_s: float, max_events: int) -> tuple[list[ClusterEvent], int]:
        """Up to ``max_events`` events, waiting up to ``max_wait_s`` for the first one;
        and how many were dropped since the last drain."""
        with self._ready:
            if not self._events:
                self._ready.wait(max_wait_s)
            count = min(len(self._events), max_events)
            batch = [self._events.popleft() for _ in range(count)]
            dropped, self._dropped = self._dropped, 0
        return batch, dropped

    def wake(self) -> None:
        """End a waiting drain at once (the shard closes)."""
        with self._ready:
            self._ready.notify_all()
