"""Ctrl-C ends a blocking wait on the main thread even when it lands just before the wait.

``_thread.interrupt_main()`` trips SIGINT's handler the way a real signal does, but
interrupts no system call: exactly a Ctrl-C that arrives after the main thread released
the interpreter lock and before its wait began (see ``runtime.waiting``).
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime import Runtime, ScriptedModel, ToolCall, tool, waiting
from storage import assert_invariants
from storage.lmdb.store import Store

WAIT = 10.0


def main_thread_waits() -> bool:
    """Whether the main thread is in ``runtime.waiting.wait``, blocked in an event's wait."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    names: list[tuple[str, str]] = []
    while frame is not None:
        names.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    inner = bool(names) and names[0][0].endswith("threading.py") and names[0][1] == "wait"
    return inner and (waiting.__file__, "wait") in names


def main_thread_waits_in(function: str) -> bool:
    """Whether the main thread is blocked in an event's (or a condition's) wait somewhere
    inside ``function``."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    names: list[tuple[str, str]] = []
    while frame is not None:
        names.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    inner = bool(names) and names[0][0].endswith("threading.py") and names[0][1] == "wait"
    return inner and function in [name for _, name in names]


def interrupt_main_once_it_waits(release: Callable[[], None]) -> Callable[[], bool]:
    """From a helper thread: once the main thread waits, trip Ctrl-C's handler. If the
    wait has not ended WAIT seconds later, ``release()`` it (so that a failure does not
    hang the suite). Returns a function that stops the helper and says whether it
    had to release the wait."""
    caught, released = threading.Event(), threading.Event()

    def interrupt() -> None:
        deadline = time.monotonic() + WAIT
        pause = threading.Event()
        while not main_thread_waits():
            assert time.monotonic() < deadline, "the main thread never began to wait"
            pause.wait(0.002)
        _thread.interrupt_main()
        if not caught.wait(WAIT):
            released.set()
            release()

    helper = threading.Thread(target=interrupt)
    helper.start()

    def finish() -> bool:
        caught.set()
        helper.join(WAIT)
        return released.is_set()

    return finish


def test_a_ctrl_c_that_misses_the_waits_system_call_still_ends_the_wait() -> None:
    event = threading.Event()
    finish = interrupt_main_once_it_waits(event.set)
    with pytest.raises(KeyboardInterrupt):
        waiting.wait(event)
    assert not finish(), "the wait went on until it was released: the Ctrl-C was not handled"


def test_a_ctrl_c_during_wait_idle_ends_the_wait_while_the_turn_runs(tmp_path: Path) -> None:
    with Runtime.open(tmp_path / "store") as rt:
        agent = rt.spawn(model=ScriptedModel.echo(latency=3600))
        agent.followup("take your time")
        finish = interrupt_main_once_it_waits(agent.cancel)
        with pytest.raises(KeyboardInterrupt):
            agent.wait_idle()
        assert not finish(), "wait_idle went on until the turn was cancelled"
        assert agent.status == "running"  # the turn still runs: only the wait ended


def test_a_wait_returns_whether_the_event_was_set() -> None:
    event = threading.Event()
    assert waiting.wait(event, 0.25) is False  # longer than a slice: sliced, then False
    assert waiting.wait(event, 0) is False
    threading.Thread(target=event.set).start()
    assert waiting.wait(event) is True
    assert waiting.wait(event, 0.25) is True


def test_off_the_main_thread_a_wait_is_the_events_own() -> None:
    event, results = threading.Event(), []
    calls: list[float | None] = []

    class Recording(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            calls.append(timeout)
            return event.wait(timeout)

    worker = threading.Thread(target=lambda: results.append(waiting.wait(Recording(), 30.0)))
    worker.start()
    event.set()
    worker.join(WAIT)
    assert results == [True] and calls == [30.0]  # one wait, not slices


def test_a_ctrl_c_during_close_is_handled_while_a_tool_call_holds_the_turn(
    tmp_path: Path,
) -> None:
    # corral run's handler once the close began: a press only says what goes on (the
    # one after quits). One that missed the wait's system call was handled only when
    # close's wait for the agent's disposal ended (the tool returned, or 30 s later):
    # tests/cli/test_run.py waited on the message it prints, so the close timed out.
    running, release, handled = threading.Event(), threading.Event(), threading.Event()

    @tool
    def hold() -> str:
        """Hold the turn until released."""
        running.set()
        release.wait(2 * WAIT)
        return "released"

    previous = signal.signal(signal.SIGINT, lambda *_: handled.set())
    try:
        rt = Runtime.open(tmp_path / "store")
        agent = rt.spawn(model=ScriptedModel([[ToolCall("hold", {})], "done"]), tools=[hold])
        agent.followup("go")
        assert running.wait(WAIT)
        in_time: list[bool] = []

        def interrupt() -> None:
            deadline = time.monotonic() + WAIT
            pause = threading.Event()
            while not main_thread_waits_in("close") and time.monotonic() < deadline:
                pause.wait(0.002)
            _thread.interrupt_main()
            in_time.append(handled.wait(WAIT))
            release.set()

        helper = threading.Thread(target=interrupt)
        helper.start()
        rt.close(timeout=3 * WAIT)
        helper.join(WAIT)
    finally:
        release.set()
        signal.signal(signal.SIGINT, previous)
    assert in_time == [True], "the Ctrl-C was handled only once the tool call returned"
    assert agent.disposed  # the close went on: the tool's result is logged, the turn ended
    with Store.open(tmp_path / "store", readonly=True) as store:
        events = store.open_session(agent.id).events()
    assert "tool/result" in [event.type for event in events]
    assert_invariants(events)


def test_a_once_flag_wakes_its_waiters_when_set_and_answers_at_once_after() -> None:
    flag = waiting.OnceFlag()
    assert not flag.is_set()
    assert flag.wait(0.01) is False  # (not set: the wait times out)
    woke: list[bool] = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        woke.append(flag.wait(10))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert started.wait(10)
    flag.set()
    thread.join(10)
    assert woke == [True]
    assert flag.is_set() and flag.wait(0) is True
    fresh = waiting.OnceFlag()
    fresh.set()  # set before anyone waits: no event is ever built, a wait answers at once
    assert fresh.wait() is True
