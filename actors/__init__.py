"""Live machinery: dispatcher, I/O side, bus, agent actor and turn machine, registry."""

from actors._dispatcher import (
    DeadLetter,
    DeadLetters,
    Dispatcher,
    DispatcherStatistics,
    in_nonblocking_thread,
)
from actors._ioside import (
    BlockingWork,
    EffectCompleted,
    EffectHandle,
    IoSide,
    IoStatistics,
    Outcome,
    Work,
    blocking,
)
from actors._mailbox import ActorDeath, DeathWatcher, Mailbox, MailboxStatistics, Overflow
from actors._pooled import PooledActor, StoppedEvent, watch
from actors._registry import ActorCreated, ActorDisposed, RegistryActor
from actors._scheduler import (
    Clock,
    ManualClock,
    Scheduler,
    SchedulerStatistics,
    SystemClock,
    TimerHandle,
)
from actors._supervisor import (
    Backoff,
    RestartIntensity,
    Strategy,
    SupervisedChild,
    SupervisionEvent,
    Supervisor,
)
from actors.bus import Bus, Deferred, Listener, Ready
from actors.errors import (
    DispatcherShutdownError,
    DuplicateIdError,
    EngineError,
    IoSideClosedError,
    ListenerError,
    MailboxFullError,
    SchedulerClosedError,
)

__all__: list[str] = [
    "ActorCreated",
    "ActorDeath",
    "ActorDisposed",
    "Backoff",
    "BlockingWork",
    "Bus",
    "Clock",
    "DeadLetter",
    "DeadLetters",
    "DeathWatcher",
    "Deferred",
    "Dispatcher",
    "DispatcherShutdownError",
    "DispatcherStatistics",
    "DuplicateIdError",
    "EffectCompleted",
    "EffectHandle",
    "EngineError",
    "IoSide",
    "IoSideClosedError",
    "IoStatistics",
    "Listener",
    "ListenerError",
    "Mailbox",
    "MailboxFullError",
    "MailboxStatistics",
    "ManualClock",
    "Outcome",
    "Overflow",
    "PooledActor",
    "Ready",
    "RegistryActor",
    "RestartIntensity",
    "Scheduler",
    "SchedulerClosedError",
    "SchedulerStatistics",
    "StoppedEvent",
    "Strategy",
    "SupervisedChild",
    "SupervisionEvent",
    "Supervisor",
    "SystemClock",
    "TimerHandle",
    "Work",
    "blocking",
    "in_nonblocking_thread",
    "watch",
]
