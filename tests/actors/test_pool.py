"""The blocking pool: an Executor that counts what it holds, starts a thread only when
none is idle, and lends one more for each callable its caller gave up on."""

from __future__ import annotations

import contextvars
import gc
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import CancelledError

import pytest

from actors._dispatcher import in_runtime_thread, work_for, working_for
from actors._pool import BlockingPool

WAIT = 5.0


@pytest.fixture
def pool() -> Iterator[BlockingPool]:
    made = BlockingPool(2, "test-pool")
    yield made
    made.shutdown(wait=True, cancel_futures=True)


def test_a_submitted_callable_runs_on_a_pool_thread_and_its_future_holds_the_result(
    pool: BlockingPool,
) -> None:
    future = pool.submit(
        lambda a, b=0: (threading.current_thread().name, in_runtime_thread(), a + b), 2, b=3
    )
    name, marked, total = future.result(WAIT)
    assert name.startswith("test-pool_")
    assert marked  # the pool's threads are the runtime's
    assert total == 5


def test_a_failing_callable_fails_its_future_and_the_thread_goes_on(pool: BlockingPool) -> None:
    def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        pool.submit(fail).result(WAIT)
    assert pool.submit(lambda: 7).result(WAIT) == 7


def test_call_runs_in_a_copy_of_the_callers_context(pool: BlockingPool) -> None:
    seen: list[object] = []
    done = threading.Event()
    owner = object()
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller")

    def body() -> None:
        seen.extend([working_for(), var.get()])
        var.set("changed in the pool")
        done.set()

    work_for(owner, pool.call, body)
    assert done.wait(WAIT)
    assert seen == [owner, "caller"]
    assert var.get() == "caller"  # a copy: the pool's change stays there


def test_a_second_thread_starts_only_while_none_is_idle_and_never_past_the_bound(
    pool: BlockingPool,
) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)
    names: set[str] = set()

    def hold() -> None:
        names.add(threading.current_thread().name)
        started.release()
        release.wait(WAIT)

    futures = [pool.submit(hold) for _ in range(3)]
    assert started.acquire(timeout=WAIT)
    assert started.acquire(timeout=WAIT)
    assert not started.acquire(timeout=0.05)  # the third waits: two threads at most
    release.set()
    for future in futures:
        future.result(WAIT)
    assert len(names) == 2
    # Both idle now: a new callable takes one of them, no third thread starts.
    assert pool.submit(lambda: threading.current_thread().name).result(WAIT) in names


def test_wait_idle_waits_for_what_is_held_and_says_how_many_are_left(pool: BlockingPool) -> None:
    release = threading.Event()
    future = pool.submit(release.wait, WAIT)
    assert pool.wait_idle(0.05) == 1
    release.set()
    assert pool.wait_idle(WAIT) == 0
    assert future.result(WAIT) is True


def test_shutdown_runs_what_was_queued_then_refuses_new_callables() -> None:
    made = BlockingPool(1, "test-pool")
    release = threading.Event()
    first = made.submit(release.wait, WAIT)
    second = made.submit(lambda: "queued")
    made.shutdown(wait=False)
    with pytest.raises(RuntimeError):
        made.submit(lambda: None)
    with pytest.raises(RuntimeError):
        made.call(lambda: None)
    release.set()
    assert first.result(WAIT) is True
    assert second.result(WAIT) == "queued"
    made.shutdown(wait=True)
    assert made.wait_idle(0) == 0


def test_shutdown_with_cancel_futures_cancels_what_has_not_started() -> None:
    made = BlockingPool(1, "test-pool")
    release = threading.Event()
    running = threading.Event()

    def hold() -> None:
        running.set()
        release.wait(WAIT)

    first = made.submit(hold)
    assert running.wait(WAIT)
    queued = made.submit(lambda: "never")
    made.shutdown(wait=False, cancel_futures=True)
    with pytest.raises(CancelledError):
        queued.result(WAIT)
    release.set()
    made.shutdown(wait=True)
    assert first.result(WAIT) is None
    assert made.wait_idle(0) == 0


def test_an_abandoned_lease_lets_one_more_thread_start_until_it_ends(pool: BlockingPool) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def hold() -> None:
        started.release()
        release.wait(WAIT)

    held = [pool.submit(hold) for _ in range(2)]
    assert started.acquire(timeout=WAIT)
    assert started.acquire(timeout=WAIT)
    lease = pool.lease()
    lease.abandon()
    assert pool.abandoned == 1
    assert pool.submit(lambda: "ran beside the held two").result(WAIT) == "ran beside the held two"
    lease.end()
    assert pool.abandoned == 0
    release.set()
    for future in held:
        future.result(WAIT)


def test_an_idle_worker_holds_nothing_it_ran(pool: BlockingPool) -> None:
    class Payload:
        pass

    payload = Payload()
    gone = weakref.ref(payload)
    assert pool.submit(lambda p: p is not None, payload).result(WAIT)
    del payload
    assert pool.wait_idle(WAIT) == 0
    gc.collect()
    assert gone() is None
