"""pykka's documented actor behaviour holds for PooledActor exactly as for ThreadingActor.

Every test runs twice, over ``pykka.ThreadingActor`` and ``actors.PooledActor``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pykka
import pytest
from pykka import ActorDeadError, ActorRegistry

from actors import PooledActor

WAIT = 5.0


@pytest.fixture(params=[pykka.ThreadingActor, PooledActor], ids=["threading", "pooled"])
def actor_class(request: pytest.FixtureRequest) -> type[pykka.Actor]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _stop_every_actor() -> Iterator[None]:
    yield
    ActorRegistry.stop_all(timeout=WAIT)


class Recorder:
    """Mixin: records every message, replies with it, and can be held on a gate."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.received: list[Any] = []
        self.gate = gate
        self.entered = threading.Event()
        self.started_before_first_message: bool | None = None
        self.on_start_thread: str | None = None
        self.stopped_event = threading.Event()

    def on_start(self) -> None:
        self.on_start_thread = threading.current_thread().name
        self.started_before_first_message = not self.received

    def on_receive(self, message: Any) -> Any:
        if message == "hold":
            self.entered.set()
            assert self.gate is not None
            self.gate.wait(WAIT)
        if message == "boom":
            raise ValueError("boom")
        if message == "exit":
            raise SystemExit("exit")
        self.received.append(message)
        return ("echo", message)

    def on_stop(self) -> None:
        self.stopped_event.set()

    def add(self, a: int, b: int) -> int:
        return a + b

    def history(self) -> list[Any]:
        return list(self.received)


class FailureRecorder(Recorder):
    def __init__(self, failures: list[BaseException | None], failed: threading.Event) -> None:
        super().__init__()
        self.failures = failures
        self.failed = failed

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        self.failures.append(exception_value)
        self.failed.set()


@pykka.traversable
class Nested:
    def __init__(self) -> None:
        self.value = 1

    def double(self) -> int:
        return self.value * 2


class WithNested:
    def __init__(self) -> None:
        super().__init__()
        self.nested = Nested()
        self.plain = "plain"


class FailingStart:
    def on_start(self) -> None:
        raise RuntimeError("cannot start")


def make(actor_class: type[pykka.Actor], *mixins: type) -> type[Any]:
    return type(f"{mixins[0].__name__}On{actor_class.__name__}", (*mixins, actor_class), {})


def test_start_registers_the_actor_and_returns_a_live_ref(actor_class: type[pykka.Actor]) -> None:
    ref = make(actor_class, Recorder).start()
    assert isinstance(ref, pykka.ActorRef)
    assert ref.is_alive()
    assert ActorRegistry.get_by_urn(ref.actor_urn) is ref


def test_on_start_runs_before_any_message(actor_class: type[pykka.Actor]) -> None:
    ref = make(actor_class, Recorder).start()
    ref.tell("first")
    proxy = ref.proxy()
    assert proxy.started_before_first_message.get(timeout=WAIT) is True
    assert proxy.on_start_thread.get(timeout=WAIT) != threading.current_thread().name


def test_messages_from_one_sender_are_handled_in_send_order(
    actor_class: type[pykka.Actor],
) -> None:
    ref = make(actor_class, Recorder).start()
    for i in range(500):
        ref.tell(i)
    assert ref.proxy().history().get(timeout=WAIT) == list(range(500))


def test_ask_blocks_for_the_reply_or_returns_a_future(actor_class: type[pykka.Actor]) -> None:
    ref = make(actor_class, Recorder).start()
    assert ref.ask("hi", timeout=WAIT) == ("echo", "hi")
    future = ref.ask("later", block=False)
    assert future.get(timeout=WAIT) == ("echo", "later")


def test_ask_with_a_timeout_raises_timeout_when_no_reply_comes(
    actor_class: type[pykka.Actor],
) -> None:
    gate = threading.Event()
    ref = make(actor_class, Recorder).start(gate)
    ref.tell("hold")
    with pytest.raises(pykka.Timeout):
        ref.ask("late", timeout=0.01)
    gate.set()
    assert ref.ask("after", timeout=WAIT) == ("echo", "after")


def test_proxy_calls_methods_and_gets_and_sets_attributes(actor_class: type[pykka.Actor]) -> None:
    proxy = make(actor_class, Recorder).start().proxy()
    assert proxy.add(2, 3).get(timeout=WAIT) == 5
    proxy.received = ["set"]
    assert proxy.received.get(timeout=WAIT) == ["set"]


def test_proxy_traverses_nested_traversable_attributes(actor_class: type[pykka.Actor]) -> None:
    proxy = make(actor_class, WithNested).start().proxy()
    assert proxy.nested.double().get(timeout=WAIT) == 2
    proxy.nested.value = 21
    assert proxy.nested.double().get(timeout=WAIT) == 42
    assert proxy.plain.get(timeout=WAIT) == "plain"


def test_stop_is_queued_behind_earlier_messages(actor_class: type[pykka.Actor]) -> None:
    gate = threading.Event()
    cls = make(actor_class, Recorder)
    ref = cls.start(gate)
    actor = ref._actor_weakref()
    ref.tell("hold")
    ref.tell("before-stop")
    stopped = ref.stop(block=False)
    gate.set()
    assert stopped.get(timeout=WAIT) is True
    assert actor.received == ["hold", "before-stop"]
    assert actor.stopped_event.is_set()
    assert not ref.is_alive()


def test_stop_of_an_already_dead_actor_returns_false(actor_class: type[pykka.Actor]) -> None:
    ref = make(actor_class, Recorder).start()
    assert ref.stop(timeout=WAIT) is True
    assert ref.stop(timeout=WAIT) is False


def test_a_failing_ask_raises_in_the_caller_and_the_actor_lives_on(
    actor_class: type[pykka.Actor],
) -> None:
    ref = make(actor_class, Recorder).start()
    with pytest.raises(ValueError, match="boom"):
        ref.ask("boom", timeout=WAIT)
    assert ref.is_alive()
    assert ref.ask("still here", timeout=WAIT) == ("echo", "still here")


def test_a_failing_tell_stops_the_actor_through_on_failure(actor_class: type[pykka.Actor]) -> None:
    failures: list[BaseException | None] = []
    failed = threading.Event()
    ref = make(actor_class, FailureRecorder).start(failures, failed)
    ref.tell("boom")
    assert failed.wait(WAIT)
    assert not ref.is_alive()
    assert ActorRegistry.get_by_urn(ref.actor_urn) is None
    assert len(failures) == 1
    assert isinstance(failures[0], ValueError)


def test_asks_left_in_the_mailbox_of_a_stopped_actor_get_actor_dead_error(
    actor_class: type[pykka.Actor],
) -> None:
    gate = threading.Event()
    ref = make(actor_class, Recorder).start(gate)
    ref.tell("hold")
    stopped = ref.stop(block=False)
    orphan = ref.ask("after stop", block=False)
    gate.set()
    assert stopped.get(timeout=WAIT) is True
    with pytest.raises(ActorDeadError):
        orphan.get(timeout=WAIT)


def test_tell_and_ask_to_a_dead_actor_raise_actor_dead_error(
    actor_class: type[pykka.Actor],
) -> None:
    ref = make(actor_class, Recorder).start()
    ref.stop(timeout=WAIT)
    with pytest.raises(ActorDeadError):
        ref.tell("nobody")
    with pytest.raises(ActorDeadError):
        ref.ask("nobody", timeout=WAIT)


def test_a_failing_on_start_stops_the_actor(actor_class: type[pykka.Actor]) -> None:
    ref = make(actor_class, FailingStart).start()
    assert ref.actor_stopped.wait(WAIT)
    assert ActorRegistry.get_by_urn(ref.actor_urn) is None


def test_stop_all_stops_every_registered_actor(actor_class: type[pykka.Actor]) -> None:
    cls = make(actor_class, Recorder)
    refs = [cls.start() for _ in range(20)]
    assert all(ActorRegistry.stop_all(timeout=WAIT))
    assert not any(ref.is_alive() for ref in refs)
    assert ActorRegistry.get_all() == []


def test_a_base_exception_in_a_handler_stops_every_actor(actor_class: type[pykka.Actor]) -> None:
    cls = make(actor_class, Recorder)
    bystander = cls.start()
    culprit = cls.start()
    culprit.tell("exit")
    assert culprit.actor_stopped.wait(WAIT)
    assert bystander.actor_stopped.wait(WAIT)


def test_on_stop_runs_when_the_actor_is_stopped(actor_class: type[pykka.Actor]) -> None:
    ref = make(actor_class, Recorder).start()
    actor = ref._actor_weakref()
    ref.stop(timeout=WAIT)
    assert actor.stopped_event.is_set()


def test_actor_urns_are_distinct_uuid4_urns() -> None:
    refs = [PooledActor.start() for _ in range(50)]
    try:
        urns = [ref.actor_urn for ref in refs]
        assert len(set(urns)) == 50
        for urn in urns:
            assert urn.startswith("urn:uuid:")
            parsed = uuid.UUID(urn.removeprefix("urn:uuid:"))
            assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
    finally:
        for ref in refs:
            ref.stop()
