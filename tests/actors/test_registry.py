"""The registry actor: it starts actors on its worker and stops them, keeping no map."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pykka import ActorRef, ActorRegistry

from actors import PooledActor, RegistryActor

WAIT = 5.0


class Worker(PooledActor):
    def on_receive(self, message: Any) -> Any:
        return message


@pytest.fixture(autouse=True)
def _stop_every_actor() -> Iterator[None]:
    yield
    ActorRegistry.stop_all(timeout=WAIT)


def test_create_runs_the_factory_on_the_registrys_worker_and_returns_its_actor() -> None:
    registry = RegistryActor.start().proxy()
    ran_on: list[int] = []

    def factory() -> ActorRef[Any]:
        ran_on.append(threading.get_ident())
        return Worker.start()

    ref = registry.create(factory).get(timeout=WAIT)
    assert isinstance(ref, ActorRef)
    assert ref.ask("ping", timeout=WAIT) == "ping"
    assert ran_on != [threading.get_ident()]


def test_a_failing_factory_fails_the_create_and_the_registry_lives_on() -> None:
    def broken() -> ActorRef[Any]:
        raise RuntimeError("cannot build")

    registry = RegistryActor.start().proxy()
    with pytest.raises(RuntimeError, match="cannot build"):
        registry.create(broken).get(timeout=WAIT)
    assert registry.create(Worker.start).get(timeout=WAIT).ask("ok", timeout=WAIT) == "ok"


def test_create_many_starts_every_actor_in_order() -> None:
    registry = RegistryActor.start().proxy()
    refs = registry.create_many([Worker.start for _ in range(5)]).get(timeout=WAIT)
    assert [ref.ask(i, timeout=WAIT) for i, ref in enumerate(refs)] == list(range(5))
    assert len(set(refs)) == 5


def test_create_many_stops_what_it_started_when_a_factory_fails() -> None:
    first: list[ActorRef[Any]] = []

    def start_first() -> ActorRef[Any]:
        first.append(Worker.start())
        return first[0]

    def broken() -> ActorRef[Any]:
        raise RuntimeError("cannot build")

    registry = RegistryActor.start().proxy()
    with pytest.raises(RuntimeError, match="cannot build"):
        registry.create_many([start_first, broken]).get(timeout=WAIT)
    assert first[0].actor_stopped.wait(WAIT)
    assert not first[0].is_alive()


def test_stop_actor_stops_a_live_actor_and_leaves_a_stopped_one_alone() -> None:
    registry = RegistryActor.start().proxy()
    ref = registry.create(Worker.start).get(timeout=WAIT)
    registry.stop_actor(ref)  # told: nothing waits for the registry
    assert ref.actor_stopped.wait(WAIT)
    assert not ref.is_alive()
    assert registry.stop_actor(ref).get(timeout=WAIT) is None  # stopped: nothing to do
