"""Supervised agents: ``rt.spawn(..., restart=RestartPolicy(...))``.

A supervised agent whose actor crashes (an unexpected failure, or ``agent.kill``) is
resumed from its log by the runtime's :class:`actors.Supervisor`, within the policy's
intensity limit (at most ``max_restarts`` restarts in ``within_s`` seconds) and after an
exponential backoff with jitter served by the runtime's scheduler (a timer, never a
sleeping thread). A disposal, or the runtime's close, is no crash: it is not restarted.

What a user sees, in order: ``agent/disposed`` of the crashed handle (``agent.crash``
says why), then, after the backoff, ``agent/created`` and ``agent/session-start``
(``source="resume"``) of the new handle and ``agent/restart`` (``kind="restarted"``,
the restart count, the crash, the interrupted turn); past the limit one
``agent/restart`` with ``kind="gave-up"`` and the agent stays down. The crashed handle
stays disposed: ``rt.get(agent_id)`` (or the ``agent`` of the ``agent/restart`` event)
is the new one.

The interrupted work is *reported, not re-queued*: the turn the crash cut short is
closed ``interrupted`` by the resume (its ``turn/end``; ``agent/restart`` names it), as
``rt.resume`` does, because its tool calls may have run and running them again could
repeat their effects; a pending ``ask`` of it ends ``crashed``. Messages still pending
in the inbox (sent, never claimed) are kept by the resume and run at the agent's next
waking send.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
from pykka import ActorRef

from actors import AgentRestart, Backoff, RestartIntensity, Scheduler, SupervisionEvent, Supervisor
from storage import Interrupted, TurnEnd

from .errors import RuntimeClosedError

if TYPE_CHECKING:
    from actors import Bus

    from .agent import Agent

__all__ = ["RestartPolicy", "Supervision"]


class RestartPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a crashed agent is restarted: at most ``max_restarts`` in any ``within_s``
    seconds; restart *n* of that window waits ``backoff_s * factor**(n-1)`` seconds
    (at most ``max_backoff_s``), spread by ``± jitter`` (a fraction) drawn from a
    ``random.Random(seed)``."""

    max_restarts: int = 3
    within_s: float = 60.0
    backoff_s: float = 0.1
    factor: float = 2.0
    max_backoff_s: float = 10.0
    jitter: float = 0.1
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts is an int >= 0, got {self.max_restarts!r}")
        for name in ("within_s", "backoff_s", "max_backoff_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} is over 0 seconds, got {getattr(self, name)!r}")
        if self.factor < 1:
            raise ValueError(f"factor is at least 1, got {self.factor!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter is a fraction in [0, 1), got {self.jitter!r}")


class Supervision:
    """One supervised agent: its :class:`actors.Supervisor` and the announcements."""

    def __init__(
        self,
        agent_id: str,
        policy: RestartPolicy,
        *,
        scheduler: Scheduler,
        bus: Bus,
        ref_of: Callable[[Agent], ActorRef[Any]],
        resume: Callable[[], Agent],
    ) -> None:
        self._agent_id = agent_id
        self._bus = bus
        self._ref_of = ref_of
        self._resume = resume
        self._last: Agent | None = None
        self._crash = ""
        self._supervisor = Supervisor(
            scheduler=scheduler,
            strategy="restart",
            intensity=RestartIntensity(max_restarts=policy.max_restarts, within=policy.within_s),
            backoff=Backoff(
                initial=policy.backoff_s,
                factor=policy.factor,
                maximum=policy.max_backoff_s,
                jitter=policy.jitter,
                rng=random.Random(policy.seed),
            ),
            on_event=self._on_event,
        )

    def adopt(self, agent: Agent) -> None:
        """Supervise ``agent`` (just spawned) from now on."""
        self._last = agent
        first = [True]

        def factory() -> ActorRef[Any]:  # its first call adopts the spawned agent
            if first[0]:
                first[0] = False
                return self._ref_of(agent)
            return self._restart()

        self._supervisor.supervise(factory, name=self._agent_id)

    def close(self) -> None:
        """Stop supervising (a pending restart is cancelled); the agent is left as it is."""
        self._supervisor.close(stop_children=False)

    def _restart(self) -> ActorRef[Any]:
        """The supervisor's factory after a crash: resume the agent from its log."""
        crashed = self._last
        self._crash = repr(crashed.crash) if crashed is not None and crashed.crash else ""
        agent = self._resume()
        self._last = agent
        return self._ref_of(agent)

    def _on_event(self, event: SupervisionEvent) -> None:
        if event.kind not in ("restarted", "restart-failed", "gave-up"):
            self.close()  # exited (disposed, passivated, closed): no crash, nothing to restart
            return
        if isinstance(event.error, RuntimeClosedError):
            self.close()  # the runtime closed: nothing to restart into
            return
        agent = self._last
        if agent is None:
            return
        if event.kind == "gave-up" and agent.crash is not None:
            self._crash = repr(agent.crash)
        error = repr(event.error) if event.error is not None else self._crash
        interrupted = _interrupted_turn(agent) if event.kind == "restarted" else None
        payload = AgentRestart(
            agent=agent,
            kind=event.kind,
            restarts=event.restarts,
            error=error,
            interrupted_turn=interrupted,
        )
        self._bus.emit("agent/restart", payload, scope=self._agent_id)


def _interrupted_turn(agent: Agent) -> int | None:
    """The turn the resume closed ``interrupted``, if its last ``turn/end`` is one."""
    for fact in reversed(agent.session.events()):
        if isinstance(fact.data, TurnEnd):
            return fact.data.turn if isinstance(fact.data.reason, Interrupted) else None
    return None
