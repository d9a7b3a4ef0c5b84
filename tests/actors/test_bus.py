"""The bus (CONTRACT section 8): emit, serial and waterfall over sync and async listeners."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator
from functools import partial, wraps
from typing import Any, TypeVar

import pytest

from actors import Bus, Deferred, IoSide, ListenerError, Ready

WAIT = 5.0
T = TypeVar("T")


@pytest.fixture
def io() -> Iterator[IoSide]:
    side = IoSide(blocking_workers=4, name="bus-io")
    yield side
    side.close()


@pytest.fixture
def bus(io: IoSide) -> Bus:
    return Bus(io)


def run_deferred(io: IoSide, result: Ready[T] | Deferred[T]) -> T:
    """What an actor does with a Deferred: run it on the I/O side, wait for the outcome."""
    assert isinstance(result, Deferred)
    outcome = io.start(result.run, on_done=lambda _o: None).wait(WAIT)
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[return-value]


# -- emit ------------------------------------------------------------------------------


def test_emit_calls_every_listener_in_registration_order(bus: Bus) -> None:
    calls: list[tuple[str, Any]] = []
    bus.on("agent/status", lambda e: calls.append(("first", e)))
    bus.on("agent/status", lambda e: calls.append(("second", e)))
    bus.on("agent/other", lambda e: calls.append(("other", e)))
    bus.emit("agent/status", "running")
    assert calls == [("first", "running"), ("second", "running")]


def test_a_failing_listener_is_logged_and_cannot_stop_the_others(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def broken(_event: object) -> None:
        raise RuntimeError("listener bug")

    bus.on("e", broken)
    bus.on("e", lambda _e: calls.append("after"))
    with caplog.at_level(logging.ERROR, logger="corral.bus"):
        bus.emit("e", 1)
    assert calls == ["after"]
    assert any(r.name == "corral.bus" and "broken" in r.getMessage() for r in caplog.records)


def test_scoped_listeners_see_only_their_agent_and_global_ones_see_all(bus: Bus) -> None:
    calls: list[str] = []
    bus.on("e", lambda e: calls.append(f"global:{e}"))
    bus.on("e", lambda e: calls.append(f"a:{e}"), scope="a")
    bus.on("e", lambda e: calls.append(f"b:{e}"), scope="b")
    bus.on("e", lambda e: calls.append(f"global2:{e}"))
    bus.emit("e", 1, scope="a")
    bus.emit("e", 2, scope="b")
    bus.emit("e", 3)
    bus.emit("e", 4, scope="nobody")
    assert calls == [
        "global:1", "a:1", "global2:1",
        "global:2", "b:2", "global2:2",
        "global:3", "global2:3",
        "global:4", "global2:4",
    ]  # fmt: skip


def test_a_disposer_unregisters_once_and_is_idempotent(bus: Bus) -> None:
    calls: list[str] = []
    dispose = bus.on("e", lambda _e: calls.append("x"), scope="a")
    keep = bus.on("e", lambda _e: calls.append("y"))
    dispose()
    dispose()
    bus.emit("e", None, scope="a")
    keep()
    keep()
    bus.emit("e", None, scope="a")
    assert calls == ["y"]
    assert not bus.has_listeners("e")
    assert bus.listener_count("e", scope="a") == 0


def test_an_async_listener_runs_on_the_loop_and_its_failure_is_logged(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    seen: queue.Queue[str] = queue.Queue()
    failed = threading.Event()

    async def on_loop(event: str) -> None:
        await asyncio.sleep(0)
        seen.put(f"{event} on {threading.current_thread().name}")

    async def broken(_event: str) -> None:
        failed.set()
        raise RuntimeError("async listener bug")

    bus.on("e", on_loop)
    bus.on("e", broken)
    with caplog.at_level(logging.ERROR, logger="corral.bus"):
        bus.emit("e", "hello")
        assert seen.get(timeout=WAIT) == "hello on bus-io-loop"
        assert failed.wait(WAIT)
        bus._io.close()  # drain: the failure has been reported once close returns
    assert any("async listener" in r.getMessage() for r in caplog.records)


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


class _Abort(BaseException):
    """A BaseException of the application's own (what some libraries raise to unwind)."""


BASE_EXCEPTIONS = [_Abort, KeyboardInterrupt, asyncio.CancelledError, GeneratorExit]


def _on_worker(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread other than the main one, as the bus's callers run (an actor's
    dispatcher thread): its result, or what it raised."""
    box: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

    def run() -> None:
        try:
            box.put((True, fn()))
        except BaseException as err:
            box.put((False, err))

    threading.Thread(target=run, name="worker").start()
    ok, value = box.get(timeout=WAIT)
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


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
        _on_worker(lambda: bus.emit("emitted", "still called"))
    assert after == ["still called"]
    assert any("raises" in r.getMessage() for r in caplog.records)
    bus.on("serial", raises)
    with pytest.raises(ListenerError) as serial:
        _on_worker(lambda: bus.serial("serial", "x"))
    assert isinstance(serial.value.cause, error)
    bus.on("waterfall", raises)
    with pytest.raises(ListenerError) as waterfall:
        _on_worker(lambda: bus.waterfall("waterfall", "x", lambda: "default"))
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
                assert _eventually(
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


def cast_run(result: Ready[T] | Deferred[T]) -> Callable[[], Awaitable[T]]:
    assert isinstance(result, Deferred)
    return result.run


def _eventually(check: Callable[[], bool]) -> bool:
    """``check()`` once the loop has run what it had queued (a log written in a task)."""
    for _ in range(100):
        if check():
            return True
        threading.Event().wait(0.01)
    return check()


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
    _on_worker(lambda: bus.emit("e", "x"))
    assert ran.wait(WAIT)
    assert _eventually(lambda: len(calls) == 1)


def test_emit_logs_the_failure_of_the_coroutine_a_sync_looking_listener_returned(
    bus: Bus, io: IoSide, caplog: pytest.LogCaptureFixture
) -> None:
    async def fails(_event: object) -> None:
        raise RuntimeError("in the coroutine")

    bus.on("e", lambda e: fails(e))  # noqa: PLW0108 - async, seen only by its result
    with caplog.at_level(logging.ERROR, logger="corral.bus"):
        _on_worker(lambda: bus.emit("e", "x"))
        assert _eventually(lambda: any("<lambda>" in r.getMessage() for r in caplog.records))


@pytest.mark.parametrize("kind", HIDDEN)
def test_serial_waits_for_an_async_listener_it_cannot_recognise_as_async(
    bus: Bus, io: IoSide, kind: str
) -> None:
    calls: list[object] = []
    bus.on("s", lambda e: calls.append(f"before:{e}"))
    bus.on("s", _hidden_async(kind, calls))
    bus.on("s", lambda e: calls.append(f"after:{e}"))
    result = _on_worker(lambda: bus.serial("s", "x"))
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
        raise _Abort("in the coroutine")

    bus.on("s", lambda e: fails(e))  # noqa: PLW0108 - async, seen only by its result
    with pytest.raises(ListenerError) as failed:
        run_deferred(io, _on_worker(lambda: bus.serial("s", "x")))
    assert isinstance(failed.value.cause, _Abort)


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
    result = _on_worker(lambda: bus.waterfall("w", "x", lambda: "d"))
    tag = TAG[kind]
    wrap = {"alone": "{}", "inside a sync one": "s({})", "inside an async one": "a({})"}[chain]
    # Inside a sync middleware run inline, its next() waits for the coroutine: Ready.
    value = result.value if isinstance(result, Ready) else run_deferred(io, result)
    assert value == wrap.format(f"{tag}(inner(d))")
    assert calls == [f"{tag}:x"]
