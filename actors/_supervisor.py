"""Supervision: restart, stop or escalate when a supervised actor dies unexpectedly.

A supervised child is started by a factory. When its actor stops through a
failure (not a requested stop), the child's strategy applies:

- ``restart``: call the factory again, after an optional exponential backoff
  served by the :class:`Scheduler`, within an Erlang-style intensity limit (at
  most ``max_restarts`` restarts in ``within`` seconds; past that the supervisor
  gives up and reports ``gave-up``);
- ``stop``: leave it stopped and report;
- ``escalate``: call ``on_escalate``.

Every decision is reported to ``on_event`` as a :class:`SupervisionEvent`.
Death callbacks run on the worker that tore the actor down, so factories must be
quick (start an actor, return its ref).
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pykka import ActorRef

from actors._mailbox import ActorDeath, DeathWatcher
from actors._pooled import watch
from actors._scheduler import Scheduler, TimerHandle
from actors.clock import Clock, SystemClock
from actors.errors import DuplicateIdError

__all__ = [
    "Backoff",
    "RestartIntensity",
    "Strategy",
    "SupervisedChild",
    "SupervisionEvent",
    "Supervisor",
]

logger = logging.getLogger("corral.supervisor")

Strategy = Literal["restart", "stop", "escalate"]
ChildState = Literal["running", "restarting", "exited", "stopped", "escalated", "gave-up"]
EventKind = Literal["exited", "restarted", "restart-failed", "stopped", "escalated", "gave-up"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before restart number ``attempt`` (1-based) within the intensity window.

    ``jitter``: a fraction; each delay is drawn uniformly from ``delay * (1 ± jitter)``
    with ``rng`` (injectable: a seeded ``random.Random`` makes the delays repeatable)."""

    initial: float = 0.1
    factor: float = 2.0
    maximum: float = 10.0
    jitter: float = 0.0
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delay(self, attempt: int) -> float:
        base = float(min(self.maximum, self.initial * self.factor ** max(0, attempt - 1)))
        if self.jitter <= 0:
            return base
        return base * (1.0 + self.rng.uniform(-self.jitter, self.jitter))


@dataclass(frozen=True, slots=True)
class RestartIntensity:
    """At most ``max_restarts`` restarts in any ``within`` seconds."""

    max_restarts: int = 3
    within: float = 5.0


@dataclass(frozen=True, slots=True)
class SupervisionEvent:
    name: str
    kind: EventKind
    restarts: int
    death: ActorDeath | None = None
    error: BaseException | None = None


class SupervisedChild:
    """A supervised actor: its current ``ref`` changes on every restart."""

    def __init__(self, name: str, factory: Callable[[], ActorRef[Any]], strategy: Strategy) -> None:
        self.name = name
        self.factory = factory
        self.strategy: Strategy = strategy
        self.ref: ActorRef[Any] | None = None
        self.state: ChildState = "running"
        self.restarts = 0
        self._recent: deque[float] = deque()  # restart times inside the intensity window
        self._timer: TimerHandle | None = None
        self._unwatch: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"<SupervisedChild {self.name} {self.state} restarts={self.restarts}>"


class Supervisor:
    """Starts children through factories and applies a strategy when one dies."""

    def __init__(
        self,
        *,
        scheduler: Scheduler | None = None,
        strategy: Strategy = "restart",
        intensity: RestartIntensity | None = None,
        backoff: Backoff | None = None,
        on_event: Callable[[SupervisionEvent], None] | None = None,
        on_escalate: Callable[[SupervisionEvent], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if backoff is not None and scheduler is None:
            raise ValueError("a restart backoff needs a scheduler to wait without a thread")
        self._scheduler = scheduler
        self._clock: Clock = clock or (scheduler.clock if scheduler else SystemClock())
        self._strategy: Strategy = strategy
        self._intensity = intensity or RestartIntensity()
        self._backoff = backoff
        self._on_event = on_event
        self._on_escalate = on_escalate
        self._lock = threading.RLock()
        self._children: dict[str, SupervisedChild] = {}

    def supervise(
        self,
        factory: Callable[[], ActorRef[Any]],
        *,
        name: str,
        strategy: Strategy | None = None,
    ) -> SupervisedChild:
        """Start a child now with ``factory()``; its failures are handled from then on."""
        with self._lock:
            if name in self._children:
                raise DuplicateIdError(name)
            child = SupervisedChild(name, factory, strategy or self._strategy)
            self._children[name] = child
        try:
            ref = factory()
        except BaseException:
            with self._lock:
                del self._children[name]
            raise
        self._adopt(child, ref)
        return child

    def watch(self, ref: ActorRef[Any], callback: DeathWatcher) -> Callable[[], None]:
        """Observe any pooled actor's death: ``callback(ref, death)``; returns a disposer."""
        return watch(ref, callback)

    def child(self, name: str) -> SupervisedChild:
        return self._children[name]

    def children(self) -> tuple[SupervisedChild, ...]:
        with self._lock:
            return tuple(self._children.values())

    def stop(self, name: str) -> None:
        """Stop a child on purpose: no strategy applies; it is forgotten."""
        with self._lock:
            child = self._children.pop(name)
            child.state = "stopped"
            self._forget(child)
        if child.ref is not None and child.ref.is_alive():
            child.ref.stop(block=False)

    def close(self, *, stop_children: bool = True) -> None:
        """Stop supervising (cancel pending restarts); optionally stop every child."""
        for child in self.children():
            if stop_children:
                self.stop(child.name)
            else:
                with self._lock:
                    self._children.pop(child.name, None)
                    self._forget(child)

    # -- internals -------------------------------------------------------------------

    def _forget(self, child: SupervisedChild) -> None:
        if child._timer is not None:
            child._timer.cancel()
            child._timer = None
        if child._unwatch is not None:
            child._unwatch()
            child._unwatch = None

    def _adopt(self, child: SupervisedChild, ref: ActorRef[Any]) -> None:
        with self._lock:
            child.ref = ref
            child.state = "running"
        child._unwatch = watch(ref, lambda dead, death: self._on_death(child, dead, death))

    def _on_death(self, child: SupervisedChild, ref: ActorRef[Any], death: ActorDeath) -> None:
        with self._lock:
            if child.ref is not ref or child.state != "running":
                return  # a stale watcher, or the child was stopped on purpose
            if death.failed:
                event, restart_now = self._decide(child, death, None)
            else:
                child.state = "exited"
                event = SupervisionEvent(child.name, "exited", child.restarts, death)
                restart_now = False
        if event is not None:
            self._report(event)
        if restart_now:
            self._restart(child)

    def _decide(
        self, child: SupervisedChild, death: ActorDeath | None, error: BaseException | None
    ) -> tuple[SupervisionEvent | None, bool]:
        """Apply the strategy (caller holds _lock): (event to report, restart now?)."""
        if child.strategy == "stop":
            child.state = "stopped"
            return SupervisionEvent(child.name, "stopped", child.restarts, death, error), False
        if child.strategy == "escalate":
            child.state = "escalated"
            return SupervisionEvent(child.name, "escalated", child.restarts, death, error), False
        now = self._clock.monotonic()
        recent = child._recent
        while recent and recent[0] <= now - self._intensity.within:
            recent.popleft()
        if len(recent) >= self._intensity.max_restarts:
            child.state = "gave-up"
            return SupervisionEvent(child.name, "gave-up", child.restarts, death, error), False
        recent.append(now)
        child.state = "restarting"
        delay = self._backoff.delay(len(recent)) if self._backoff else 0.0
        if delay > 0 and self._scheduler is not None:
            child._timer = self._scheduler.call_later(delay, lambda: self._restart(child))
            return None, False
        return None, True

    def _restart(self, child: SupervisedChild) -> None:
        with self._lock:
            if child.state != "restarting" or self._children.get(child.name) is not child:
                return
            child._timer = None
        try:
            ref = child.factory()
        except Exception as error:
            logger.exception("restarting %s failed", child.name)
            with self._lock:
                child.ref = None
                # The failed attempt already counted against the intensity.
                event, restart_now = self._decide(child, None, error)
            failed = SupervisionEvent(child.name, "restart-failed", child.restarts, None, error)
            self._report(failed)
            if event is not None:
                self._report(event)
            if restart_now:
                self._restart(child)
            return
        with self._lock:
            child.restarts += 1
        self._adopt(child, ref)
        self._report(SupervisionEvent(child.name, "restarted", child.restarts))

    def _report(self, event: SupervisionEvent) -> None:
        if event.kind == "escalated" and self._on_escalate is not None:
            self._call(self._on_escalate, event)
        if self._on_event is not None:
            self._call(self._on_event, event)

    @staticmethod
    def _call(callback: Callable[[SupervisionEvent], None], event: SupervisionEvent) -> None:
        try:
            callback(event)
        except Exception:
            logger.exception("supervision callback failed for %s", event.name)
