"""Flush groups: the actors that wait for durability in one round of the run queue share
one log flush, and each hears its outcome once, acknowledged before it is told."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from actors import Dispatcher, waiting_on_actors
from actors.flushes import FlushCallback, FlushGroup
from storage import Store, StoreClosedError
from storage.events import StepStart

WAIT = 5.0


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    d = Dispatcher(1, name="test-flushes")
    yield d
    d.shutdown(timeout=WAIT)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "store") as s:
        yield s


class Hold:
    """Keeps the dispatcher's worker busy until released: what is scheduled meanwhile
    waits on the run queue behind it."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.running = threading.Event()
        self.release = threading.Event()
        dispatcher.schedule(self)
        assert self.running.wait(WAIT)

    def run_batch(self, throughput: int) -> tuple[int, bool]:
        self.running.set()
        assert self.release.wait(WAIT)
        return 1, False


class Outcomes:
    """Member callbacks that record (name, error) and the threads they ran on."""

    def __init__(self, expected: int) -> None:
        self.seen: list[tuple[str, BaseException | None]] = []
        self.threads: set[int] = set()
        self._expected = expected
        self._changed = threading.Condition()

    def callback(self, name: str) -> FlushCallback:
        def called(error: BaseException | None) -> None:
            with self._changed:
                self.seen.append((name, error))
                self.threads.add(threading.get_ident())
                self._changed.notify_all()

        return called

    def wait_for(self, count: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: len(self.seen) >= count, WAIT)

    def all_in(self) -> bool:
        return self.wait_for(self._expected)


class Log:
    """A log whose flushes complete only when the test says so."""

    def __init__(self) -> None:
        self.pending: list[FlushCallback] = []
        self.asked = threading.Semaphore(0)

    def flush_async(self, callback: FlushCallback) -> None:
        self.pending.append(callback)
        self.asked.release()

    def wait_asked(self) -> None:
        assert self.asked.acquire(timeout=WAIT), "the group never asked the log for a flush"


class Member:
    """A session stand-in that records its acknowledgements in a shared journal."""

    def __init__(self, name: str, last_seq: int, journal: list[str]) -> None:
        self.name = name
        self.last_seq = last_seq
        self._journal = journal

    def acknowledge(self, mark: int) -> None:
        self._journal.append(f"ack {self.name} {mark}")


def test_the_actors_that_wait_in_one_round_share_one_flush(
    store: Store, dispatcher: Dispatcher
) -> None:
    asked: list[FlushCallback] = []

    class Counting:
        def flush_async(self, callback: FlushCallback) -> None:
            asked.append(callback)
            store.flush_async(callback)

    group = FlushGroup(Counting(), dispatcher)
    sessions = [store.create_session(f"s{i}") for i in range(20)]
    for index, session in enumerate(sessions):
        session.append_fact(StepStart(turn=1, step=index))
    outcomes = Outcomes(len(sessions))
    hold = Hold(dispatcher)  # every join below lands in the same round
    for index, session in enumerate(sessions):
        group.join(session, outcomes.callback(f"s{index}"))
    assert not asked  # sealed only once the round is over
    hold.release.set()
    assert outcomes.all_in()
    assert len(asked) == 1 and group.flushes == 1
    assert outcomes.seen == [(f"s{i}", None) for i in range(len(sessions))]  # join order
    # Acknowledged: the durable events are dropped from memory, and read back from the store.
    assert [session.resident_events for session in sessions] == [0] * len(sessions)
    assert [session.events()[0].data for session in sessions] == [
        StepStart(turn=1, step=i) for i in range(len(sessions))
    ]


def test_an_actor_that_joins_after_the_seal_waits_for_the_next_flush(
    dispatcher: Dispatcher,
) -> None:
    log, journal = Log(), []
    group = FlushGroup(log, dispatcher)
    outcomes = Outcomes(2)
    group.join(Member("a", 3, journal), outcomes.callback("a"))
    log.wait_asked()  # a's group is sealed: b starts the next one
    group.join(Member("b", 7, journal), outcomes.callback("b"))
    log.wait_asked()
    assert group.flushes == 2
    log.pending[0](None)  # only the first flush completes
    assert outcomes.wait_for(1)
    assert outcomes.seen == [("a", None)] and journal == ["ack a 3"]
    log.pending[1](None)
    assert outcomes.all_in()
    assert outcomes.seen == [("a", None), ("b", None)] and journal == ["ack a 3", "ack b 7"]


def test_members_are_acknowledged_through_the_seq_they_had_when_they_joined(
    dispatcher: Dispatcher,
) -> None:
    log, journal = Log(), []
    group = FlushGroup(log, dispatcher)
    member = Member("a", 4, journal)
    outcomes = Outcomes(1)
    hold = Hold(dispatcher)
    group.join(member, outcomes.callback("a"))
    member.last_seq = 9  # appended after joining: not covered by this wait
    hold.release.set()
    log.wait_asked()
    log.pending[0](None)
    assert outcomes.all_in()
    assert journal == ["ack a 4"]


def test_a_failed_flush_reaches_every_member_and_acknowledges_nothing(
    dispatcher: Dispatcher,
) -> None:
    log, journal = Log(), []
    group = FlushGroup(log, dispatcher)
    outcomes = Outcomes(3)
    hold = Hold(dispatcher)
    for name in "abc":
        group.join(Member(name, 1, journal), outcomes.callback(name))
    hold.release.set()
    log.wait_asked()
    failure = OSError("disk gone")
    log.pending[0](failure)
    assert outcomes.all_in()
    assert outcomes.seen == [("a", failure), ("b", failure), ("c", failure)]
    assert journal == []


def test_a_large_group_is_answered_throughput_members_a_batch_and_each_once_in_order() -> None:
    dispatcher = Dispatcher(1, throughput=4, name="test-flushes-4")
    try:
        log, journal, order = Log(), [], []
        group = FlushGroup(log, dispatcher)
        done = threading.Event()

        def member(name: str) -> FlushCallback:
            def called(error: BaseException | None) -> None:
                order.append(name)
                if name == "m9":
                    done.set()

            return called

        hold = Hold(dispatcher)
        for index in range(10):
            group.join(Member(f"m{index}", index, journal), member(f"m{index}"))
        hold.release.set()
        log.wait_asked()
        hold = Hold(dispatcher)  # the outcome queues behind this, the probe behind it

        class Probe:
            def run_batch(self, throughput: int) -> tuple[int, bool]:
                order.append("other work")
                return 1, False

        log.pending[0](None)
        dispatcher.schedule(Probe())
        hold.release.set()
        assert done.wait(WAIT)
        # Four members, then the work queued behind the outcome, then the rest.
        assert order == ["m0", "m1", "m2", "m3", "other work", *(f"m{i}" for i in range(4, 10))]
        assert journal == [f"ack m{i} {i}" for i in range(10)]
    finally:
        dispatcher.shutdown(timeout=WAIT)


def test_a_closed_store_refuses_the_flush_and_every_member_hears_it(
    store: Store, dispatcher: Dispatcher
) -> None:
    session = store.create_session("s")
    session.append_fact(StepStart(turn=1, step=1))
    store.close()
    group = FlushGroup(store, dispatcher)
    outcomes = Outcomes(1)
    group.join(session, outcomes.callback("s"))
    assert outcomes.all_in()
    [(_, error)] = outcomes.seen
    assert isinstance(error, StoreClosedError)


def test_one_members_failing_callback_does_not_strand_the_others(
    dispatcher: Dispatcher, caplog: pytest.LogCaptureFixture
) -> None:
    log, journal = Log(), []
    group = FlushGroup(log, dispatcher)
    outcomes = Outcomes(2)

    def broken(error: BaseException | None) -> None:
        raise RuntimeError("a broken member")

    hold = Hold(dispatcher)
    group.join(Member("a", 1, journal), outcomes.callback("a"))
    group.join(Member("b", 1, journal), broken)
    group.join(Member("c", 1, journal), outcomes.callback("c"))
    hold.release.set()
    log.wait_asked()
    log.pending[0](None)
    assert outcomes.all_in()
    assert outcomes.seen == [("a", None), ("c", None)]
    assert journal == ["ack a 1", "ack b 1", "ack c 1"]
    assert "a broken member" in caplog.text


def test_outcomes_are_delivered_on_a_worker_not_on_the_log_writer(
    store: Store, dispatcher: Dispatcher
) -> None:
    workers: list[int] = []
    probe = threading.Event()

    class Probe:
        def run_batch(self, throughput: int) -> tuple[int, bool]:
            workers.append(threading.get_ident())
            probe.set()
            return 1, False

    dispatcher.schedule(Probe())
    assert probe.wait(WAIT)
    session = store.create_session("s")
    session.append_fact(StepStart(turn=1, step=1))
    outcomes = Outcomes(1)
    FlushGroup(store, dispatcher).join(session, outcomes.callback("s"))
    assert outcomes.all_in()
    assert outcomes.threads == set(workers)


def test_after_the_dispatcher_shut_down_a_group_still_delivers(
    store: Store, dispatcher: Dispatcher
) -> None:
    session = store.create_session("s")
    session.append_fact(StepStart(turn=1, step=1))
    dispatcher.shutdown(timeout=WAIT)
    group = FlushGroup(store, dispatcher)
    outcomes = Outcomes(1)
    group.join(session, outcomes.callback("s"))  # sealed at once, delivered by the writer
    assert outcomes.all_in()
    assert outcomes.seen == [("s", None)] and session.resident_events == 0


def test_concurrent_joins_are_each_answered_exactly_once(
    store: Store,
) -> None:
    dispatcher = Dispatcher(2, name="test-flushes-2")
    try:
        group = FlushGroup(store, dispatcher)
        threads, per_thread = 4, 300
        outcomes = Outcomes(threads * per_thread)
        sessions = [store.create_session(f"s{t}") for t in range(threads)]

        def joiner(t: int) -> Callable[[], None]:
            def run() -> None:
                for i in range(per_thread):
                    sessions[t].append_fact(StepStart(turn=1, step=i))
                    group.join(sessions[t], outcomes.callback(f"{t}:{i}"))

            return run

        workers = [threading.Thread(target=joiner(t)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(WAIT)
        assert outcomes.all_in()
        names = [name for name, _ in outcomes.seen]
        assert sorted(names) == sorted(
            f"{t}:{i}" for t in range(threads) for i in range(per_thread)
        )
        assert all(error is None for _, error in outcomes.seen)
        assert all(session.resident_events == 0 for session in sessions)  # all acknowledged
    finally:
        dispatcher.shutdown(timeout=WAIT)


def test_a_member_that_waits_for_a_later_member_hands_the_rest_of_the_group_off(
    dispatcher: Dispatcher,
) -> None:
    # A member's callback runs its agent inline, listeners included; one that waits for
    # another agent (inside waiting_on_actors) whose own callback comes later in the same
    # outcome used to wait behind itself: the rest of the group ran only after it returned.
    log, journal = Log(), []
    group = FlushGroup(log, dispatcher)
    later_ran, waiter_done, order = threading.Event(), threading.Event(), []
    waited: list[bool] = []

    def waiter(error: BaseException | None) -> None:
        with waiting_on_actors():
            waited.append(later_ran.wait(WAIT))
        order.append("a")
        waiter_done.set()

    def later(name: str) -> FlushCallback:
        def called(error: BaseException | None) -> None:
            order.append(name)
            if name == "c":
                later_ran.set()

        return called

    hold = Hold(dispatcher)  # the three join one group
    group.join(Member("a", 1, journal), waiter)
    group.join(Member("b", 1, journal), later("b"))
    group.join(Member("c", 1, journal), later("c"))
    hold.release.set()
    log.wait_asked()
    log.pending[0](None)
    assert later_ran.wait(WAIT), "the members after a waiting one waited behind it"
    assert waiter_done.wait(WAIT)
    assert waited == [True]
    assert order == ["b", "c", "a"]  # each answered once, the rest in join order
    assert journal == ["ack a 1", "ack b 1", "ack c 1"]
