"""The machinery one runtime runs on, started together: the dispatcher, the I/O side,
the scheduler, the bus, the agents' flush group and assembly, the registry actor, the
agent table (``runtime.table``), its starter (``runtime.starting``) and its close
(``runtime.close``). Each part that starts is undone if a later one fails to (out of
threads, say): a failed open leaves nothing running.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
from typing import NamedTuple

from actors import (
    Admission,
    Bus,
    Clock,
    Dispatcher,
    Durability,
    FlushGroup,
    IoSide,
    RegistryActor,
    Scheduler,
    UsageLimits,
    UsageMeter,
)
from storage import Store

from .assembly import Assembly
from .bridge import SessionBridge
from .close import Closing
from .starting import Starter
from .table import AgentTable

__all__ = ["UNDO_S", "Machinery", "start_machinery"]

UNDO_S = 5.0
"""What each part of a runtime whose open failed gets to stop (it ran nothing yet)."""


class Machinery(NamedTuple):
    """What a runtime's facade holds."""

    dispatcher: Dispatcher
    io: IoSide
    scheduler: Scheduler
    bus: Bus
    table: AgentTable
    starter: Starter
    closing: Closing


def _dispatcher(threads: int | None) -> Dispatcher:
    """``threads`` workers; by default, under a GIL, one worker plus a standby one that
    steps in while it is stuck in a blocking listener: two busy workers would only
    contend for the GIL (bench_turns measures ~25% more turns/s with one)."""
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    if threads is None and gil:
        return Dispatcher(1, standby=1, name="corral")
    return Dispatcher(threads, name="corral")


def start_machinery(
    undo: contextlib.ExitStack,
    store: Store,
    *,
    durability: Durability,
    threads: int | None,
    blocking_workers: int,
    max_steps: int | None,
    inbox_limit: int | None,
    limits: UsageLimits | None,
    agent_limits: UsageLimits | None,
    max_running_turns: int | None,
    owns_store: bool,
    tune_gc: bool,
    clock: Clock | None,
) -> Machinery:
    """Start a runtime's machinery over ``store``; what it started is stopped by
    ``undo`` (unless the caller pops it: opened)."""
    meter = None if limits is None else UsageMeter(limits, "the runtime")
    admission = None if max_running_turns is None else Admission(max_running_turns)
    lock = threading.Lock()  # the agent table's (runtime.table)
    dispatcher = _dispatcher(threads)
    undo.callback(dispatcher.shutdown, UNDO_S)
    io = IoSide(blocking_workers=blocking_workers, dead_letters=dispatcher.dead_letters)
    undo.callback(io.close, UNDO_S)
    scheduler = Scheduler(clock, dead_letters=dispatcher.dead_letters)
    undo.callback(scheduler.close, UNDO_S)
    bus = Bus(io)
    bridge = SessionBridge(bus, lock)  # session/event
    # The agents' durability waits: one log flush per round of the run queue.
    flushes = FlushGroup(store, dispatcher)
    assembly = Assembly(
        bus=bus,
        io=io,
        scheduler=scheduler,
        dispatcher=dispatcher,
        flushes=flushes,
        durability=durability,
        max_steps=max_steps,
        inbox_limit=inbox_limit,
        admission=admission,
    )
    # Starts and stops agent actors; which agents exist is the table's, which
    # announces them (see runtime.table).
    registry = RegistryActor.start(dispatcher=dispatcher)
    undo.callback(registry.stop, timeout=UNDO_S)
    # The live and passivated agents and the starts under way (runtime.table).
    table = AgentTable(
        store=store,
        bus=bus,
        lock=lock,
        bridge=bridge,
        assembly=assembly,
        registry=registry,
        dispatcher=dispatcher,
        scheduler=scheduler,
    )
    starter = Starter(
        table,
        store,
        id_prefix=uuid.uuid4().hex[:12],
        meter=meter,
        agent_limits=agent_limits,
    )
    closing = Closing(
        table,
        store=store,
        owns_store=owns_store,
        tuned_gc=tune_gc,
        dispatcher=dispatcher,
        scheduler=scheduler,
        io=io,
    )
    return Machinery(dispatcher, io, scheduler, bus, table, starter, closing)
