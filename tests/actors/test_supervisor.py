"""Supervision: restart, stop or escalate on unexpected deaths, within an intensity limit."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import pytest
from pykka import ActorRef, ActorRegistry

from actors import (
    ActorDeath,
    Backoff,
    ManualClock,
    PooledActor,
    RestartIntensity,
    Scheduler,
    SupervisionEvent,
    Supervisor,
)

WAIT = 5.0


class Fragile(PooledActor):
    def on_receive(self, message: Any) -> Any:
        if message == "crash":
            raise RuntimeError("crash")
        return message


@pytest.fixture(autouse=True)
def _stop_every_actor() -> Iterator[None]:
    yield
    ActorRegistry.stop_all(timeout=WAIT)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def scheduler(clock: ManualClock) -> Iterator[Scheduler]:
    s = Scheduler(clock)
    yield s
    s.close()


class Events:
    def __init__(self) -> None:
        self.queue: queue.Queue[SupervisionEvent] = queue.Queue()

    def __call__(self, event: SupervisionEvent) -> None:
        self.queue.put(event)

    def next(self) -> SupervisionEvent:
        return self.queue.get(timeout=WAIT)


class Factory:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> ActorRef[Any]:
        self.calls += 1
        return Fragile.start()


def test_a_crashed_child_is_restarted_by_its_factory(scheduler: Scheduler) -> None:
    events, factory = Events(), Factory()
    supervisor = Supervisor(scheduler=scheduler, on_event=events)
    child = supervisor.supervise(factory, name="worker")
    first = child.ref
    assert first is not None
    first.tell("crash")
    event = events.next()
    assert (event.name, event.kind, event.restarts) == ("worker", "restarted", 1)
    assert factory.calls == 2
    assert child.ref is not first
    assert child.ref is not None
    assert child.ref.ask("alive?", timeout=WAIT) == "alive?"
    assert child.state == "running"


def test_a_requested_stop_is_not_restarted(scheduler: Scheduler) -> None:
    events, factory = Events(), Factory()
    supervisor = Supervisor(scheduler=scheduler, on_event=events)
    child = supervisor.supervise(factory, name="worker")
    assert child.ref is not None
    child.ref.stop(timeout=WAIT)
    event = events.next()
    assert event.kind == "exited"
    assert event.death is not None
    assert not event.death.failed
    assert factory.calls == 1
    assert child.state == "exited"


def test_the_stop_strategy_leaves_a_crashed_child_stopped(scheduler: Scheduler) -> None:
    events, factory = Events(), Factory()
    supervisor = Supervisor(scheduler=scheduler, strategy="stop", on_event=events)
    child = supervisor.supervise(factory, name="worker")
    assert child.ref is not None
    child.ref.tell("crash")
    event = events.next()
    assert event.kind == "stopped"
    assert event.death is not None
    assert isinstance(event.death.error, RuntimeError)
    assert factory.calls == 1


def test_the_escalate_strategy_calls_the_escalation_callback(scheduler: Scheduler) -> None:
    escalated, factory = Events(), Factory()
    supervisor = Supervisor(scheduler=scheduler, on_escalate=escalated)
    child = supervisor.supervise(factory, name="worker", strategy="escalate")
    assert child.ref is not None
    child.ref.tell("crash")
    event = escalated.next()
    assert (event.name, event.kind) == ("worker", "escalated")
    assert child.state == "escalated"


def test_past_the_intensity_limit_the_supervisor_gives_up(
    clock: ManualClock, scheduler: Scheduler
) -> None:
    events, factory = Events(), Factory()
    supervisor = Supervisor(
        scheduler=scheduler,
        intensity=RestartIntensity(max_restarts=2, within=10.0),
        on_event=events,
    )
    child = supervisor.supervise(factory, name="worker")
    for expected in (1, 2):
        assert child.ref is not None
        child.ref.tell("crash")
        assert events.next().restarts == expected
        clock.advance(1)
    assert child.ref is not None
    child.ref.tell("crash")
    event = events.next()
    assert event.kind == "gave-up"
    assert child.state == "gave-up"
    assert factory.calls == 3


def test_restarts_spread_beyond_the_window_do_not_count(
    clock: ManualClock, scheduler: Scheduler
) -> None:
    events, factory = Events(), Factory()
    supervisor = Supervisor(
        scheduler=scheduler,
        intensity=RestartIntensity(max_restarts=1, within=5.0),
        on_event=events,
    )
    child = supervisor.supervise(factory, name="worker")
    for expected in (1, 2, 3):
        assert child.ref is not None
        child.ref.tell("crash")
        assert events.next().kind == "restarted"
        assert child.restarts == expected
        clock.advance(5.0)


def test_a_backoff_delays_the_restart_on_the_scheduler(
    clock: ManualClock, scheduler: Scheduler
) -> None:
    events, factory = Events(), Factory()
    supervisor = Supervisor(
        scheduler=scheduler,
        backoff=Backoff(initial=1.0, factor=2.0, maximum=30.0),
        intensity=RestartIntensity(max_restarts=5, within=100.0),
        on_event=events,
    )
    child = supervisor.supervise(factory, name="worker")
    dead = Events()
    for delay in (1.0, 2.0):
        assert child.ref is not None
        supervisor.watch(child.ref, lambda _r, d: dead(SupervisionEvent("w", "exited", 0, d)))
        child.ref.tell("crash")
        dead.next()
        assert child.state == "restarting"
        clock.advance(delay - 0.5)
        assert child.state == "restarting"
        clock.advance(0.5)
        assert events.next().kind == "restarted"
    assert factory.calls == 3


def test_a_failing_restart_counts_against_the_intensity(scheduler: Scheduler) -> None:
    events = Events()
    calls: list[int] = []

    def flaky() -> ActorRef[Any]:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("cannot restart")
        return Fragile.start()

    supervisor = Supervisor(
        scheduler=scheduler,
        intensity=RestartIntensity(max_restarts=2, within=60.0),
        on_event=events,
    )
    child = supervisor.supervise(flaky, name="worker")
    assert child.ref is not None
    child.ref.tell("crash")
    kinds = [events.next().kind for _ in range(3)]
    assert kinds == ["restart-failed", "restart-failed", "gave-up"]
    assert len(calls) == 3


def test_a_child_stopped_through_the_supervisor_is_forgotten(scheduler: Scheduler) -> None:
    events, factory = Events(), Factory()
    supervisor = Supervisor(scheduler=scheduler, on_event=events)
    child = supervisor.supervise(factory, name="worker")
    watched: queue.Queue[ActorDeath] = queue.Queue()
    assert child.ref is not None
    supervisor.watch(child.ref, lambda _r, d: watched.put(d))
    supervisor.stop("worker")
    assert not watched.get(timeout=WAIT).failed
    assert supervisor.children() == ()
    assert events.queue.empty()
