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
    meters: tuple[UsageMeter, ...]
    """Its own meter (its ``limits``, or the runtime's ``agent_limits``) and the
    runtime's: kept across passivation, so that a rebuilt agent goes on counting. (A
    tuple: the turn machine keeps it as it is; agents without a meter of their own
    share one spec.)"""


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
        # Small objects, not closures: an agent keeps these for as long as it is live
        # (four closures held ~800 bytes of every idle agent; see _ScopedBus).
        scoped = _ScopedBus(bus, session.id)
        append = session.append_fact  # (one bound method for both)
        inbox = Inbox(
            append_fact=append,
            emit=scoped,
            agent=handle,
            limit=self.inbox_limit,
            listened=bus.maybe_listened,
        )
        inbox.load(*session.pending_inbox())
        phase = ToolPhase(
            agent=handle,
            tools=spec.tools,
            append_fact=append,
            waterfall=scoped.waterfall,
            emit=scoped,
            listened=bus.maybe_listened,
        )
        machine = TurnMachine(
            agent=handle,
            session=session,
            inbox=inbox,
            bus=bus,
            tools=phase,
            default_config=_DefaultConfig(model),
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


class _ScopedBus:
    """``emit`` (the call) and ``waterfall`` on the bus, scoped to one agent."""

    __slots__ = ("bus", "scope")

    def __init__(self, bus: Bus, scope: str) -> None:
        self.bus = bus
        self.scope = scope

    def __call__(self, name: str, payload: Any) -> None:
        self.bus.emit(name, payload, scope=self.scope)

    def waterfall(self, name: str, event: Any, default: Callable[[], Any]) -> Any:
        return self.bus.waterfall(name, event, default, scope=self.scope)


class _DefaultConfig:
    """The request config of an agent whose ``request/config`` listeners set none."""

    __slots__ = ("model",)

    def __init__(self, model: Model) -> None:
        self.model = model

    def __call__(self) -> RequestConfig:
        return RequestConfig(provider=self.model.provider, model=self.model.name)
