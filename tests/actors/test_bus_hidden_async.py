"""The bus: async listeners it cannot see as async up front (a partial, a sync decorator,
a lambda returning a coroutine) are awaited all the same."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from functools import partial, wraps
from typing import Any

import pytest

from actors import Bus, Deferred, IoSide, ListenerError, Ready

from .bus_support import WAIT, Abort, T, eventually, on_worker, run_deferred

# -- async listeners the bus does not see as async up front ---------------------------


class _AsyncCallable:
    def __init__(self, calls: list[object]) -> None:
        self.calls = calls

    async def __call__(self, tag: str, event: object, *next_: Any) -> object:
        await asyncio.sleep(0)
        self.calls.append(f"{tag}:{event}")
        return f"{tag}({await next_[0]()})" if next_ else None


def _logged(fn: Callable[..., T]) -> Callable[..., T]:
    """An ordinary (sync) decorator, as an application writes one, around an async def."""

    @wraps(fn)
    def wrapper(*args: Any) -> T:
        return fn(*args)

    return wrapper


def _hidden_async(kind: str, calls: list[object]) -> Callable[..., object]:
    """An async listener in a form that does not look async: the three the bus missed."""
    body = _AsyncCallable(calls)
    if kind == "partial of an async callable object":
        return partial(body, "p")
    if kind == "sync decorator around an async def":

        @_logged
        async def decorated(event: object, *next_: Any) -> object:
            return await body("d", event, *next_)

        return decorated
    return lambda event, *next_: body("l", event, *next_)


TAG = {
    "partial of an async callable object": "p",
    "sync decorator around an async def": "d",
    "lambda returning a coroutine": "l",
}
HIDDEN = list(TAG)


@pytest.mark.parametrize("kind", HIDDEN)
def test_emit_awaits_an_async_listener_it_cannot_recognise_as_async(
    bus: Bus, io: IoSide, kind: str
) -> None:
    # It was called as sync: the coroutine it returned was never awaited, its body never
    # ran, and nothing but a RuntimeWarning said so.
    calls: list[object] = []
    ran = threading.Event()
    bus.on("e", _hidden_async(kind, calls))
    bus.on("e", lambda _e: io.loop.call_soon_threadsafe(io.loop.call_soon, ran.set))
    on_worker(lambda: bus.emit("e", "x"))
    assert ran.wait(WAIT)
    assert eventually(lambda: len(calls) == 1)


def test_emit_logs_the_failure_of_the_coroutine_a_sync_looking_listener_returned(
    bus: Bus, io: IoSide, caplog: pytest.LogCaptureFixture
) -> None:
    async def fails(_event: object) -> None:
        raise RuntimeError("in the coroutine")

    bus.on("e", lambda e: fails(e))  # noqa: PLW0108 - async, seen only by its result
    with caplog.at_level(logging.ERROR, logger="corral.bus"):
        on_worker(lambda: bus.emit("e", "x"))
        assert eventually(lambda: any("<lambda>" in r.getMessage() for r in caplog.records))


@pytest.mark.parametrize("kind", HIDDEN)
def test_serial_waits_for_an_async_listener_it_cannot_recognise_as_async(
    bus: Bus, io: IoSide, kind: str
) -> None:
    calls: list[object] = []
    bus.on("s", lambda e: calls.append(f"before:{e}"))
    bus.on("s", _hidden_async(kind, calls))
    bus.on("s", lambda e: calls.append(f"after:{e}"))
    result = on_worker(lambda: bus.serial("s", "x"))
    assert isinstance(result, Deferred)  # the turn waits for it as for any async listener
    run_deferred(io, result)
    assert [str(c).split(":")[0] for c in calls] == ["before", TAG[kind], "after"]


@pytest.mark.parametrize("kind", HIDDEN)
def test_a_serial_chain_run_on_the_loop_waits_for_an_async_listener_it_cannot_recognise(
    bus: Bus, io: IoSide, kind: str
) -> None:
    calls: list[object] = []

    async def first(e: object) -> None:
        calls.append(f"first:{e}")

    bus.on("s", first)
    bus.on("s", _hidden_async(kind, calls))
    bus.on("s", lambda e: calls.append(f"after:{e}"))
    run_deferred(io, bus.serial("s", "x"))
    assert [str(c).split(":")[0] for c in calls] == ["first", TAG[kind], "after"]


def test_a_serial_failure_of_the_coroutine_a_sync_looking_listener_returned_is_a_listener_error(
    bus: Bus, io: IoSide
) -> None:
    async def fails(_event: object) -> None:
        raise Abort("in the coroutine")

    bus.on("s", lambda e: fails(e))  # noqa: PLW0108 - async, seen only by its result
    with pytest.raises(ListenerError) as failed:
        run_deferred(io, on_worker(lambda: bus.serial("s", "x")))
    assert isinstance(failed.value.cause, Abort)


@pytest.mark.parametrize("kind", HIDDEN)
@pytest.mark.parametrize("chain", ["alone", "inside a sync one", "inside an async one"])
def test_waterfall_awaits_an_async_middleware_it_cannot_recognise_as_async(
    bus: Bus, io: IoSide, kind: str, chain: str
) -> None:
    # The outermost one's coroutine was the waterfall's result; one inside a sync
    # middleware handed its coroutine to that middleware's next().
    calls: list[object] = []

    async def outer_async(e: object, next_: Callable[[], Awaitable[object]]) -> object:
        return f"a({await next_()})"

    if chain == "inside a sync one":
        bus.on("w", lambda e, next_: f"s({next_()})")
    elif chain == "inside an async one":
        bus.on("w", outer_async)
    bus.on("w", _hidden_async(kind, calls))
    bus.on("w", lambda e, next_: f"inner({next_()})")  # a sync one inside it
    result = on_worker(lambda: bus.waterfall("w", "x", lambda: "d"))
    tag = TAG[kind]
    wrap = {"alone": "{}", "inside a sync one": "s({})", "inside an async one": "a({})"}[chain]
    # Inside a sync middleware run inline, its next() waits for the coroutine: Ready.
    value = result.value if isinstance(result, Ready) else run_deferred(io, result)
    assert value == wrap.format(f"{tag}(inner(d))")
    assert calls == [f"{tag}:x"]
