"""A Ctrl-C on the main thread never leaves one of the runtime's locks held.

A signal that lands while the main thread waits for a lock is raised as soon as the
lock is acquired: after ``lock.acquire()`` and before the ``try`` that would release it.
That lock is then held for good and the next send to that actor, append to that
session or flush of that store hangs (it did: ``corral run``'s close after Ctrl-C,
once in ~100 interrupts under load). Each test holds one lock on a helper thread, lets
the main thread block on it inside a public call, trips Ctrl-C's handler
(``_thread.interrupt_main()``) and then lets the lock go: the call must raise
``KeyboardInterrupt`` and leave every lock free.
"""

from __future__ import annotations

import _thread
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime, ScriptedModel
from storage.events import StepStart
from storage.lmdb.store import Store

WAIT = 10.0


def _main_blocked_in(function: str) -> bool:
    """The main thread sleeps inside ``function`` (on the held lock: nothing else on
    those paths waits)."""
    main = threading.main_thread()
    frame = sys._current_frames().get(main.ident or 0)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    if function not in names:
        return False
    with open(f"/proc/self/task/{main.native_id}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "S"


def interrupted_while_waiting_for(
    lock: Any, function: str, call: Callable[[], object], *, also: tuple[Any, ...] = ()
) -> None:
    """Hold ``lock`` until the main thread sleeps on it in ``function`` (inside
    ``call``), trip Ctrl-C, release; ``call`` must raise KeyboardInterrupt, and
    ``lock`` and the locks in ``also`` must be free afterwards. (One left held is
    released here before the test fails, so that closing the store does not hang.)"""
    assert threading.current_thread() is threading.main_thread()
    held, failure = threading.Event(), []

    def holder() -> None:
        with lock:
            held.set()
            deadline = time.monotonic() + WAIT
            pause = threading.Event()
            while not _main_blocked_in(function):
                if time.monotonic() > deadline:
                    failure.append(f"the main thread never blocked in {function}")
                    return
                pause.wait(0.002)
            _thread.interrupt_main()

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(WAIT)
    with pytest.raises(KeyboardInterrupt):
        call()
    thread.join(WAIT)
    assert not failure, failure
    held_for_good = [each for each in (lock, *also) if not is_free(each)]
    for each in held_for_good:
        each.release()  # held by this (the main) thread since the interrupt
    assert not held_for_good, "a lock stayed held after the interrupt"


def is_free(lock: Any) -> bool:
    """Whether another thread can take ``lock`` (an RLock the main thread kept would
    look free to the main thread itself). It waits: the log writer's own thread takes
    the writer's lock now and then."""
    got: list[bool] = []

    def take() -> None:
        got.append(lock.acquire(True, WAIT))
        if got[0]:
            lock.release()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(2 * WAIT)
    return got == [True]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "store")
    try:
        yield store
    finally:
        store.close()


def test_an_append_interrupted_waiting_for_its_session_leaves_the_session_usable(
    store: Store,
) -> None:
    session = store.create_session()
    interrupted_while_waiting_for(
        session._lock, "append_fact", lambda: session.append_fact(StepStart(turn=1, step=1))
    )
    session.append_fact(StepStart(turn=1, step=1))
    session.flush(WAIT)
    assert [event.type for event in session.events()][-1] == "step/start"


def test_an_append_interrupted_waiting_for_the_log_writer_leaves_both_locks_free(
    store: Store,
) -> None:
    session = store.create_session()
    writer = store._writer
    assert writer is not None
    interrupted_while_waiting_for(
        writer._lock,
        "append_fact",
        lambda: session.append_fact(StepStart(turn=1, step=1)),
        also=(session._lock,),
    )
    store.flush(WAIT)  # the writer still takes records and answers flushes


def test_a_flush_interrupted_waiting_for_the_log_writer_leaves_it_free(store: Store) -> None:
    session = store.create_session()
    session.append_fact(StepStart(turn=1, step=1))
    writer = store._writer
    assert writer is not None
    interrupted_while_waiting_for(writer._lock, "flush", lambda: session.flush(WAIT))
    session.flush(WAIT)


def test_reading_messages_interrupted_waiting_for_the_session_leaves_it_free(
    store: Store,
) -> None:
    session = store.create_session()
    interrupted_while_waiting_for(session._lock, "derive_messages", session.messages)
    assert session.messages() == []


def test_a_send_interrupted_waiting_for_the_mailbox_leaves_the_agent_working(
    tmp_path: Path,
) -> None:
    with Runtime.open(tmp_path / "store") as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        assert agent._slot.ref is not None
        mailbox = agent._slot.ref.actor_inbox
        interrupted_while_waiting_for(mailbox._lock, "put", lambda: agent.followup("hello"))
        agent.followup("hello again")
        assert agent.wait_idle(WAIT)
        texts = [m.content[0].text for m in agent.session.messages()]
        assert texts[-2:] == ["hello again", "hello again"]
