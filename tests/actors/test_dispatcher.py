"""The dispatcher and the pooled mailbox: scheduling, ordering, bounds, dead letters, deaths."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pykka import ActorDeadError, ActorRef, ActorRegistry, ThreadingFuture, Timeout
from pykka._envelope import Envelope

from actors import (
    ActorDeath,
    Dispatcher,
    DispatcherShutdownError,
    Mailbox,
    MailboxFullError,
    PooledActor,
    waiting_on_actors,
    watch,
)

WAIT = 5.0


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    d = Dispatcher(2, throughput=4, name="test-dispatcher")
    yield d
    ActorRegistry.stop_all(timeout=WAIT)
    d.shutdown(timeout=WAIT)


def mailbox(ref: ActorRef[Any]) -> Mailbox:
    inbox = ref.actor_inbox
    assert isinstance(inbox, Mailbox)
    return inbox


class Log(PooledActor):
    """Appends (name, message) to a shared log; can be held on a gate."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        log: list[tuple[str, Any]],
        name: str = "a",
        gate: threading.Event | None = None,
        entered: threading.Event | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.actor_dispatcher = dispatcher
        for key, value in options.items():
            setattr(self, key, value)
        self.log = log
        self.name = name
        self.gate = gate
        self.entered = entered

    def on_receive(self, message: Any) -> Any:
        if message == "hold":
            assert self.entered is not None
            assert self.gate is not None
            self.entered.set()
            self.gate.wait(WAIT)
        if message == "boom":
            raise ValueError("boom")
        self.log.append((self.name, message))
        return message


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


def test_a_full_rejecting_mailbox_raises_a_typed_error_naming_actor_and_limit(
    dispatcher: Dispatcher,
) -> None:
    gate, entered = threading.Event(), threading.Event()
    ref = Log.start(dispatcher, [], "a", gate, entered, actor_mailbox_limit=2)
    ref.tell("hold")
    assert entered.wait(WAIT)
    ref.tell(1)
    ref.tell(2)
    assert mailbox(ref).depth == 2
    with pytest.raises(MailboxFullError) as caught:
        ref.tell(3)
    assert caught.value.limit == 2
    assert "Log" in str(caught.value)
    assert "2 messages" in str(caught.value)
    stats = mailbox(ref).statistics()
    assert (stats.depth, stats.limit, stats.overflow) == (2, 2, "reject")
    gate.set()


def test_a_stop_request_is_never_refused_by_a_full_mailbox(dispatcher: Dispatcher) -> None:
    gate, entered = threading.Event(), threading.Event()
    ref = Log.start(dispatcher, [], "a", gate, entered, actor_mailbox_limit=1)
    ref.tell("hold")
    assert entered.wait(WAIT)
    ref.tell(1)
    stopping = ref.stop(block=False)
    gate.set()
    assert stopping.get(timeout=WAIT) is True


def test_a_blocking_mailbox_makes_the_sender_wait_for_space(dispatcher: Dispatcher) -> None:
    log: list[tuple[str, Any]] = []
    gate, entered = threading.Event(), threading.Event()
    ref = Log.start(
        dispatcher, log, "a", gate, entered, actor_mailbox_limit=1, actor_mailbox_overflow="block"
    )
    ref.tell("hold")
    assert entered.wait(WAIT)
    ref.tell(1)
    sent = threading.Event()

    def sender() -> None:
        ref.tell(2)  # blocks until message 1 leaves the mailbox
        sent.set()

    thread = threading.Thread(target=sender)
    thread.start()
    assert not sent.is_set()
    gate.set()
    assert sent.wait(WAIT)
    thread.join(WAIT)
    assert ref.ask("sync", timeout=WAIT) == "sync"
    assert [m for _, m in log] == ["hold", 1, 2, "sync"]


def test_a_blocking_mailbox_gives_up_after_its_timeout(dispatcher: Dispatcher) -> None:
    gate, entered = threading.Event(), threading.Event()
    ref = Log.start(
        dispatcher,
        [],
        "a",
        gate,
        entered,
        actor_mailbox_limit=1,
        actor_mailbox_overflow="block",
        actor_mailbox_block_timeout=0.01,
    )
    ref.tell("hold")
    assert entered.wait(WAIT)
    ref.tell(1)
    with pytest.raises(MailboxFullError, match="after waiting"):
        ref.tell(2)
    gate.set()


def test_a_blocking_mailbox_rejects_senders_on_dispatcher_workers(dispatcher: Dispatcher) -> None:
    gate, entered = threading.Event(), threading.Event()
    target = Log.start(
        dispatcher, [], "t", gate, entered, actor_mailbox_limit=1, actor_mailbox_overflow="block"
    )
    target.tell("hold")
    assert entered.wait(WAIT)
    target.tell(1)

    class Sender(PooledActor):
        actor_dispatcher = dispatcher

        def on_receive(self, message: Any) -> str:
            try:
                target.tell(2)
            except MailboxFullError:
                return "rejected"
            return "waited"

    assert Sender.start().ask("go", timeout=WAIT) == "rejected"
    gate.set()


def test_a_message_that_reaches_a_stopped_actor_is_a_dead_letter(dispatcher: Dispatcher) -> None:
    ref = Log.start(dispatcher, [])
    ref.stop(timeout=WAIT)
    before = dispatcher.dead_letters.count
    # The race ActorRef.tell cannot see: is_alive() passed, then the actor stopped.
    ref.actor_inbox.put(Envelope("told too late"))
    future: ThreadingFuture[Any] = ThreadingFuture()
    ref.actor_inbox.put(Envelope("asked too late", reply_to=future))
    with pytest.raises(ActorDeadError):
        future.get(timeout=WAIT)
    assert dispatcher.dead_letters.count == before + 2
    recent = [letter.message for letter in dispatcher.dead_letters.recent()]
    assert recent[-2:] == ["told too late", "asked too late"]


class OnWorker:
    """Runs ``work`` once on a worker of the dispatcher (as a flush group's outcome does)."""

    def __init__(self, dispatcher: Dispatcher, work: Any) -> None:
        self._work = work
        self.done = threading.Event()
        self.result: Any = None
        dispatcher.schedule(self)
        assert self.done.wait(WAIT)

    def run_batch(self, throughput: int) -> tuple[int, bool]:
        try:
            self.result = self._work()
        finally:
            self.done.set()
        return 1, False


class Recorder(Log):
    """A Log that also records the thread of each message, and tells itself
    ``("echo", 0)``, ... ``("echo", k - 1)`` for the message ``("tell myself", k)``
    (``echoed`` is set by the last)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        log: list[tuple[str, Any]],
        threads: dict[Any, int],
        echoed: threading.Event,
    ) -> None:
        super().__init__(dispatcher, log)
        self.threads = threads
        self.echoed = echoed
        self.echoes = 0

    def on_receive(self, message: Any) -> Any:
        self.threads[message] = threading.get_ident()
        if isinstance(message, tuple) and message[0] == "tell myself":
            self.echoes = message[1]
            for index in range(self.echoes):
                self.actor_ref.tell(("echo", index))
        if message == ("echo", self.echoes - 1):
            self.echoed.set()
        return super().on_receive(message)


def test_run_now_on_a_worker_handles_an_idle_actors_message_there_before_it_returns(
    dispatcher: Dispatcher,
) -> None:
    log: list[tuple[str, Any]] = []
    threads: dict[Any, int] = {}
    ref = Recorder.start(dispatcher, log, threads, threading.Event())
    assert ref.ask("ready", timeout=WAIT) == "ready"  # started, and idle again

    def run() -> tuple[int, list[tuple[str, Any]]]:
        mailbox(ref).run_now(Envelope("now"))
        return threading.get_ident(), list(log)

    worker = OnWorker(dispatcher, run)
    thread, seen = worker.result
    assert seen == [("a", "ready"), ("a", "now")]
    assert threads["now"] == thread
    assert not mailbox(ref).statistics().scheduled
    assert ref.ask("after", timeout=WAIT) == "after"  # the mailbox runs as before


def test_run_now_queues_the_message_behind_a_busy_actors_mail(dispatcher: Dispatcher) -> None:
    gate, entered = threading.Event(), threading.Event()
    log: list[tuple[str, Any]] = []
    ref = Log.start(dispatcher, log, "a", gate, entered)
    ref.tell("hold")
    assert entered.wait(WAIT)
    ref.tell("queued")
    worker = OnWorker(dispatcher, lambda: mailbox(ref).run_now(Envelope("later")) or list(log))
    assert worker.result == []  # nothing handled by run_now: the actor was busy
    gate.set()
    assert ref.ask("last", timeout=WAIT) == "last"
    assert log == [("a", "hold"), ("a", "queued"), ("a", "later"), ("a", "last")]


def test_mail_sent_while_run_now_handles_a_message_is_handled_next_there_up_to_the_throughput(
    dispatcher: Dispatcher,
) -> None:
    # Throughput 4: the message and the first three of its six echoes are handled on the
    # calling worker before run_now returns; the other three by a worker afterwards.
    log: list[tuple[str, Any]] = []
    threads: dict[Any, int] = {}
    echoed = threading.Event()
    ref = Recorder.start(dispatcher, log, threads, echoed)
    assert ref.ask("ready", timeout=WAIT) == "ready"

    def run() -> tuple[int, list[tuple[str, Any]]]:
        mailbox(ref).run_now(Envelope(("tell myself", 6)))
        return threading.get_ident(), list(log)

    thread, seen = OnWorker(dispatcher, run).result
    echoes = [("a", ("echo", index)) for index in range(6)]
    assert seen == [("a", "ready"), ("a", ("tell myself", 6)), *echoes[:3]]
    assert [threads[("echo", index)] for index in range(3)] == [thread] * 3
    assert echoed.wait(WAIT)  # the rest was put on the run queue, not dropped
    assert ref.ask("last", timeout=WAIT) == "last"
    assert log == [("a", "ready"), ("a", ("tell myself", 6)), *echoes, ("a", "last")]


def test_run_now_to_a_stopped_actor_is_a_dead_letter(dispatcher: Dispatcher) -> None:
    ref = Log.start(dispatcher, [])
    ref.stop(timeout=WAIT)
    before = dispatcher.dead_letters.count
    OnWorker(dispatcher, lambda: mailbox(ref).run_now(Envelope("too late")))
    assert dispatcher.dead_letters.count == before + 1
    assert dispatcher.dead_letters.recent()[-1].message == "too late"


def test_messages_left_in_the_mailbox_at_stop_are_dead_letters(dispatcher: Dispatcher) -> None:
    gate, entered = threading.Event(), threading.Event()
    ref = Log.start(dispatcher, [], "a", gate, entered)
    ref.tell("hold")
    assert entered.wait(WAIT)
    ref.tell("boom")
    ref.tell("never handled")
    gate.set()
    assert ref.actor_stopped.wait(WAIT)
    done = threading.Event()
    watch(ref, lambda _ref, _death: done.set())
    assert done.wait(WAIT)
    assert dispatcher.dead_letters.recent()[-1].message == "never handled"


def test_death_watchers_tell_a_failure_from_a_requested_stop(dispatcher: Dispatcher) -> None:
    deaths: dict[str, ActorDeath] = {}
    seen = threading.Event()

    def record(name: str) -> Any:
        def callback(_ref: Any, death: ActorDeath) -> None:
            deaths[name] = death
            if len(deaths) == 2:
                seen.set()

        return callback

    failing = Log.start(dispatcher, [], "f")
    stopping = Log.start(dispatcher, [], "s")
    watch(failing, record("failing"))
    stopping_actor = stopping._actor_weakref()
    assert stopping_actor is not None
    stopping_actor.actor_on_death(record("stopping"))
    failing.tell("boom")
    stopping.stop(block=False)
    assert seen.wait(WAIT)
    assert deaths["failing"].failed
    assert isinstance(deaths["failing"].error, ValueError)
    assert not deaths["stopping"].failed
    assert deaths["stopping"].error is None


def test_watching_a_dead_actor_calls_back_at_once_and_disposers_unwatch(
    dispatcher: Dispatcher,
) -> None:
    ref = Log.start(dispatcher, [])
    calls: list[str] = []
    dispose = watch(ref, lambda _r, _d: calls.append("unwatched"))
    dispose()
    dispose()
    ref.stop(timeout=WAIT)
    watch(ref, lambda _r, death: calls.append(f"failed={death.failed}"))
    assert calls == ["failed=False"]


def test_only_pooled_actor_refs_can_be_watched() -> None:
    import pykka

    class Plain(pykka.ThreadingActor):
        pass

    ref = Plain.start()
    try:
        with pytest.raises(TypeError, match="PooledActor"):
            watch(ref, lambda _r, _d: None)
    finally:
        ref.stop(timeout=WAIT)


def test_messages_to_an_actor_whose_dispatcher_shut_down_are_dead_letters() -> None:
    d = Dispatcher(1, name="gone")
    ref = Log.start(d, [])
    assert ref.ask("x", timeout=WAIT) == "x"
    d.shutdown(timeout=WAIT)
    with pytest.raises(ActorDeadError):
        ref.ask("nobody runs me", timeout=WAIT)
    assert d.dead_letters.recent()[-1].reason == "sent after its dispatcher shut down"
    ActorRegistry.unregister(ref)


def test_the_stopped_event_behaves_like_a_threading_event() -> None:
    from actors import StoppedEvent

    early = StoppedEvent()
    assert isinstance(early, threading.Event)
    assert not early.is_set()
    assert early.wait(0) is False
    waiting = threading.Event()
    woke: list[bool] = []

    def waiter() -> None:
        waiting.set()
        woke.append(early.wait(WAIT))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(WAIT)
    early.set()
    thread.join(WAIT)
    assert woke == [True]
    late = StoppedEvent()
    late.set()
    assert late.wait(WAIT) is True
    late.clear()
    assert not late.is_set()


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
