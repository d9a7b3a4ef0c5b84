"""``await session.aflush()`` / ``await store.aflush()``: durability awaited from asyncio
code on a real store, one loop wake-up per batch of flush callbacks, errors, cancelled
waiters and a closed loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import StorageError, Store, StoreClosedError
from storage.aio import _LoopWaker, wait_durable
from storage.events import Completed, MessageTrigger, TurnEnd, TurnStart
from storage.records import FlushCallback
from tests.storage.builders import ticking_clock

WAIT = 30.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "store", clock=ticking_clock()) as opened:
        yield opened


def run(coroutine: object) -> object:
    return asyncio.run(asyncio.wait_for(coroutine, WAIT))  # type: ignore[arg-type]


def test_aflush_returns_once_what_was_appended_before_it_is_written(store: Store) -> None:
    session = store.create_session("a")
    written = store.statistics().events_written

    async def append_and_flush() -> int:
        session.append("turn/start", TurnStart(turn=1, trigger=MessageTrigger()))
        session.append("turn/end", TurnEnd(turn=1, reason=Completed()))
        await session.aflush()
        return store.statistics().events_written

    assert run(append_and_flush()) == written + 2
    assert [event.type for event in store.read("a")] == ["turn/start", "turn/end"]


def test_many_tasks_flushing_after_every_append_all_return_with_their_events_written(
    store: Store,
) -> None:
    tasks, per_task = 32, 20
    sessions = [store.create_session(f"s{index}") for index in range(tasks)]

    async def produce(session_id: str) -> None:
        session = next(s for s in sessions if s.id == session_id)
        for turn in range(1, per_task // 2 + 1):
            session.append("turn/start", TurnStart(turn=turn, trigger=MessageTrigger()))
            await session.aflush()
            session.append("turn/end", TurnEnd(turn=turn, reason=Completed()))
            await store.aflush()
            assert store.last_seq(session_id) == session.last_seq

    async def everyone() -> None:
        await asyncio.gather(*(produce(session.id) for session in sessions))

    run(everyone())
    for session in sessions:
        assert len(store.read(session.id)) == per_task


def test_one_wake_up_of_the_loop_resolves_every_callback_queued_before_it() -> None:
    loop = asyncio.new_event_loop()
    wakes: list[object] = []
    real = loop.call_soon_threadsafe

    def counting(callback: object, *args: object) -> object:
        wakes.append(callback)
        return real(callback, *args)  # type: ignore[arg-type]

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        waker = _LoopWaker(loop)
        futures = [loop.create_future() for _ in range(50)]
        failure = StorageError("the disk is gone")
        callbacks = [waker.callback(future) for future in futures]
        writer = threading.Thread(  # as the log writer: every callback before the loop runs
            target=lambda: [cb(failure if i == 7 else None) for i, cb in enumerate(callbacks)]
        )
        writer.start()
        writer.join(WAIT)
        loop.run_until_complete(asyncio.wait(futures, timeout=WAIT))
    finally:
        loop.close()
    assert len(wakes) == 1
    assert futures[7].exception() is failure
    assert all(f.result() is None for i, f in enumerate(futures) if i != 7)


def test_a_cancelled_waiter_is_skipped_and_the_others_still_resolve() -> None:
    loop = asyncio.new_event_loop()
    try:
        waker = _LoopWaker(loop)
        cancelled, waiting = loop.create_future(), loop.create_future()
        callbacks = [waker.callback(cancelled), waker.callback(waiting)]
        cancelled.cancel()
        for callback in callbacks:
            callback(None)
        loop.run_until_complete(asyncio.wait_for(waiting, WAIT))
    finally:
        loop.close()
    assert cancelled.cancelled() and waiting.result() is None


def test_a_callback_after_its_loop_closed_is_dropped_and_the_waker_works_again() -> None:
    closed = asyncio.new_event_loop()
    waker = _LoopWaker(closed)
    orphan = closed.create_future()
    closed.close()
    waker.callback(orphan)(None)  # no error: nobody can await it any more
    assert not waker._ready and not orphan.done()


def test_aflush_on_a_closed_store_raises_store_closed(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s")
    session = store.create_session("a")
    store.close()
    with pytest.raises(StoreClosedError, match=r"is closed(:|;) open it again"):
        run(session.aflush())
    with pytest.raises(StoreClosedError, match=r"is closed(:|;) open it again"):
        run(store.aflush())


def test_an_error_reported_to_the_flush_is_raised_by_the_await() -> None:
    failure = StorageError("the log writer could not commit")

    def failing_flush(callback: object) -> None:
        threading.Thread(target=callback, args=(failure,)).start()  # type: ignore[arg-type]

    with pytest.raises(StorageError) as caught:
        run(wait_durable(failing_flush))
    assert caught.value is failure


def test_cancelling_the_waiting_task_leaves_the_flush_to_finish(store: Store) -> None:
    session = store.create_session("a")
    session.append("turn/start", TurnStart(turn=1, trigger=MessageTrigger()))
    written = threading.Event()
    held = threading.Event()

    def hold(error: BaseException | None) -> None:  # keeps the writer in this commit
        held.set()
        written.wait(WAIT)

    async def cancel_one() -> None:
        store.flush_async(hold)
        assert await asyncio.to_thread(held.wait, WAIT)
        session.append("turn/end", TurnEnd(turn=1, reason=Completed()))
        asked = asyncio.Event()

        def flush_and_tell(callback: FlushCallback) -> None:
            session.flush_async(callback)
            asked.set()

        task = asyncio.ensure_future(wait_durable(flush_and_tell))
        await asked.wait()  # the flush is queued behind the held commit
        task.cancel()
        written.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.aflush()

    run(cancel_one())
    assert [event.type for event in store.read("a")] == ["turn/start", "turn/end"]
