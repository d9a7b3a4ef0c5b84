"""Blocking flushes: waiters woken in a chain, one that gives up or is interrupted (a
signal handler's flush), waiter reuse, and the pipe gates' descriptors."""

from __future__ import annotations

import _thread
import os
import signal
import threading

import pytest

from storage.errors import StorageError
from storage.lmdb import waiters as waiters_module
from storage.lmdb import writer as writer_module
from storage.lmdb.layout import event_key
from storage.lmdb.waiters import Waiter, resolve
from storage.records import PendingRecord
from tests.storage.writer_rig import (
    WAIT,
    Noticed,
    Rig,
    header,
    hold_writer,
    no_idle_compaction,
    once,
    payload,
    rig,
    signal_main_until,
    stored,
)

__all__ = ["no_idle_compaction", "rig"]  # fixtures used by name


def test_blocking_flushers_are_woken_in_a_chain_that_skips_those_who_gave_up() -> None:
    first, quitter, third = Waiter(), Waiter(), Waiter()
    assert not quitter.wait(0)  # gives up before the commit resolves it
    called: list[BaseException | None] = []
    end = resolve([first, quitter, called.append, third], None)
    assert called == [None]  # plain callbacks run at once, on the resolving thread
    assert end is not None
    assert not third.woken  # its turn comes when the first one runs
    outcome: list[bool] = []
    waiting = threading.Thread(target=lambda: outcome.append(third.wait(WAIT)))
    waiting.start()
    assert first.wait(WAIT)  # woken by the commit; wakes the next one still waiting
    waiting.join(WAIT)
    assert outcome == [True]
    assert end.wait(WAIT)  # the last one woke the end of the chain (the writer's)


def test_a_waiter_woken_while_giving_up_passes_the_turn_on() -> None:
    first, second = Waiter(), Waiter()
    error = StorageError("boom")
    end = resolve([first, second], error)
    assert end is not None
    assert first.give_up()  # woken before it gave up: counts as woken, wakes second
    assert second.wait(WAIT)
    assert second.error is error
    assert end.wait(WAIT)


def test_a_blocking_flush_reuses_its_waiter_but_never_one_that_gave_up(rig: Rig) -> None:
    rig.writer.flush(WAIT)
    spare = waiters_module.spare.slot[0]
    assert spare is not None  # woken normally: kept for this thread's next flush
    rig.writer.flush(WAIT)
    assert waiters_module.spare.slot[0] is spare
    release = hold_writer(rig)
    try:
        with pytest.raises(TimeoutError, match="did not complete"):
            rig.writer.flush(timeout=0.01)  # takes the spare, then gives it up
    finally:
        release.set()
    assert spare.gone
    assert waiters_module.spare.slot[0] is None  # the writer may still hold the one given up
    rig.writer.flush(WAIT)
    fresh = waiters_module.spare.slot[0]
    assert fresh is not None and fresh is not spare and not fresh.gone


def test_a_flush_woken_while_giving_up_returns_and_its_waiter_is_not_reused(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.writer.flush(WAIT)
    target = waiters_module.spare.slot[0]
    assert target is not None
    woken = threading.Event()
    release = hold_writer(rig)
    real_wake, real_give_up = waiters_module.wake, Waiter.give_up

    def wake(waiter: Waiter | None) -> None:
        real_wake(waiter)
        if waiter is target:
            woken.set()

    def give_up(self: Waiter) -> bool:
        if self is target:  # timed out: let the writer wake it before it gives up
            release.set()
            assert woken.wait(WAIT)
        return real_give_up(self)

    monkeypatch.setattr(waiters_module, "wake", wake)  # resolve and the waiters call it
    monkeypatch.setattr(writer_module, "wake", wake)  # and so does a flush
    monkeypatch.setattr(Waiter, "give_up", give_up)
    rig.writer.flush(timeout=0.01)  # woken meanwhile: no TimeoutError
    assert target.gone
    assert waiters_module.spare.slot[0] is None  # its _done is released, not held
    rig.writer.flush(WAIT)
    assert waiters_module.spare.slot[0] not in (None, target)


def test_a_flush_interrupted_once_queued_passes_the_turn_on_and_is_not_reused(
    rig: Rig,
) -> None:
    assert threading.current_thread() is threading.main_thread()  # KeyboardInterrupt's
    rig.writer.flush(WAIT)
    interrupted = waiters_module.spare.slot[0]
    queued = [threading.Event(), threading.Event()]
    outcome: list[BaseException | None] = []

    def flush_next() -> None:  # the waiter after the interrupted one in the chain
        try:
            rig.writer.flush(WAIT)
            outcome.append(None)
        except BaseException as err:  # reported below
            outcome.append(err)

    other = threading.Thread(target=flush_next)

    def interrupt() -> None:
        assert queued[0].wait(WAIT)
        other.start()
        assert queued[1].wait(WAIT)
        _thread.interrupt_main()  # raised in the main thread's flush, whatever it runs
        release.set()

    release = hold_writer(rig)
    with rig.writer._lock:  # the writer has drained the list; it waits
        rig.writer._callbacks = Noticed(lambda length: queued[length - 1].set())
    sender = threading.Thread(target=interrupt)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            rig.writer.flush(WAIT)
    finally:
        release.set()
        sender.join(WAIT)
    other.join(WAIT)
    assert outcome == [None]  # woken in turn (by the interrupted flush, or past it)
    assert interrupted is not None and interrupted.gone
    assert waiters_module.spare.slot[0] is None
    rig.writer.flush(WAIT)
    assert waiters_module.spare.slot[0] not in (None, interrupted)


def test_a_flush_in_a_signal_handler_during_a_flush_waits_with_a_waiter_of_its_own(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert threading.current_thread() is threading.main_thread()  # signal handlers run there
    rig.writer.flush(WAIT)
    outer = waiters_module.spare.slot[0]  # the interrupted flush takes it
    queued, woken = threading.Event(), threading.Event()
    spares: list[Waiter | None] = []
    real_wake = waiters_module.wake

    def wake(waiter: Waiter | None) -> None:
        real_wake(waiter)
        if waiter is outer:
            woken.set()

    ran, first = threading.Event(), once()

    def handler(signum: int, frame: object) -> None:
        if not first():
            return  # a repeated signal (see signal_main_until)
        ran.set()
        release.set()
        assert woken.wait(WAIT)  # the handler's flush goes to the next commit (for the
        rig.writer.flush(WAIT)  # same one, see the test after this one)
        spares.append(waiters_module.spare.slot[0])

    def interrupt() -> None:
        assert queued.wait(WAIT)
        signal_main_until(ran)

    monkeypatch.setattr(waiters_module, "wake", wake)  # resolve and the waiters call it
    monkeypatch.setattr(writer_module, "wake", wake)  # and so does a flush
    release = hold_writer(rig)
    with rig.writer._lock:  # the writer has drained the list; it waits
        rig.writer._callbacks = Noticed(lambda length: queued.set())
    previous = signal.signal(signal.SIGUSR1, handler)
    sender = threading.Thread(target=interrupt)
    try:
        sender.start()
        rig.writer.flush(WAIT)  # interrupted once queued: the handler's flush runs inside it
    finally:
        sender.join(WAIT)
        signal.signal(signal.SIGUSR1, previous)
        release.set()
    assert outer is not None and spares == [None]  # the handler's waiter is not kept
    assert waiters_module.spare.slot[0] is outer  # put back by the outer flush


def test_a_flush_in_a_signal_handler_that_shares_the_interrupted_flushs_commit_returns(
    rig: Rig,
) -> None:
    """The handler's flush and the one it interrupted are resolved by one commit, with
    another thread's flush queued after them: none of the three waits for the
    interrupted thread to run again (it cannot before the handler returns)."""
    assert threading.current_thread() is threading.main_thread()  # signal handlers run there
    rig.writer.flush(WAIT)
    outer = waiters_module.spare.slot[0]  # the interrupted flush takes it
    queued = [threading.Event() for _ in range(3)]
    outcome: dict[str, BaseException | None] = {}

    def flush_into(name: str) -> None:
        try:
            rig.writer.flush(WAIT)
            outcome[name] = None
        except BaseException as err:  # reported below
            outcome[name] = err

    ran, first = threading.Event(), once()

    def handler(signum: int, frame: object) -> None:
        if first():  # else a repeated signal (see signal_main_until)
            ran.set()
            flush_into("handler")

    other = threading.Thread(target=flush_into, args=("other",))

    def interrupt() -> None:
        assert queued[0].wait(WAIT)
        signal_main_until(ran)
        assert queued[1].wait(WAIT)
        other.start()
        assert queued[2].wait(WAIT)
        release.set()  # one commit resolves all three

    release = hold_writer(rig)
    with rig.writer._lock:  # the writer has drained the list; it waits
        rig.writer._callbacks = Noticed(lambda length: queued[length - 1].set())
    previous = signal.signal(signal.SIGUSR1, handler)
    sender = threading.Thread(target=interrupt)
    try:
        sender.start()
        flush_into("interrupted")
    finally:
        sender.join(WAIT)
        signal.signal(signal.SIGUSR1, previous)
        release.set()
    other.join(WAIT)
    assert outcome == {"handler": None, "other": None, "interrupted": None}
    assert waiters_module.spare.slot[0] is outer  # put back by the outer flush


def test_many_flushes_from_one_thread_and_from_many_threads_all_return_durable(
    rig: Rig,
) -> None:
    threads, per_thread = 8, 200
    for key in range(threads + 1):
        rig.writer.track(header(key), next_seq=0, new=True)
    for seq in range(per_thread):  # one thread: each flush reuses the last one's waiter
        rig.writer.submit(PendingRecord(0, seq, payload(0, seq)))
        rig.writer.flush(WAIT)
        if seq % 50 == 0:
            assert event_key(0, seq) in stored(rig.env, rig.dbs)
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def produce(key: int) -> None:
        try:
            start.wait(WAIT)
            for seq in range(per_thread):
                rig.writer.submit(PendingRecord(key, seq, payload(key, seq)))
                rig.writer.flush(WAIT)
        except BaseException as err:  # reported below
            errors.append(err)

    producers = [threading.Thread(target=produce, args=(key,)) for key in range(1, threads + 1)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join(WAIT * 6)
    assert errors == []
    assert not any(thread.is_alive() for thread in producers)
    assert stored(rig.env, rig.dbs) == {
        event_key(key, seq): payload(key, seq)
        for key in range(threads + 1)
        for seq in range(per_thread)
    }


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_blocking_flushers_beyond_the_pipe_gates_all_return_and_hold_no_more_descriptors(
    rig: Rig,
) -> None:
    # A blocking flush waits on a pipe (two descriptors) while fewer than _MAX_GATES
    # are open, on a lock beyond: rounds of 3 x _MAX_GATES threads flushing at once all
    # return, and the process never holds more than the gates' descriptors.
    count = 3 * waiters_module._MAX_GATES
    before = _open_fds()
    for _round in range(2):
        all_waiting = threading.Barrier(count + 1, timeout=WAIT)
        gates_seen: list[int] = []
        errors: list[BaseException] = []

        def flusher() -> None:
            try:
                all_waiting.wait()  # this round's barrier
                rig.writer.flush(WAIT)
                gates_seen.append(waiters_module._gates.open)
            except BaseException as err:  # reported below
                errors.append(err)

        threads = [threading.Thread(target=flusher) for _ in range(count)]
        for thread in threads:
            thread.start()
        all_waiting.wait()
        for thread in threads:
            thread.join(WAIT)
        assert errors == []
        assert not any(thread.is_alive() for thread in threads)
        assert len(gates_seen) == count
        assert max(gates_seen) <= waiters_module._MAX_GATES
        assert _open_fds() <= before + 2 * waiters_module._MAX_GATES
