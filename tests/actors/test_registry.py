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
