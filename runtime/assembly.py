"""Building one agent's parts (inbox, tool phase, turn machine, the start of its actor)
over its session, from what the runtime shares between its agents."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from pykka import ActorRef

from actors import (
    Admission,
    AgentActor,
    Bus,
    Dispatcher,
    Durability,
    FlushGroup,
    Inbox,
    IoSide,
    Model,
    Scheduler,
    Tool,
    ToolPhase,
    TurnMachine,
    UsageMeter,
)
from storage import RequestConfig

if TYPE_CHECKING:
    from actors import AgentLike
    from storage import Session

__all__ = ["Assembly", "Parts", "Spec"]


class Spec(NamedTuple):
    """What an agent was made of (to rebuild it after passivation)."""

    model: Model
    tools: dict[str, Tool]
    system: str | None
    meters: list[UsageMeter]
    """Its own meter (its ``limits``, or the runtime's ``agent_limits``) and the
    runtime's: kept across passivation, so that a rebuilt agent goes on counting."""


class Parts(NamedTuple):
    """One agent's parts, built but not started."""

    start: Callable[[], ActorRef[Any]]
    inbox: Inbox
    machine: TurnMachine


class Assembly(NamedTuple):
    """What a runtime's agents share, and the settings each is built with."""

    bus: Bus
    io: IoSide
    scheduler: Scheduler
    dispatcher: Dispatcher
    flushes: FlushGroup
    durability: Durability
    max_steps: int | None
    inbox_limit: int | None
    admission: Admission | None

    def parts(self, handle: AgentLike, session: Session, spec: Spec) -> Parts:
        """Build an agent's inbox, tool phase and turn machine over ``session``."""
        bus = self.bus
        model = spec.model
        agent_id = session.id

        def emit(name: str, payload: Any) -> None:
            bus.emit(name, payload, scope=agent_id)

        inbox = Inbox(
            append_fact=session.append_fact,
            emit=emit,
            agent=handle,
            limit=self.inbox_limit,
            listened=bus.maybe_listened,
        )
        inbox.load(*session.pending_inbox())

        def waterfall(name: str, event: Any, default: Callable[[], Any]) -> Any:
            return bus.waterfall(name, event, default, scope=agent_id)

        phase = ToolPhase(
            agent=handle,
            tools=spec.tools,
            append_fact=session.append_fact,
            waterfall=waterfall,
            emit=emit,
            listened=bus.maybe_listened,
        )
        machine = TurnMachine(
            agent=handle,
            session=session,
            inbox=inbox,
            bus=bus,
            tools=phase,
            default_config=lambda: RequestConfig(provider=model.provider, model=model.name),
            system=spec.system,
            durability=self.durability,
            max_steps=self.max_steps,
            meters=spec.meters,
            admission=self.admission,
        )

        def start() -> ActorRef[Any]:
            return AgentActor.start(
                machine=machine,
                inbox=inbox,
                session=session,
                model=model,
                io=self.io,
                scheduler=self.scheduler,
                bus=bus,
                flushes=self.flushes,
                dispatcher=self.dispatcher,
            )

        return Parts(start=start, inbox=inbox, machine=machine)
