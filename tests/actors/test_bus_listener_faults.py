"""The bus: a listener that exits, raises any BaseException or is interrupted is its own
failure, contained; corral's own cancels and closes stay what they are."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from actors import Bus, IoSide, ListenerError

from .bus_support import WAIT, Abort, cast_run, eventually, on_worker, run_deferred

# -- a listener that calls sys.exit ----------------------------------------------------


def _exits(_event: object, *_next: object) -> None:
    raise SystemExit(5)


async def _exits_async(_event: object, *_next: object) -> None:
    await asyncio.sleep(0)
    raise SystemExit(5)


def test_a_listener_that_calls_sys_exit_is_a_contained_listener_failure(
    bus: Bus, io: IoSide, caplog: pytest.LogCaptureFixture
) -> None:
    # SystemExit is a BaseException: it went past the bus and ended the actor that ran
    # the listener, and pykka's fatal path then stopped every actor of the process.
    after: list[str] = []
    bus.on("emitted", _exits)
    bus.on("emitted", after.append)
    with caplog.at_level(logging.ERROR, logger="corral.bus"):
        bus.emit("emitted", "still called")
    assert after == ["still called"]
    assert any("failed" in r.getMessage() for r in caplog.records)
    bus.on("serial", _exits)
    with pytest.raises(ListenerError) as serial:
        bus.serial("serial", "x")
    assert isinstance(serial.value.cause, SystemExit)
    bus.on("waterfall", _exits)
    with pytest.raises(ListenerError) as waterfall:
        bus.waterfall("waterfall", "x", lambda: "default")
    assert isinstance(waterfall.value.cause, SystemExit)


@pytest.mark.parametrize("kind", ["serial", "waterfall", "emit"])
def test_an_async_listener_that_calls_sys_exit_leaves_the_io_loop_running(
    bus: Bus, io: IoSide, kind: str
) -> None:
    # Raised inside an asyncio task, SystemExit propagates out of the loop: the I/O
    # side's loop thread died, and with it every model stream and async listener.
    if kind == "emit":
        done = threading.Event()

        async def exits_then_signals(_event: object) -> None:
            try:
                await _exits_async(_event)
            finally:
                io.loop.call_soon(done.set)

        bus.on("e", exits_then_signals)
        bus.emit("e", "x")
        assert done.wait(WAIT)
    else:
        bus.on("e", _exits_async)
        result = bus.serial("e", "x") if kind == "serial" else bus.waterfall("e", "x", lambda: 1)
        with pytest.raises(ListenerError) as failed:
            run_deferred(io, result)
        assert isinstance(failed.value.cause, SystemExit)

    async def still_running() -> str:
        return "yes"

    assert io.start(still_running, on_done=lambda _o: None).wait(WAIT).value == "yes"


# -- a listener that raises a BaseException of another kind ----------------------------


BASE_EXCEPTIONS = [Abort, KeyboardInterrupt, asyncio.CancelledError, GeneratorExit]


@pytest.mark.parametrize("error", BASE_EXCEPTIONS, ids=lambda e: e.__name__)
def test_a_sync_listener_raising_any_base_exception_is_a_contained_listener_failure(
    bus: Bus, error: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    # Only Exception and SystemExit were contained: anything else went past the bus and
    # ended the actor that ran the listener, and pykka's fatal path then stopped every
    # actor of the process (every agent and registry of every runtime).
    def raises(_event: object, *_next: object) -> None:
        raise error("from a listener")

    after: list[str] = []
    bus.on("emitted", raises)
    bus.on("emitted", after.append)
    with caplog.at_level(logging.ERROR, logger="corral.bus"):
        on_worker(lambda: bus.emit("emitted", "still called"))
    assert after == ["still called"]
    assert any("raises" in r.getMessage() for r in caplog.records)
    bus.on("serial", raises)
    with pytest.raises(ListenerError) as serial:
        on_worker(lambda: bus.serial("serial", "x"))
    assert isinstance(serial.value.cause, error)
    bus.on("waterfall", raises)
    with pytest.raises(ListenerError) as waterfall:
        on_worker(lambda: bus.waterfall("waterfall", "x", lambda: "default"))
    assert isinstance(waterfall.value.cause, error)


@pytest.mark.parametrize("error", BASE_EXCEPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("kind", ["serial", "waterfall", "emit"])
def test_an_async_or_pool_listener_raising_any_base_exception_is_its_failure_and_the_loop_runs_on(
    bus: Bus, io: IoSide, kind: str, error: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    # An async listener's KeyboardInterrupt went out of the event loop (the I/O thread
    # died); its CancelledError or own BaseException was taken for the chain's cancel or
    # reached the actor. A sync listener after it runs in the pool: the same for it.
    async def raises_async(_event: object, *_next: object) -> None:
        await asyncio.sleep(0)
        raise error("from an async listener")

    def raises_in_pool(_event: object, *_next: object) -> None:
        raise error("from a sync listener in the pool")

    async def passes(_event: object, *next_: Callable[[], Awaitable[object]]) -> object:
        return (await next_[0]()) if next_ else None

    for listener in (raises_async, raises_in_pool):
        name = f"{kind}/{listener.__name__}"
        if kind == "emit":
            done = threading.Event()

            async def then_signal(_event: object, listener: Any = listener) -> None:
                try:
                    result = listener(_event)
                    if result is not None:
                        await result
                finally:
                    io.loop.call_soon(done.set)

            bus.on(name, then_signal)
            with caplog.at_level(logging.ERROR, logger="corral.bus"):
                bus.emit(name, "x")
                assert done.wait(WAIT)
                assert eventually(
                    lambda: any("then_signal" in r.getMessage() for r in caplog.records)
                )
            continue
        bus.on(name, passes)  # the chain is deferred; the failing listener inside it
        bus.on(name, listener)
        result = bus.serial(name, "x") if kind == "serial" else bus.waterfall(name, "x", lambda: 1)
        outcome = io.start(cast_run(result), on_done=lambda _o: None).wait(WAIT)
        assert not outcome.cancelled
        assert isinstance(outcome.error, ListenerError)
        assert isinstance(outcome.error.cause, error)

    async def still_running() -> str:
        return "yes"

    assert io.start(still_running, on_done=lambda _o: None).wait(WAIT).value == "yes"


def test_a_keyboard_interrupt_while_a_listener_runs_on_the_main_thread_still_interrupts(
    bus: Bus,
) -> None:
    # Python delivers Ctrl-C to the main thread only; a listener runs there only inline,
    # in an emit the application made on it: that is the user's interrupt, not a fault.
    def interrupted(_event: object) -> None:
        raise KeyboardInterrupt

    bus.on("e", interrupted)
    assert threading.current_thread() is threading.main_thread()
    with pytest.raises(KeyboardInterrupt):
        bus.emit("e", "x")


@pytest.mark.parametrize("kind", ["serial", "waterfall"])
def test_cancelling_a_chain_while_its_async_listener_awaits_still_ends_it_cancelled(
    bus: Bus, io: IoSide, kind: str
) -> None:
    # The CancelledError of our own cancel (a cancelled turn, a close) keeps meaning
    # cancellation: only one the listener raised with no cancel requested is its failure.
    entered = threading.Event()

    async def waits(_event: object, *_next: object) -> None:
        entered.set()
        await asyncio.Event().wait()

    bus.on("e", waits)
    result = bus.serial("e", "x") if kind == "serial" else bus.waterfall("e", "x", lambda: 1)
    handle = io.start(cast_run(result), on_done=lambda _o: None)
    assert entered.wait(WAIT)
    handle.cancel()
    outcome = handle.wait(WAIT)
    assert outcome.cancelled and outcome.error is None


def test_closing_the_io_side_while_an_emitted_async_listener_awaits_logs_no_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    side = IoSide(blocking_workers=2, name="bus-close")
    bus = Bus(side)
    entered = threading.Event()

    async def waits(_event: object) -> None:
        entered.set()
        await asyncio.Event().wait()

    bus.on("e", waits)
    bus.on("e", lambda _e: waits(_e))  # noqa: PLW0108 - async, seen only by its result
    with caplog.at_level(logging.ERROR, logger="corral.bus"):
        bus.emit("e", "x")
        assert entered.wait(WAIT)
        side.close()
    assert not [r for r in caplog.records if r.name == "corral.bus"]
