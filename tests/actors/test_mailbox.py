"""The pooled mailbox: bounds and overflow, dead letters, run_now, death watchers, the
stopped event."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pykka import ActorDeadError, ActorRegistry, ThreadingFuture
from pykka._envelope import Envelope

from actors import (
    ActorDeath,
    Dispatcher,
    MailboxFullError,
    PooledActor,
    watch,
)

from .dispatcher_support import WAIT, Log, mailbox


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


def test_put_soon_on_the_io_loop_hands_the_pass_over_at_once_before_the_loop_waits(
    dispatcher: Dispatcher, io: Any
) -> None:
    # Mail put_soon during one pass of the I/O loop reaches its actors when the pass
    # ends (one run-queue item for the lot), not one wake of a worker each; and the loop
    # then idling (nothing more to do) must not keep it back.
    logs: list[list[tuple[str, Any]]] = [[] for _ in range(5)]
    refs = [Log.start(dispatcher, log, f"a{n}") for n, log in enumerate(logs)]
    for ref in refs:
        assert ref.ask("ready", timeout=WAIT) == "ready"
    done = threading.Event()
    passes: list[tuple[list[bool], int]] = []

    def one_pass() -> None:
        for ref in refs:
            mailbox(ref).put_soon(Envelope("soon"))
        handed = [mailbox(ref).statistics().scheduled for ref in refs]
        passes.append((handed, len(io._handoff.pending)))
        done.set()

    io.loop.call_soon_threadsafe(one_pass)
    assert done.wait(WAIT)
    for ref in refs:
        assert ref.ask("after", timeout=WAIT) == "after"
    assert [log[-2:] for log in logs] == [[(f"a{n}", "soon"), (f"a{n}", "after")] for n in range(5)]
    ((handed, pending),) = passes
    assert handed == [True] * 5 and pending == 5  # scheduled, handed over after the pass


def test_put_soon_off_the_io_loop_is_put(dispatcher: Dispatcher) -> None:
    log: list[tuple[str, Any]] = []
    ref = Log.start(dispatcher, log)
    mailbox(ref).put_soon(Envelope("now"))
    assert ref.ask("after", timeout=WAIT) == "after"
    assert log == [("a", "now"), ("a", "after")]
