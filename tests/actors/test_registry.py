"""The generic registry actor: unique ids, announcements by callback, removal stops the actor."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import pytest
from pykka import ActorRef, ActorRegistry

from actors import (
    DuplicateIdError,
    PooledActor,
    RegistryActor,
)

WAIT = 5.0


class Worker(PooledActor):
    def on_receive(self, message: Any) -> Any:
        return message


@pytest.fixture(autouse=True)
def _stop_every_actor() -> Iterator[None]:
    yield
    ActorRegistry.stop_all(timeout=WAIT)


def test_create_registers_a_new_actor_under_its_id() -> None:
    registry = RegistryActor.start().proxy()
    ref = registry.create("a", Worker.start).get(timeout=WAIT)
    assert isinstance(ref, ActorRef)
    assert ref.ask("ping", timeout=WAIT) == "ping"
    assert registry.get("a").get(timeout=WAIT) is ref
    assert registry.get("missing").get(timeout=WAIT) is None
    assert registry.ids().get(timeout=WAIT) == ["a"]


def test_a_duplicate_id_is_refused_and_the_registry_lives_on() -> None:
    registry = RegistryActor.start().proxy()
    registry.create("a", Worker.start).get(timeout=WAIT)
    with pytest.raises(DuplicateIdError, match="'a' is already registered"):
        registry.create("a", Worker.start).get(timeout=WAIT)
    assert registry.ids().get(timeout=WAIT) == ["a"]


def test_remove_announces_disposal_after_the_actor_has_stopped() -> None:
    events: queue.Queue[tuple[str, str, bool]] = queue.Queue()
    refs: dict[str, ActorRef[Any]] = {}

    def created(id_: str, ref: ActorRef[Any]) -> None:
        refs[id_] = ref
        events.put(("created", id_, ref.is_alive()))

    def disposed(id_: str) -> None:
        events.put(("disposed", id_, refs[id_].is_alive()))

    registry = RegistryActor.start(on_created=created, on_disposed=disposed).proxy()
    registry.create("x", Worker.start).get(timeout=WAIT)
    assert registry.remove("x").get(timeout=WAIT) is True
    assert registry.remove("x").get(timeout=WAIT) is False
    assert events.get(timeout=WAIT) == ("created", "x", True)
    assert events.get(timeout=WAIT) == ("disposed", "x", False)
    assert registry.ids().get(timeout=WAIT) == []


def test_remove_without_stop_only_forgets_the_id() -> None:
    disposed: queue.Queue[str] = queue.Queue()
    registry = RegistryActor.start(on_disposed=disposed.put).proxy()
    ref = registry.create("keep", Worker.start).get(timeout=WAIT)
    assert registry.remove("keep", stop=False).get(timeout=WAIT) is True
    assert disposed.get(timeout=WAIT) == "keep"
    assert ref.is_alive()


def test_a_failing_factory_fails_the_create_and_registers_nothing() -> None:
    def broken() -> ActorRef[Any]:
        raise RuntimeError("cannot build")

    registry = RegistryActor.start().proxy()
    with pytest.raises(RuntimeError, match="cannot build"):
        registry.create("a", broken).get(timeout=WAIT)
    assert registry.ids().get(timeout=WAIT) == []


def test_create_many_registers_every_actor_and_announces_each_in_order() -> None:
    created: list[str] = []
    registry = RegistryActor.start(on_created=lambda id_, _ref: created.append(id_)).proxy()
    refs = registry.create_many([(f"a{i}", Worker.start) for i in range(5)]).get(timeout=WAIT)
    assert [ref.ask(i, timeout=WAIT) for i, ref in enumerate(refs)] == list(range(5))
    assert registry.ids().get(timeout=WAIT) == [f"a{i}" for i in range(5)]
    assert created == [f"a{i}" for i in range(5)]


def test_create_many_with_a_taken_or_repeated_id_starts_nothing() -> None:
    registry = RegistryActor.start().proxy()
    registry.create("a", Worker.start).get(timeout=WAIT)
    started: list[int] = []

    def counted() -> ActorRef[Any]:
        started.append(1)
        return Worker.start()

    with pytest.raises(DuplicateIdError, match="'a' is already registered"):
        registry.create_many([("b", counted), ("a", counted)]).get(timeout=WAIT)
    with pytest.raises(DuplicateIdError, match="'c' is already registered"):
        registry.create_many([("c", counted), ("c", counted)]).get(timeout=WAIT)
    assert started == []
    assert registry.ids().get(timeout=WAIT) == ["a"]


def test_create_many_stops_what_it_started_when_a_factory_fails() -> None:
    first: list[ActorRef[Any]] = []

    def start_first() -> ActorRef[Any]:
        first.append(Worker.start())
        return first[0]

    def broken() -> ActorRef[Any]:
        raise RuntimeError("cannot build")

    registry = RegistryActor.start().proxy()
    with pytest.raises(RuntimeError, match="cannot build"):
        registry.create_many([("a", start_first), ("b", broken)]).get(timeout=WAIT)
    assert registry.ids().get(timeout=WAIT) == []
    first[0].actor_stopped.wait(WAIT)
    assert not first[0].is_alive()
