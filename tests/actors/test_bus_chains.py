"""The bus (CONTRACT section 8): serial and waterfall chains over sync and async listeners."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest

from actors import Bus, Deferred, IoSide, ListenerError, Ready

from .bus_support import WAIT, run_deferred

# -- serial ----------------------------------------------------------------------------


def test_serial_with_sync_listeners_runs_inline_in_order(bus: Bus) -> None:
    calls: list[str] = []
    bus.on("s", lambda _e: calls.append(threading.current_thread().name))
    bus.on("s", lambda _e: calls.append("second"))
    assert bus.serial("s", None) == Ready(None)
    assert calls == [threading.current_thread().name, "second"]
    assert bus.serial("nobody listens", None) == Ready(None)


def test_serial_stops_at_the_first_failure_and_raises_listener_error(bus: Bus) -> None:
    calls: list[str] = []

    def broken(_event: object) -> None:
        raise KeyError("k")

    bus.on("s", broken)
    bus.on("s", lambda _e: calls.append("never"))
    with pytest.raises(ListenerError) as caught:
        bus.serial("s", None)
    assert caught.value.listener is broken
    assert caught.value.name == "s"
    assert isinstance(caught.value.__cause__, KeyError)
    assert calls == []


def test_serial_with_an_async_listener_defers_the_rest_in_order(bus: Bus, io: IoSide) -> None:
    calls: list[str] = []

    async def middle(_event: object) -> None:
        await asyncio.sleep(0)
        calls.append("async")

    bus.on("s", lambda _e: calls.append("sync-before"))
    bus.on("s", middle)
    bus.on("s", lambda _e: calls.append(f"sync-after in pool={'pool' in _thread()}"))
    result = bus.serial("s", None)
    assert calls == ["sync-before"]
    assert run_deferred(io, result) is None
    assert calls == ["sync-before", "async", "sync-after in pool=True"]


def test_a_deferred_serial_raises_listener_error(bus: Bus, io: IoSide) -> None:
    async def broken(_event: object) -> None:
        raise ValueError("late failure")

    bus.on("s", broken)
    with pytest.raises(ListenerError, match="late failure"):
        run_deferred(io, bus.serial("s", None))


# -- waterfall -------------------------------------------------------------------------


def test_a_waterfall_without_listeners_returns_the_default(bus: Bus) -> None:
    assert bus.waterfall("w", None, lambda: "default") == Ready("default")


def test_a_waterfall_runs_middleware_outermost_first(bus: Bus) -> None:
    calls: list[str] = []

    def outer(event: str, next_: Callable[[], str]) -> str:
        calls.append("outer in")
        value = next_()
        calls.append("outer out")
        return f"outer({value})"

    def inner(event: str, next_: Callable[[], str]) -> str:
        calls.append("inner")
        return f"inner({next_()},{event})"

    bus.on("w", outer)
    bus.on("w", inner)
    assert bus.waterfall("w", "ev", lambda: "default") == Ready("outer(inner(default,ev))")
    assert calls == ["outer in", "inner", "outer out"]


def test_a_last_listener_is_innermost_whatever_the_registration_order(bus: Bus) -> None:
    def named(name: str) -> Callable[[str, Callable[[], str]], str]:
        return lambda _event, next_: f"{name}({next_()})"

    bus.on("w", named("default-policy"), last=True)  # registered first, as a runtime does
    bus.on("w", named("late"), last=True)  # two last ones keep their order
    bus.on("w", named("global"))
    bus.on("w", named("mine"), scope="a")
    bus.on("w", named("global2"))
    assert bus.waterfall("w", "ev", lambda: "d") == Ready(
        "global(global2(default-policy(late(d))))"
    )
    assert bus.waterfall("w", "ev", lambda: "d", scope="a") == Ready(
        "global(mine(global2(default-policy(late(d)))))"
    )
    scoped_last = bus.on("w", named("mine-last"), scope="a", last=True)
    assert bus.waterfall("w", "ev", lambda: "d", scope="a") == Ready(
        "global(mine(global2(default-policy(late(mine-last(d))))))"
    )
    scoped_last()
    assert bus.waterfall("w", "ev", lambda: "d", scope="a") == Ready(
        "global(mine(global2(default-policy(late(d)))))"
    )
    calls: list[str] = []
    bus.on("e", lambda _e: calls.append("last"), last=True)
    bus.on("e", lambda _e: calls.append("first"))
    bus.emit("e", None)
    assert calls == ["first", "last"]


def test_a_listener_that_does_not_call_next_short_circuits_the_rest(bus: Bus) -> None:
    defaults: list[str] = []
    bus.on("w", lambda _e, _next: "blocked")
    bus.on("w", lambda _e, _next: pytest.fail("must not run"))

    def default() -> str:
        defaults.append("d")
        return "default"

    result = bus.waterfall("w", None, default)
    assert result == Ready("blocked")
    assert defaults == []


def test_the_waterfall_returns_what_the_outermost_listener_returned_even_none(bus: Bus) -> None:
    bus.on("w", lambda _e, next_: None if next_() else "unreachable")
    result = bus.waterfall("w", None, lambda: "default")
    assert isinstance(result, Ready)
    assert result.value is None


def test_a_failing_waterfall_listener_raises_listener_error_once(bus: Bus) -> None:
    def broken(_event: object, _next: Callable[[], object]) -> object:
        raise ValueError("inner bug")

    bus.on("w", lambda _e, next_: next_())
    bus.on("w", broken)
    with pytest.raises(ListenerError) as caught:
        bus.waterfall("w", None, lambda: None)
    assert caught.value.listener is broken
    assert isinstance(caught.value.__cause__, ValueError)


def test_a_mixed_waterfall_keeps_middleware_semantics_off_the_caller_thread(
    bus: Bus, io: IoSide
) -> None:
    trace: list[str] = []

    def sync_outer(event: str, next_: Callable[[], str]) -> str:
        trace.append(f"sync outer on pool={'pool' in _thread()}")
        return f"sync({next_()})"

    async def async_middle(event: str, next_: Callable[[], Awaitable[str]]) -> str:
        trace.append(f"async middle on {_thread()}")
        return f"async({await next_()})"

    def sync_inner(event: str, next_: Callable[[], str]) -> str:
        trace.append(f"sync inner on pool={'pool' in _thread()}")
        return f"inner({next_()},{event})"

    bus.on("w", sync_outer)
    bus.on("w", async_middle)
    bus.on("w", sync_inner)
    result = bus.waterfall("w", "ev", lambda: "default")
    assert trace == []
    assert run_deferred(io, result) == "sync(async(inner(default,ev)))"
    assert trace == [
        "sync outer on pool=True",
        "async middle on bus-io-loop",
        "sync inner on pool=True",
    ]


def test_a_mixed_waterfall_can_short_circuit_and_fail(bus: Bus, io: IoSide) -> None:
    async def gate(event: str, next_: Callable[[], Awaitable[str]]) -> str:
        return "denied" if event == "deny" else await next_()

    def broken(_event: str, _next: Callable[[], str]) -> str:
        raise RuntimeError("deep failure")

    bus.on("w", gate)
    bus.on("w", broken)
    assert run_deferred(io, bus.waterfall("w", "deny", lambda: "default")) == "denied"
    with pytest.raises(ListenerError) as caught:
        run_deferred(io, bus.waterfall("w", "allow", lambda: "default"))
    assert caught.value.listener is broken


@pytest.mark.parametrize(
    "chain",
    ["sync, async, sync", "sync, sync, async, sync", "async, sync, async, sync, sync"],
)
def test_mixed_waterfalls_holding_every_pool_thread_do_not_starve_their_inner_listeners(
    bus: Bus, io: IoSide, chain: str
) -> None:
    # Twice as many waterfalls at once as the blocking pool has threads; the first sync
    # listener of every chain waits until a whole pool's worth of them hold a thread
    # each, so the sync listeners inside can only run if they need no other pool thread.
    workers = io.blocking_workers
    all_holding = threading.Barrier(workers, timeout=WAIT)
    kinds = chain.split(", ")
    first_sync = kinds.index("sync")
    threads: dict[tuple[int, int], str] = {}  # (run, listener index) -> thread name

    def sync_listener(index: int) -> Callable[[int, Callable[[], str]], str]:
        def listener(event: int, next_: Callable[[], str]) -> str:
            if index == first_sync:
                all_holding.wait()
            threads[event, index] = _thread()
            return f"s{index}({next_()})"

        return listener

    def async_listener(index: int) -> Callable[[int, Callable[[], Awaitable[str]]], Any]:
        async def listener(event: int, next_: Callable[[], Awaitable[str]]) -> str:
            return f"a{index}({await next_()})"

        return listener

    for index, kind in enumerate(kinds):
        bus.on("w", sync_listener(index) if kind == "sync" else async_listener(index))

    def deferred(run: int) -> Callable[[], Awaitable[str]]:
        result = bus.waterfall("w", run, partial(str, run))
        assert isinstance(result, Deferred)
        return result.run

    runs = 2 * workers
    handles = [io.start(deferred(run), on_done=lambda _o: None) for run in range(runs)]
    for run, handle in enumerate(handles):
        outcome = handle.wait(WAIT)
        assert outcome.error is None
        expected = str(run)
        for index in reversed(range(len(kinds))):
            expected = f"{kinds[index][0]}{index}({expected})"
        assert outcome.value == expected
    # One chain holds at most one pool thread: its sync listeners all ran on the thread
    # of its first one.
    for run in range(runs):
        ran_on = {threads[run, i] for i, kind in enumerate(kinds) if kind == "sync"}
        assert len(ran_on) == 1
        assert "pool" in ran_on.pop()


@pytest.mark.parametrize("outer", ["async", "sync"])
def test_a_sync_listener_raising_stop_iteration_in_a_mixed_waterfall_is_a_listener_error(
    bus: Bus, io: IoSide, outer: str
) -> None:
    # asyncio futures refuse StopIteration: handed to one from the pool, it was lost and
    # the waterfall never finished.
    def stops(_event: object, _next: Callable[[], object]) -> object:
        raise StopIteration

    async def passing(_event: object, next_: Callable[[], Awaitable[object]]) -> object:
        return await next_()

    if outer == "async":
        bus.on("w", passing)
    bus.on("w", stops)
    if outer == "sync":
        bus.on("w", passing)
    with pytest.raises(ListenerError) as caught:
        run_deferred(io, bus.waterfall("w", None, lambda: "default"))
    assert caught.value.listener is stops
    assert isinstance(caught.value.cause, StopIteration)


def test_a_sync_listener_raising_stop_iteration_after_an_async_one_in_serial_is_a_listener_error(
    bus: Bus, io: IoSide
) -> None:
    # The serial chain's rest ran it in the pool and awaited the future, which asyncio
    # refuses to complete with StopIteration: the chain never finished.
    def stops(_event: object) -> None:
        raise StopIteration

    async def first(_event: object) -> None:
        return None

    bus.on("s", first)
    bus.on("s", stops)
    with pytest.raises(ListenerError) as caught:
        run_deferred(io, bus.serial("s", None))
    assert caught.value.listener is stops
    assert isinstance(caught.value.cause, StopIteration)


def test_scoped_waterfall_listeners_wrap_only_their_agent(bus: Bus) -> None:
    bus.on("w", lambda _e, next_: f"g({next_()})")
    bus.on("w", lambda _e, next_: f"a({next_()})", scope="a")
    assert bus.waterfall("w", None, lambda: "d", scope="a") == Ready("g(a(d))")
    assert bus.waterfall("w", None, lambda: "d", scope="b") == Ready("g(d)")


def test_an_async_callable_object_counts_as_an_async_listener(bus: Bus, io: IoSide) -> None:
    class Middleware:
        async def __call__(self, event: str, next_: Callable[[], Awaitable[str]]) -> str:
            return f"obj({await next_()})"

    bus.on("w", Middleware())
    assert run_deferred(io, bus.waterfall("w", None, lambda: "d")) == "obj(d)"


def _thread() -> str:
    return threading.current_thread().name
