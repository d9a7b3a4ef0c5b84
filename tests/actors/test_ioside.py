"""The I/O side: effects on the loop and in the blocking pool report exactly once."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pykka import ActorRegistry

from actors import (
    EffectCompleted,
    IoSide,
    IoSideClosedError,
    Outcome,
    PooledActor,
    blocking,
)

WAIT = 5.0


@pytest.fixture
def io() -> Iterator[IoSide]:
    side = IoSide(blocking_workers=2, name="test-io")
    yield side
    side.close()


class Outcomes:
    """Collects on_done calls; ``next()`` waits for one."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Outcome[Any]] = queue.Queue()
        self.threads: list[str] = []

    def __call__(self, outcome: Outcome[Any]) -> None:
        self.threads.append(threading.current_thread().name)
        self.queue.put(outcome)

    def next(self) -> Outcome[Any]:
        return self.queue.get(timeout=WAIT)

    def nothing_more(self) -> bool:
        return self.queue.empty()


def test_a_coroutine_effect_runs_on_the_loop_and_reports_its_value_once(io: IoSide) -> None:
    done = Outcomes()

    async def work() -> str:
        await asyncio.sleep(0)
        return threading.current_thread().name

    handle = io.start(work, on_done=done)
    outcome = done.next()
    assert outcome == Outcome(handle.effect_id, value="test-io-loop")
    assert handle.wait(WAIT) is outcome
    assert handle.done()
    assert done.nothing_more()


def test_a_failing_coroutine_effect_reports_its_error(io: IoSide) -> None:
    done = Outcomes()

    async def work() -> None:
        raise ValueError("nope")

    io.start(work, on_done=done)
    outcome = done.next()
    assert isinstance(outcome.error, ValueError)
    assert not outcome.cancelled


def test_cancelling_a_coroutine_effect_raises_cancelled_error_inside_it(io: IoSide) -> None:
    done = Outcomes()
    entered, saw_cancel = threading.Event(), threading.Event()

    async def work() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            saw_cancel.set()
            raise

    handle = io.start(work, on_done=done)
    assert entered.wait(WAIT)
    handle.cancel()
    handle.cancel()
    outcome = done.next()
    assert outcome.cancelled
    assert saw_cancel.is_set()
    assert done.nothing_more()


def test_cancelling_a_finished_effect_keeps_its_value(io: IoSide) -> None:
    done = Outcomes()

    async def work() -> int:
        return 7

    handle = io.start(work, on_done=done)
    assert done.next().value == 7
    handle.cancel()
    assert handle.outcome is not None
    assert handle.outcome.value == 7
    assert not handle.outcome.cancelled


def test_a_blocking_effect_runs_in_the_pool(io: IoSide) -> None:
    done = Outcomes()
    handle = io.start_blocking(lambda: threading.current_thread().name, on_done=done)
    outcome = done.next()
    assert str(outcome.value).startswith("test-io-pool")
    assert handle.is_blocking


def test_a_blocking_effect_cancelled_before_it_starts_never_runs(io: IoSide) -> None:
    gate = threading.Event()
    ran: list[str] = []
    done = Outcomes()
    occupying = [io.start_blocking(lambda: gate.wait(WAIT), on_done=done) for _ in range(2)]
    queued = io.start(blocking(lambda: ran.append("ran")), on_done=done)
    queued.cancel()
    gate.set()
    outcomes = {done.next().effect_id: None for _ in range(3)}
    assert set(outcomes) == {h.effect_id for h in [*occupying, queued]}
    assert queued.outcome is not None
    assert queued.outcome.cancelled
    assert ran == []


def test_a_started_blocking_effect_reports_cancelled_when_its_body_returns(io: IoSide) -> None:
    entered, gate = threading.Event(), threading.Event()
    done = Outcomes()

    def body() -> str:
        entered.set()
        gate.wait(WAIT)
        return "finished anyway"

    handle = io.start_blocking(body, on_done=done)
    assert entered.wait(WAIT)
    handle.cancel()
    gate.set()
    outcome = done.next()
    assert outcome.cancelled
    assert outcome.value == "finished anyway"


class Inbox(PooledActor):
    def __init__(self, received: queue.Queue[Any]) -> None:
        super().__init__()
        self.received = received

    def on_receive(self, message: Any) -> None:
        self.received.put(message)


def test_start_for_delivers_the_completion_to_the_actor_as_a_message(io: IoSide) -> None:
    received: queue.Queue[Any] = queue.Queue()
    ref = Inbox.start(received)
    try:

        async def work() -> str:
            return "model reply"

        handle = io.start_for(ref, work, tag="model")
        message = received.get(timeout=WAIT)
        assert message == EffectCompleted(handle.effect_id, "model", "model reply", None, False)
        io.start_for(ref, blocking(lambda: 1 / 0), tag="tool")
        failed = received.get(timeout=WAIT)
        assert failed.tag == "tool"
        assert isinstance(failed.error, ZeroDivisionError)
    finally:
        ref.stop(timeout=WAIT)


def test_a_completion_for_a_stopped_actor_is_a_dead_letter(io: IoSide) -> None:
    received: queue.Queue[Any] = queue.Queue()
    ref = Inbox.start(received)
    ref.stop(timeout=WAIT)
    handle = io.start_for(ref, blocking(lambda: "late"), tag="late")
    handle.wait(WAIT)
    assert io.dead_letters.count == 1
    letter = io.dead_letters.recent()[0]
    assert isinstance(letter.message, EffectCompleted)
    assert letter.message.value == "late"
    assert ActorRegistry.get_by_urn(ref.actor_urn) is None


def test_close_cancels_effects_in_flight_and_refuses_new_ones() -> None:
    side = IoSide(blocking_workers=1, name="closing-io")
    done = Outcomes()
    entered = threading.Event()

    async def forever() -> None:
        entered.set()
        await asyncio.Event().wait()

    side.start(forever, on_done=done)
    assert entered.wait(WAIT)
    side.close()
    assert done.next().cancelled
    with pytest.raises(IoSideClosedError, match="the I/O side is closed"):
        side.start(forever, on_done=done)
    assert side.statistics().closed
    assert side.statistics().in_flight == 0


def test_close_lets_listener_work_finish_within_its_timeout_while_it_cancels_other_effects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    side = IoSide(blocking_workers=1, name="closing-io")
    done = Outcomes()
    streaming, listening = threading.Event(), threading.Event()
    cancelled = asyncio.Event()  # touched on the loop only

    async def stream() -> None:  # a model stream, say: cancelled at once
        try:
            streaming.set()
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    async def listener() -> str:  # an async listener: goes on until it is done
        listening.set()
        await cancelled.wait()
        await asyncio.sleep(0)
        return "finished"

    other = side.start(stream, on_done=done)
    mine = side.start(listener, on_done=done, listener=True)
    assert streaming.wait(WAIT) and listening.wait(WAIT)
    with caplog.at_level(logging.WARNING, logger="corral.io"):
        side.close(timeout=WAIT)
    assert other.wait(0).cancelled
    assert mine.wait(0).value == "finished"  # close used to cancel it as well
    assert "listener" not in caplog.text


def test_close_cancels_listener_work_still_running_at_its_timeout_and_says_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    side = IoSide(blocking_workers=1, name="closing-io")
    done = Outcomes()
    entered = threading.Semaphore(0)

    async def forever() -> None:
        entered.release()
        await asyncio.Event().wait()

    handles = [side.start(forever, on_done=done, listener=True) for _ in range(2)]
    for _ in handles:
        assert entered.acquire(timeout=WAIT)
    with caplog.at_level(logging.WARNING, logger="corral.io"):
        side.close(timeout=0.05)
    assert all(handle.wait(WAIT).cancelled for handle in handles)
    assert "2 async listener calls not finished after 0.05 s" in caplog.text


def test_close_waits_for_blocking_bodies_that_finish_within_its_timeout() -> None:
    side = IoSide(blocking_workers=1, name="closing-io")
    done = Outcomes()
    entered, waiting, release = threading.Event(), threading.Event(), threading.Event()

    def body() -> str:
        entered.set()
        assert release.wait(WAIT)
        return "finished"

    async def release_when_cancelled() -> None:
        try:
            waiting.set()
            await asyncio.Event().wait()
        finally:
            release.set()  # only close cancels this: the body ends while close runs

    side.start_blocking(body, on_done=done)
    side.start(release_when_cancelled, on_done=done)
    assert entered.wait(WAIT) and waiting.wait(WAIT)
    side.close(timeout=WAIT)
    assert done.queue.qsize() == 2  # both reported before close returned
    assert sorted(str(done.next().value) for _ in range(2)) == ["None", "finished"]


def test_close_gives_up_on_blocking_bodies_still_running_at_its_timeout_and_says_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    side = IoSide(blocking_workers=3, name="closing-io")
    done = Outcomes()
    entered = threading.Barrier(3, timeout=WAIT)
    release = threading.Event()

    def stuck() -> str:
        entered.wait()
        release.wait(WAIT)
        return "late"

    bodies = [side.start_blocking(stuck, on_done=done) for _ in range(2)]
    entered.wait()
    try:
        with caplog.at_level(logging.WARNING, logger="corral.io"):
            side.close(timeout=0.05)
        assert not any(handle.done() for handle in bodies)  # close did not wait for them
        assert "2 blocking calls" in caplog.text
    finally:
        release.set()
    assert [handle.wait(WAIT).value for handle in bodies] == ["late", "late"]


def test_an_on_done_failure_is_contained(io: IoSide) -> None:
    def explode(_outcome: Outcome[Any]) -> None:
        raise RuntimeError("callback bug")

    handle = io.start_blocking(lambda: 1, on_done=explode)
    assert handle.wait(WAIT).value == 1
    follow = Outcomes()
    io.start_blocking(lambda: 2, on_done=follow)
    assert follow.next().value == 2


@pytest.mark.parametrize("where", ["start", "ready"])
def test_an_io_side_interrupted_while_starting_its_loop_stops_it(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # Before, a Ctrl-C in the loop thread's start() (which had started the thread) made
    # __init__ close the running loop: "Cannot close a running event loop" hid the
    # Ctrl-C and the loop's thread ran on; one in the wait for the loop to run was not
    # handled at all.
    import types  # noqa: PLC0415

    from actors import _ioside  # noqa: PLC0415

    if where == "start":
        start = threading.Thread.start

        def start_then_interrupt(thread: threading.Thread) -> None:
            start(thread)
            raise KeyboardInterrupt

        monkeypatch.setattr(threading.Thread, "start", start_then_interrupt)
    else:

        class InterruptedEvent(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                raise KeyboardInterrupt

        # Only the module's own threading.Event (its ready event) is replaced.
        patched = types.ModuleType("threading")
        patched.__dict__.update(threading.__dict__)
        patched.Event = InterruptedEvent  # type: ignore[attr-defined]
        monkeypatch.setattr(_ioside, "threading", patched)
    loops: list[asyncio.AbstractEventLoop] = []
    new_loop = _ioside._new_loop

    def recorded(handoff: Any) -> asyncio.AbstractEventLoop:
        loops.append(new_loop(handoff))
        return loops[-1]

    monkeypatch.setattr(_ioside, "_new_loop", recorded)
    with pytest.raises(KeyboardInterrupt):
        IoSide(blocking_workers=2, name="test-io-interrupted")
    monkeypatch.undo()
    # Nothing this IoSide started runs on (threads of earlier tests may still be ending,
    # or start, under load: only its own are looked at).
    assert [t for t in threading.enumerate() if t.name.startswith("test-io-interrupted")] == []
    assert len(loops) == 1 and loops[0].is_closed()
