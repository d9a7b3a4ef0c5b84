"""The dispatcher: one thread per actor at a time, fairness, throughput, standby and lent
workers, shutdown and a failed start."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pykka import ActorRegistry, Timeout

from actors import (
    Dispatcher,
    DispatcherShutdownError,
    PooledActor,
    waiting_on_actors,
)

from .dispatcher_support import WAIT, Log


def test_an_actor_is_never_run_by_two_threads_at_once(dispatcher: Dispatcher) -> None:
    class Exclusive(PooledActor):
        def __init__(self) -> None:
            super().__init__()
            self.actor_dispatcher = dispatcher
            self.inside = 0
            self.overlaps = 0
            self.count = 0
            self.threads: set[str] = set()

        def on_receive(self, message: Any) -> None:
            self.inside += 1
            if self.inside != 1:
                self.overlaps += 1
            self.threads.add(threading.current_thread().name)
            self.count += 1
            self.inside -= 1

    ref = Exclusive.start()
    proxy = ref.proxy()

    def send() -> None:
        for i in range(2000):
            ref.tell(i)

    senders = [threading.Thread(target=send) for _ in range(4)]
    for t in senders:
        t.start()
    for t in senders:
        t.join(WAIT)
    assert proxy.count.get(timeout=WAIT) == 8000
    assert proxy.overlaps.get(timeout=WAIT) == 0


def test_a_busy_actor_cannot_starve_another(dispatcher: Dispatcher) -> None:
    solo = Dispatcher(1, throughput=2, name="solo")
    try:
        log: list[tuple[str, Any]] = []
        gate, entered = threading.Event(), threading.Event()
        blocker = Log.start(solo, log, "blocker", gate, entered)
        busy = Log.start(solo, log, "busy")
        quiet = Log.start(solo, log, "quiet")
        blocker.tell("hold")
        assert entered.wait(WAIT)
        for i in range(10):
            busy.tell(i)
        quiet.tell("hello")
        gate.set()
        assert busy.ask("last", timeout=WAIT) == "last"
        order = [name for name, _ in log if name != "blocker"]
        # FIFO run queue, two messages per turn: quiet runs after busy's first batch.
        assert order.index("quiet") == 2
        assert [m for n, m in log if n == "busy"] == [*range(10), "last"]
    finally:
        ActorRegistry.stop_all(timeout=WAIT)
        solo.shutdown(timeout=WAIT)


def test_an_actor_yields_its_worker_after_throughput_messages(dispatcher: Dispatcher) -> None:
    log: list[tuple[str, Any]] = []
    gate, entered = threading.Event(), threading.Event()
    ref = Log.start(dispatcher, log, "a", gate, entered)
    ref.tell("hold")
    assert entered.wait(WAIT)
    before = dispatcher.statistics().batches
    for i in range(40):
        ref.tell(i)
    gate.set()
    ref.ask("sync", timeout=WAIT)
    # 40 queued messages + the ask at throughput 4 take at least 10 more batches.
    assert dispatcher.statistics().batches - before >= 10


def test_messages_sent_from_init_queue_until_the_actor_starts(dispatcher: Dispatcher) -> None:
    class SelfStarter(PooledActor):
        def __init__(self) -> None:
            super().__init__()
            self.actor_dispatcher = dispatcher
            self.seen: list[str] = []
            self.actor_ref.tell("from init")

        def on_start(self) -> None:
            self.seen.append("on_start")

        def on_receive(self, message: Any) -> None:
            self.seen.append(message)

    proxy = SelfStarter.start().proxy()
    assert proxy.seen.get(timeout=WAIT) == ["on_start", "from init"]


def test_the_dispatcher_is_chosen_per_class_or_in_init(dispatcher: Dispatcher) -> None:
    class OnClass(PooledActor):
        actor_dispatcher = dispatcher

        def on_receive(self, message: Any) -> str:
            return threading.current_thread().name

    class Default(PooledActor):
        def on_receive(self, message: Any) -> str:
            return threading.current_thread().name

    assert str(OnClass.start().ask("where", timeout=WAIT)).startswith("test-dispatcher")
    assert str(Default.start().ask("where", timeout=WAIT)).startswith("corral-dispatcher-default")
    assert Dispatcher.default() is Dispatcher.default()


def test_shutdown_joins_the_workers_and_refuses_new_work() -> None:
    d = Dispatcher(2, name="short-lived")
    log: list[tuple[str, Any]] = []
    ref = Log.start(d, log)
    assert ref.ask("x", timeout=WAIT) == "x"
    ref.stop(timeout=WAIT)
    assert d.shutdown(timeout=WAIT) is True
    stats = d.statistics()
    assert stats.shut_down
    assert stats.workers == 2
    assert stats.messages >= 2
    with pytest.raises(DispatcherShutdownError, match="short-lived"):
        Log.start(d, log)


def test_a_standby_worker_runs_other_actors_while_the_only_worker_is_blocked() -> None:
    d = Dispatcher(1, standby=1, stall_s=0.002, name="with-standby")
    try:
        log: list[tuple[str, Any]] = []
        gate, entered = threading.Event(), threading.Event()
        blocker = Log.start(d, log, "blocker", gate, entered)
        other = Log.start(d, log, "other")
        blocker.tell("hold")
        assert entered.wait(WAIT)
        # The only eager worker waits on the gate: without the standby this would time out.
        assert other.ask("ping", timeout=WAIT) == "ping"
        gate.set()
        assert blocker.ask("after", timeout=WAIT) == "after"
        stats = d.statistics()
        assert (stats.workers, stats.standby) == (2, 1)
    finally:
        ActorRegistry.stop_all(timeout=WAIT)
        assert d.shutdown(timeout=WAIT)  # the standby worker stops too


def test_standby_options_are_checked() -> None:
    with pytest.raises(ValueError, match="standby"):
        Dispatcher(1, standby=-1)
    with pytest.raises(ValueError, match="stall_s"):
        Dispatcher(1, standby=1, stall_s=0)


class Asker(PooledActor):
    """Asks ``target`` on its worker, inside ``waiting_on_actors`` (or not)."""

    def __init__(self, dispatcher: Dispatcher, lend: bool) -> None:
        super().__init__()
        self.actor_dispatcher = dispatcher
        self.lend = lend

    def on_receive(self, message: Any) -> Any:
        target, arrived, everyone = message
        arrived.release()
        everyone.acquire()  # every asker holds a worker at once before any of them asks
        if not self.lend:
            return target.ask("ping", timeout=0.5)
        with waiting_on_actors():
            return target.ask("ping", timeout=WAIT)


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_that_all_wait_on_other_actors_are_lent_workers_for_the_wait(
    workers: int,
) -> None:
    d = Dispatcher(workers, name="lending")
    try:
        log: list[tuple[str, Any]] = []
        target = Log.start(d, log, "target")
        askers = [Asker.start(d, lend=True) for _ in range(3)]
        arrived, everyone = threading.Semaphore(0), threading.Semaphore(0)
        futures = [a.ask((target, arrived, everyone), block=False) for a in askers]
        for _ in range(workers):  # every worker holds an asker (a lent one holds the third)
            assert arrived.acquire(timeout=WAIT)
        for _ in askers:
            everyone.release()
        assert [f.get(timeout=WAIT) for f in futures] == ["ping"] * 3
        assert [m for _, m in log] == ["ping"] * 3
        # each wait's lent worker ends once the work queued before its marker is done
        assert target.ask("after", timeout=WAIT) == "after"
    finally:
        ActorRegistry.stop_all(timeout=WAIT)
        assert d.shutdown(timeout=WAIT)


def test_without_a_lent_worker_a_wait_on_another_actor_holds_the_only_worker() -> None:
    d = Dispatcher(1, name="not-lending")
    try:
        target = Log.start(d, [], "target")
        asker = Asker.start(d, lend=False)
        arrived, everyone = threading.Semaphore(0), threading.Semaphore(1)
        with pytest.raises(Timeout):
            asker.ask((target, arrived, everyone), timeout=WAIT)
    finally:
        ActorRegistry.stop_all(timeout=WAIT)
        assert d.shutdown(timeout=WAIT)


def test_waiting_on_actors_off_a_dispatcher_lends_nothing() -> None:
    d = Dispatcher(1, name="outside")
    try:
        target = Log.start(d, [], "target")
        with waiting_on_actors():
            assert target.ask("ping", timeout=WAIT) == "ping"
        assert d.statistics().workers == 1
    finally:
        ActorRegistry.stop_all(timeout=WAIT)
        assert d.shutdown(timeout=WAIT)


def _failing_start(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    """``threading.Thread.start`` fails on its ``nth`` call from here on (as when the
    process is out of threads), and works otherwise."""
    start = threading.Thread.start
    calls = [0]

    def start_or_fail(thread: threading.Thread) -> None:
        calls[0] += 1
        if calls[0] == nth:
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_or_fail)


def _interrupted_start(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    """``threading.Thread.start`` raises ``KeyboardInterrupt`` on its ``nth`` call from
    here on, once the thread started: what a Ctrl-C in start()'s wait for the new
    thread does."""
    start = threading.Thread.start
    calls = [0]

    def start_then_interrupt(thread: threading.Thread) -> None:
        calls[0] += 1
        start(thread)
        if calls[0] == nth:
            raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", start_then_interrupt)


@pytest.mark.parametrize("nth", [1, 2, 3, 4, 5], ids=lambda n: f"start {n} interrupted")
def test_a_dispatcher_whose_worker_start_is_interrupted_stops_that_worker_too(
    monkeypatch: pytest.MonkeyPatch, nth: int
) -> None:
    # Before, a worker counted as started once start() returned: the one whose start
    # a Ctrl-C interrupted (it had started) was neither told to stop nor joined, and
    # ran on for good.
    before = set(threading.enumerate())
    _interrupted_start(monkeypatch, nth)
    with pytest.raises(KeyboardInterrupt):
        Dispatcher(3, standby=2, name="interrupted")  # 3 workers, then 2 standby ones
    monkeypatch.undo()
    assert set(threading.enumerate()) == before


@pytest.mark.parametrize("nth", [1, 2, 4, 5], ids=lambda n: f"start {n} fails")
def test_a_dispatcher_whose_worker_fails_to_start_stops_those_it_started(
    monkeypatch: pytest.MonkeyPatch, nth: int
) -> None:
    # Before, the workers started before the one that failed ran on for good: an open
    # with threads=1000000 left 22,639 threads alive.
    before = set(threading.enumerate())
    _failing_start(monkeypatch, nth)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        Dispatcher(3, standby=2, name="failing")  # starts 3 workers, then 2 standby ones
    monkeypatch.undo()
    assert set(threading.enumerate()) == before


class _Work:
    """A schedulable batch that says when it ran (and may wait on a gate first)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.ran = threading.Event()
        self.gate = gate

    def run_batch(self, throughput: int) -> tuple[int, bool]:
        self.ran.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT)
        return 1, False


def _watch(obj: object) -> threading.Event:
    """An event set once ``obj`` is freed."""
    import weakref

    gone = threading.Event()
    weakref.finalize(obj, gone.set)
    return gone


def _freed(gone: threading.Event) -> None:
    """Wait (collecting) until the watched object is gone, or fail."""
    import gc

    deadline = time.monotonic() + WAIT
    while not gone.is_set() and time.monotonic() < deadline:
        gc.collect()
        gone.wait(0.02)
    assert gone.is_set(), "the dispatcher still holds a batch it ran"


def test_an_idle_worker_and_an_idle_standby_hold_nothing_they_ran() -> None:
    d = Dispatcher(1, standby=1, stall_s=0.002, name="lets-go")
    gate = threading.Event()
    try:
        work = _Work()
        gone = _watch(work)
        d.schedule(work)
        assert work.ran.wait(WAIT)
        del work
        _freed(gone)  # the worker, idle again, let go of it
        blocker = _Work(gate)
        d.schedule(blocker)
        assert blocker.ran.wait(WAIT)
        stood_in = _Work()
        gone = _watch(stood_in)
        d.schedule(stood_in)  # the only worker waits on the gate: the standby runs it
        assert stood_in.ran.wait(WAIT)
        del stood_in
        _freed(gone)  # the standby, idle again, let go of it
    finally:
        gate.set()
        assert d.shutdown(timeout=WAIT)
