"""The driver's line to one shard through Ray: its actor handle, and what to do when it
breaks.

A Ray actor call costs about one corral turn (~0.1-1 ms), so the facade makes one call
per verb *batch* per shard, never one per event, and only for what changes which agents
a shard hosts (spawn, resume, fork, dispose), its address and the event poll; an
agent's own verbs take the shard's direct connection (:mod:`runtime.cluster.connection`).
When the shard's process dies, Ray restarts it (``max_restarts``) and the calls in
flight fail with ``RayActorError``;
:meth:`ShardLink.call` sends such a call again (with ``retry=True`` where the shard
verb takes it, which makes it idempotent: see :mod:`runtime.cluster.shard`) until the
shard answers or ``verb_timeout`` passes, then raises :class:`ShardUnavailableError`.
An error the shard's code raised comes back as itself (``AgentDisposedError``, ...).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .errors import ShardUnavailableError

__all__ = ["ORDERED", "ORDERED_GROUP", "ShardLink"]

log = logging.getLogger("corral.cluster")

ORDERED_GROUP = "ordered"
ORDERED = frozenset({"spawn", "resume", "fork", "dispose", "close"})
"""The shard verbs that change which agents it hosts run one at a time (a Ray
concurrency group of one thread; Ray does not keep their order: see
:mod:`runtime.cluster.outbox` for how sends keep theirs). Sends, waits, reads and the
event poll run beside them on the actor's other threads."""

_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 1.0


class ShardLink:
    """Calls on shard ``index`` through its Ray actor ``handle``."""

    def __init__(self, ray: Any, index: int, handle: Any, verb_timeout: float) -> None:
        self._ray = ray
        self.index = index
        self.handle = handle
        self.verb_timeout = verb_timeout
        self.restarts_seen = 0  # calls that found the shard's process gone
        self.local_host = str(ray.util.get_node_ip_address())  # the driver's node

    def call(
        self, method: str, *args: Any, retried: bool = False, timeout: float | None = None
    ) -> Any:
        """``method(*args)`` on the shard, its result. ``retried``: the method's last
        argument is its ``retry`` flag, set on every attempt after the first."""
        return self.wait(
            self.submit(method, *args, retried=retried), method, args, retried, timeout
        )

    def submit(self, method: str, *args: Any, retried: bool = False) -> Any:
        """Start ``method(*args)`` and return its Ray object ref (see :meth:`wait`)."""
        return self._remote(method, (*args, False) if retried else args)

    def _remote(self, method: str, args: tuple[Any, ...]) -> Any:
        bound = getattr(self.handle, method)
        if method in ORDERED:
            bound = bound.options(concurrency_group=ORDERED_GROUP)
        return bound.remote(*args)

    def wait(
        self, ref: Any, method: str, args: tuple[Any, ...], retried: bool, timeout: float | None
    ) -> Any:
        """The result of ``ref`` (from :meth:`submit` of ``method(*args)``), sending the
        call again while the shard restarts."""
        exceptions = self._ray.exceptions
        until = time.monotonic() + self.verb_timeout
        backoff = _FIRST_BACKOFF_S
        while True:
            try:
                return self._ray.get(ref, timeout=timeout)
            except exceptions.RayTaskError as err:
                cause = err.cause
                if isinstance(cause, BaseException):
                    raise cause from None
                raise
            except exceptions.GetTimeoutError as err:
                raise TimeoutError(
                    f"shard {self.index} did not answer {method} within {timeout} s"
                ) from err
            except exceptions.RayActorError as err:
                self.restarts_seen += 1
                if time.monotonic() + backoff > until:
                    raise ShardUnavailableError(
                        f"shard {self.index} did not answer {method} for {self.verb_timeout} s "
                        f"(its process died and has not come back: {err}); check the Ray "
                        "cluster's nodes, or reopen the cluster"
                    ) from err
                log.info("shard %d unavailable during %s (%s); retrying", self.index, method, err)
                time.sleep(backoff)  # waiting for Ray to restart the process
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                ref = self._remote(method, (*args, True) if retried else args)
