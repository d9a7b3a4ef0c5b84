"""The scheduler: delayed callbacks and messages, cancellable, no thread per timer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from actors import MANUAL_EPOCH, ManualClock, PooledActor, Scheduler, SchedulerClosedError

WAIT = 5.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def scheduler(clock: ManualClock) -> Iterator[Scheduler]:
    s = Scheduler(clock)
    yield s
    s.close()


def test_a_timer_fires_only_once_its_delay_has_passed(
    clock: ManualClock, scheduler: Scheduler
) -> None:
    fired: list[str] = []
    scheduler.call_later(2.0, lambda: fired.append("t"))
    clock.advance(1.999)
    assert fired == []
    clock.advance(0.001)
    assert fired == ["t"]
    clock.advance(10)
    assert fired == ["t"]


def test_timers_fire_in_deadline_order_then_in_scheduling_order(
    clock: ManualClock, scheduler: Scheduler
) -> None:
    fired: list[str] = []
    scheduler.call_later(3, lambda: fired.append("c"))
    scheduler.call_later(1, lambda: fired.append("a1"))
    scheduler.call_later(1, lambda: fired.append("a2"))
    scheduler.call_later(2, lambda: fired.append("b"))
    clock.advance(5)
    assert fired == ["a1", "a2", "b", "c"]


def test_a_timer_scheduled_by_a_firing_timer_fires_when_due(
    clock: ManualClock, scheduler: Scheduler
) -> None:
    fired: list[float] = []

    def first() -> None:
        fired.append(clock.monotonic())
        scheduler.call_later(1, lambda: fired.append(clock.monotonic()))

    scheduler.call_later(1, first)
    clock.advance(1)
    clock.advance(1)
    assert fired == [1, 2]


def test_a_cancelled_timer_never_fires(clock: ManualClock, scheduler: Scheduler) -> None:
    fired: list[str] = []
    handle = scheduler.call_later(1, lambda: fired.append("x"))
    assert handle.cancel() is True
    assert handle.cancel() is False
    clock.advance(2)
    assert fired == []
    stats = scheduler.statistics()
    assert (stats.pending, stats.fired, stats.cancelled, stats.threaded) == (0, 0, 1, False)


def test_many_cancelled_timers_are_compacted_away(clock: ManualClock, scheduler: Scheduler) -> None:
    handles = [scheduler.call_later(100 + i, lambda: None) for i in range(200)]
    for handle in handles[:150]:
        handle.cancel()
    assert scheduler.statistics().pending == 50
    fired = []
    scheduler.call_later(1, lambda: fired.append(1))
    clock.advance(1)
    assert fired == [1]


def test_a_failing_callback_is_logged_and_later_timers_still_fire(
    clock: ManualClock, scheduler: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    fired: list[str] = []

    def explode() -> None:
        raise RuntimeError("timer bug")

    scheduler.call_later(1, explode)
    scheduler.call_later(1, lambda: fired.append("after"))
    clock.advance(1)
    assert fired == ["after"]
    assert any("timer callback" in r.message for r in caplog.records)


class Inbox(PooledActor):
    def __init__(self, received: queue.Queue[Any]) -> None:
        super().__init__()
        self.received = received

    def on_receive(self, message: Any) -> None:
        self.received.put(message)


def test_tell_later_delivers_a_message_to_an_actor(
    clock: ManualClock, scheduler: Scheduler
) -> None:
    received: queue.Queue[Any] = queue.Queue()
    ref = Inbox.start(received)
    try:
        scheduler.tell_later(0.5, ref, "wake up")
        assert received.empty()
        clock.advance(0.5)
        assert received.get(timeout=WAIT) == "wake up"
    finally:
        ref.stop(timeout=WAIT)


def test_tell_later_to_a_stopped_actor_is_a_dead_letter(
    clock: ManualClock, scheduler: Scheduler
) -> None:
    ref = Inbox.start(queue.Queue())
    scheduler.tell_later(1, ref, "too late")
    ref.stop(timeout=WAIT)
    clock.advance(1)
    assert scheduler.dead_letters.count == 1
    assert scheduler.dead_letters.recent()[0].message == "too late"


def test_a_closed_scheduler_drops_pending_timers_and_refuses_new_ones(
    clock: ManualClock, scheduler: Scheduler
) -> None:
    fired: list[str] = []
    scheduler.call_later(1, lambda: fired.append("x"))
    scheduler.close()
    clock.advance(1)
    assert fired == []
    with pytest.raises(SchedulerClosedError, match="the scheduler is closed"):
        scheduler.call_later(1, lambda: None)


def test_a_real_clock_scheduler_serves_all_timers_from_one_thread() -> None:
    scheduler = Scheduler(name="real-scheduler")
    try:
        threads_before = threading.active_count()
        done = threading.Event()
        fired: list[str] = []
        names: set[str] = set()

        def tick(i: int) -> None:
            fired.append(str(i))
            names.add(threading.current_thread().name)
            if len(fired) == 50:
                done.set()

        for i in range(50):
            scheduler.call_later(0.001 * (i % 5), partial(tick, i))
        late = scheduler.call_later(3600, lambda: fired.append("never"))
        assert done.wait(WAIT)
        assert threading.active_count() <= threads_before + 1
        assert names == {"real-scheduler"}
        assert scheduler.statistics().threaded
        assert late.cancel()
    finally:
        scheduler.close()


@pytest.mark.parametrize("far", [1e10, float("inf")], ids=["1e10 s", "inf"])
def test_a_timer_too_far_away_for_a_condition_wait_does_not_stop_the_other_timers(
    far: float,
) -> None:
    # A provider's Retry-After of 1e10 s reached the real clock's thread as a wait that
    # threading refuses (OverflowError): the thread died and no timer fired again.
    scheduler = Scheduler()
    try:
        scheduler.call_later(far, lambda: None)
        fired = threading.Event()
        scheduler.call_later(0.001, fired.set)
        assert fired.wait(WAIT)
        again = threading.Event()
        scheduler.call_later(0.001, again.set)
        assert again.wait(WAIT)
    finally:
        scheduler.close()


class LoopThread:
    """An asyncio loop in a thread of its own, as the runtime's I/O side runs one."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(WAIT)
        self.loop.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    running = LoopThread()
    yield running
    running.close()


def test_a_coroutine_sleeps_on_the_manual_clock_until_advance(
    clock: ManualClock, scheduler: Scheduler, loop_thread: LoopThread
) -> None:
    slept = loop_thread.submit(scheduler.sleep(30.0))
    assert scheduler.wait_pending(1, WAIT)
    clock.advance(29.999)
    assert not slept.done()
    clock.advance(0.001)
    assert slept.result(WAIT) is None
    assert scheduler.statistics().threaded is False


def test_wait_for_times_out_at_advance_and_cancels_the_work(
    clock: ManualClock, scheduler: Scheduler, loop_thread: LoopThread
) -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    waited = loop_thread.submit(scheduler.wait_for(forever(), 60.0))
    assert scheduler.wait_pending(1, WAIT)
    clock.advance(59.9)
    assert not waited.done()
    clock.advance(0.1)
    with pytest.raises(TimeoutError):
        waited.result(WAIT)
    assert cancelled.is_set()


def test_wait_for_returns_what_finishes_in_time_and_drops_its_timer(
    clock: ManualClock, scheduler: Scheduler, loop_thread: LoopThread
) -> None:
    async def quick() -> str:
        return "done"

    assert loop_thread.submit(scheduler.wait_for(quick(), 60.0)).result(WAIT) == "done"
    assert scheduler.statistics().pending == 0 and scheduler.statistics().cancelled == 1
    clock.advance(120.0)  # the dropped timer fires nothing on the loop
    assert scheduler.statistics().fired == 0


def test_on_the_system_clock_sleep_and_wait_for_are_asyncios_own(
    loop_thread: LoopThread,
) -> None:
    real = Scheduler()
    try:
        assert loop_thread.submit(real.sleep(0.001)).result(WAIT) is None
        with pytest.raises(TimeoutError):
            loop_thread.submit(real.wait_for(asyncio.Event().wait(), 0.01)).result(WAIT)
        assert real.statistics().pending == 0 and real.statistics().fired == 0  # no timer
    finally:
        real.close()


def test_a_manual_clocks_wall_time_moves_with_it() -> None:
    clock = ManualClock(start=100.0, epoch=1_000.0)
    assert (clock.monotonic(), clock.time()) == (100.0, 1_000.0)
    clock.advance(2.5)
    assert (clock.monotonic(), clock.time()) == (102.5, 1_002.5)
    assert ManualClock().time() == MANUAL_EPOCH
