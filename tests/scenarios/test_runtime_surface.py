"""The public surface scripts rely on: Runtime.open options, spawn/resume/get/agents."""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pykka import ActorRegistry

from actors.agent import AgentActor
from actors.errors import AgentDisposedError
from runtime import Runtime, ScriptedModel, ToolCall, tool
from storage import (
    DuplicateSessionError,
    UnknownSessionError,
    assert_invariants,
    pending_inbox,
)
from storage.lmdb.store import Store

from .conftest import WAIT, HeldActor, Timeline, check_store


@pytest.mark.parametrize("durability", ["write-ahead", "turn", "none"])
def test_every_durability_mode_runs_turns_and_settles(store_path: Path, durability: str) -> None:
    with Runtime.open(store_path, durability=durability) as rt:  # type: ignore[arg-type]
        timeline = Timeline(rt)
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("one")
        agent.followup("two")
        assert agent.wait_idle(WAIT)
        assert len(timeline.wait_for("agent/settled", 2)) == 2
        rt.flush()
    check_store(store_path)


def test_asyncio_code_awaits_durability_of_the_runtime_and_of_one_agents_session(
    store_path: Path,
) -> None:
    with Runtime.open(store_path, durability="none") as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("one")
        assert agent.wait_idle(WAIT)

        async def checkpoint() -> None:
            await agent.session.aflush()
            await rt.aflush()

        asyncio.run(asyncio.wait_for(checkpoint(), WAIT))
        events = agent.session.events()
        assert rt.store.statistics().events_written >= len(events)
        assert rt.store.read(agent.id) == events
    check_store(store_path)


def test_an_unknown_durability_mode_is_refused(store_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        Runtime.open(store_path, durability="sometimes")  # type: ignore[arg-type]


def test_spawn_refuses_a_session_id_that_exists(rt: Runtime) -> None:
    rt.spawn(model=ScriptedModel.echo(), session_id="same")
    with pytest.raises(DuplicateSessionError, match="a session 'same' already exists"):
        rt.spawn(model=ScriptedModel.echo(), session_id="same")


def test_resume_of_an_unknown_session_is_a_clear_error(rt: Runtime) -> None:
    with pytest.raises(
        UnknownSessionError, match=r"no session 'nobody'.*rt.spawn\(session_id='nobody'"
    ):
        rt.resume("nobody", model=ScriptedModel.echo())


def test_get_and_agents_list_the_live_agents(rt: Runtime) -> None:
    a = rt.spawn(model=ScriptedModel.echo(), session_id="a")
    b = rt.spawn(model=ScriptedModel.echo(), session_id="b")
    assert rt.get("a") is a
    assert {x.id for x in rt.agents()} == {"a", "b"}
    assert b.dispose(WAIT)
    assert [x.id for x in rt.agents()] == ["a"]
    with pytest.raises(KeyError, match="no live agent 'b'"):
        rt.get("b")


def test_a_spawn_with_a_bad_model_or_tools_fails_before_anything_is_created(rt: Runtime) -> None:
    with pytest.raises(TypeError, match="model must be a Model"):
        rt.spawn(model=object())  # type: ignore[arg-type]

    def dup() -> str:
        return "x"

    with pytest.raises(ValueError, match="unique"):
        rt.spawn(model=ScriptedModel.echo(), tools=[dup, dup])
    assert rt.agents() == []
    assert rt.store.sessions() == []


def test_an_unknown_live_event_name_is_refused(rt: Runtime) -> None:
    with pytest.raises(ValueError, match="unknown live event"):
        rt.on("agent/turn-start", lambda e: None)


def test_agent_scoped_listeners_see_only_their_agents_events(rt: Runtime) -> None:
    a = rt.spawn(model=ScriptedModel.echo())
    b = rt.spawn(model=ScriptedModel.echo())
    seen: list[str] = []
    a.on("agent/settled", lambda e: seen.append(e.agent.id))
    b.followup("b")
    a.followup("a")
    assert a.wait_idle(WAIT)
    assert b.wait_idle(WAIT)
    assert seen == [a.id]


def test_an_agent_created_listener_may_send_work_to_the_new_agent(rt: Runtime) -> None:
    # Before, agent/created was emitted before the handle was bound: followup, inject,
    # clear and .inbox raised a bare AssertionError there.
    sent: list[str] = []
    rt.on("agent/created", lambda event: sent.append(event.agent.followup("from created")))
    agent = rt.spawn(model=ScriptedModel.echo())
    assert agent.wait_idle(WAIT)
    assert len(sent) == 1
    users = [m.content[0].text for m in agent.session.messages() if m.role == "user"]
    assert users == ["from created"]


def test_an_agents_own_listeners_go_with_it_when_it_is_disposed(rt: Runtime) -> None:
    # Before, every disposed agent's agent.on listeners stayed on the bus for good (a
    # long-lived runtime leaked them), and one registered on a disposed agent was
    # accepted and never called.
    for _ in range(50):
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.on("agent/status", lambda event: None)
        agent.on("session/event", lambda event: None)
        assert agent.dispose(WAIT)
    assert rt.bus.listener_count("agent/status", scope=agent.id) == 0
    assert rt.bus.listener_count("session/event", scope=agent.id) == 0
    assert rt._table.bridge.listeners == 0
    with pytest.raises(AgentDisposedError, match="a listener of it would never be called"):
        agent.on("agent/status", lambda event: None)
    kept = rt.spawn(model=ScriptedModel.echo())
    seen: list[str] = []
    dispose = kept.on("agent/status", lambda event: seen.append(event.status))
    kept.followup("hi")
    assert kept.wait_idle(WAIT)
    assert seen == ["running", "idle"]
    dispose()
    dispose()  # idempotent, also after the sweep
    assert rt.bus.listener_count("agent/status", scope=kept.id) == 0


def test_on_after_close_is_refused(store_path: Path) -> None:
    rt = Runtime.open(store_path)
    agent = rt.spawn(model=ScriptedModel.echo())
    rt.close()
    with pytest.raises(RuntimeError, match="closed"):
        rt.on("agent/status", lambda event: None)
    with pytest.raises((RuntimeError, AgentDisposedError), match="this runtime is closed"):
        agent.on("agent/status", lambda event: None)


def test_session_event_listeners_see_every_committed_fact_in_order(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    seqs: list[int] = []
    agent.on("session/event", lambda e: seqs.append(e.event.seq))
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    assert seqs == list(range(len(agent.session.events())))


def test_status_changes_are_announced_only_on_real_changes(rt: Runtime) -> None:
    timeline = Timeline(rt)
    agent = rt.spawn(model=ScriptedModel.echo())
    for text in ("a", "b", "c"):
        agent.followup(text)
        assert agent.wait_idle(WAIT)
    statuses = [e.status for e in timeline.of("agent/status")]
    assert all(x != y for x, y in itertools.pairwise(statuses))
    assert statuses[0] == "running" and statuses[-1] == "idle"


def _seqs_by_agent(events: list[Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for event in events:
        out.setdefault(event.agent.id, []).append(event.event.seq)
    return out


def test_a_session_event_listener_added_after_turns_sees_every_later_fact_once(
    rt: Runtime,
) -> None:
    a = rt.spawn(model=ScriptedModel.echo())
    b = rt.spawn(model=ScriptedModel.echo())
    a.followup("before anyone listened")
    assert a.wait_idle(WAIT)
    first_new = {a.id: a.session.last_seq + 1, b.id: b.session.last_seq + 1}
    seen: list[Any] = []
    scoped: list[int] = []
    rt.on("session/event", seen.append)
    a.on("session/event", lambda e: scoped.append(e.event.seq))
    for agent in (a, b):
        agent.followup("after")
        assert agent.wait_idle(WAIT)
    by_agent = _seqs_by_agent(seen)
    for agent in (a, b):
        assert by_agent[agent.id] == list(range(first_new[agent.id], agent.session.last_seq + 1))
    assert scoped == by_agent[a.id]


def test_a_session_event_listener_keeps_seeing_an_agent_after_it_is_passivated(
    rt: Runtime,
) -> None:
    seen: list[Any] = []
    rt.on("session/event", seen.append)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("one")
    assert agent.wait_idle(WAIT)
    assert agent.passivate()
    agent.followup("two")  # rehydrates the agent from its log
    assert agent.wait_idle(WAIT)
    assert _seqs_by_agent(seen)[agent.id] == list(range(agent.session.last_seq + 1))


def test_the_default_runtime_has_one_worker_and_a_standby_one(rt: Runtime) -> None:
    stats = rt.dispatcher.statistics()
    assert (stats.workers, stats.standby) == (2, 1)


def test_close_with_a_timeout_does_not_wait_for_a_sync_tool_body_past_it(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt = Runtime.open(store_path)
    started, release, returned = threading.Event(), threading.Event(), threading.Event()

    @tool
    def stuck() -> str:
        started.set()
        release.wait(WAIT)
        returned.set()
        return "late"

    agent = rt.spawn(model=ScriptedModel([[ToolCall(name="stuck")], "after"]), tools=[stuck])
    agent.followup("go")
    assert started.wait(WAIT)
    try:
        with caplog.at_level(logging.WARNING, logger="corral.io"):
            rt.close(timeout=0.1)
        assert not returned.is_set()  # close returned while the body still ran
        assert "1 blocking call" in caplog.text
        # Its actor was stopped, not left registered with pykka (where it would finish
        # its turn on a closed runtime once the body returns).
        assert [r for r in ActorRegistry.get_all() if r.actor_class is AgentActor] == []
    finally:
        release.set()
    assert returned.wait(WAIT)
    # Its outcome is unknown, as after a crash mid-tool: the turn is left open, and a
    # resume repairs it.
    with Store.open(store_path) as store:
        assert_invariants(store.read(agent.id), allow_open_tail=True)
    with Runtime.open(store_path) as again:
        resumed = again.resume(agent.id, model=ScriptedModel.echo(), tools=[stuck])
        (result,) = [e.data for e in resumed.session.events() if e.type == "tool/result"]
        assert result.error.code == "TOOL_OUTCOME_UNKNOWN"
    check_store(store_path)


def test_close_with_a_timeout_gives_an_agent_blocked_in_a_sync_listener_only_what_is_left_of_it(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt = Runtime.open(store_path)
    entered, release = threading.Event(), threading.Event()

    def blocked(event: Any) -> None:
        if event.status == "running":
            entered.set()
            release.wait(WAIT)

    agent = rt.spawn(model=ScriptedModel.echo())
    agent.on("agent/status", blocked)
    message_id = agent.followup("go")
    assert entered.wait(WAIT)
    try:
        with caplog.at_level(logging.INFO):
            began = time.monotonic()
            rt.close(timeout=0.5)
            took = time.monotonic() - began
            # One deadline for the whole close (it took 6 s: 0.5 s for the disposals, 5 s
            # for the stuck actor's stop, 0.5 s more for the dispatcher).
            assert took < 0.5 + 3, took
            assert f"agent {agent.id} did not stop within 0.5 s" in caplog.text
            release.set()
            for thread in rt.dispatcher._threads:  # the blocked one ends its handler
                thread.join(WAIT)
                assert not thread.is_alive()
    finally:
        release.set()
    # The turn went on once the listener returned, over the closed store: the actor
    # stops quietly (it crashed with StoreClosedError, and its death watcher failed on
    # the stopped registry).
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert agent.crash is None
    ref = agent._slot.ref
    assert ref is not None and not ref.is_alive()
    # Nothing was logged after the close gave up: the message is still pending, for a
    # resume.
    with Store.open(store_path) as store:
        events = store.read(agent.id)
        assert_invariants(events, allow_open_tail=True)
        assert [m.id for m in pending_inbox(events)[0]] == [message_id]
    with Runtime.open(store_path) as again:
        resumed = again.resume(agent.id, model=ScriptedModel.echo())
        resumed.followup("again")
        assert resumed.wait_idle(WAIT)
    check_store(store_path)


def test_close_lets_the_async_agent_disposed_listeners_it_triggers_finish_within_its_timeout(
    store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt = Runtime.open(store_path)
    agents = [rt.spawn(model=ScriptedModel.echo()) for _ in range(10)]
    called: list[str] = []
    finished: list[str] = []

    async def on_disposed(event: Any) -> None:
        called.append(event.agent.id)
        await asyncio.sleep(0.2)  # its work: recording the agent's end somewhere, say
        finished.append(event.agent.id)

    rt.on("agent/disposed", on_disposed)
    with caplog.at_level(logging.WARNING):
        rt.close(timeout=WAIT)
    # Close cancelled them all (called 10 times, finished 0), or dropped those not
    # started yet, saying nothing.
    assert sorted(finished) == sorted(called) == sorted(a.id for a in agents)
    assert "listener" not in caplog.text
    check_store(store_path)


def test_a_spawn_under_way_when_close_begins_is_waited_for_and_stopped(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = Runtime.open(store_path)
    creating, go, closing = threading.Event(), threading.Event(), threading.Event()
    real_create = rt.store.create_session
    real_wait_for = rt._table.started.wait_for

    def create_session(session_id: str | None = None) -> Any:
        creating.set()
        assert go.wait(WAIT)
        return real_create(session_id)

    def wait_for(predicate: Any, timeout: float | None = None) -> Any:
        closing.set()  # close() waits here for the spawn under way
        return real_wait_for(predicate, timeout)

    monkeypatch.setattr(rt.store, "create_session", create_session)
    monkeypatch.setattr(rt._table.started, "wait_for", wait_for)
    spawned: list[Any] = []
    spawner = threading.Thread(target=lambda: spawned.append(rt.spawn(model=ScriptedModel.echo())))
    spawner.start()
    assert creating.wait(WAIT)
    closer = threading.Thread(target=rt.close)
    closer.start()
    assert closing.wait(WAIT)
    with pytest.raises(RuntimeError, match="closed"):
        rt.spawn(model=ScriptedModel.echo())  # no new start once close began
    go.set()
    spawner.join(WAIT)
    closer.join(WAIT)
    assert not closer.is_alive()
    (agent,) = spawned
    ref = agent._slot.ref
    assert ref is not None and not ref.is_alive()  # it used to run on past the close
    assert not rt._table.registry.is_alive()
    check_store(store_path)


def test_rt_flush_waits_for_the_sends_accepted_before_it(store_path: Path) -> None:
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        hold = HeldActor(agent)
        later = agent.followup("accepted")  # queued behind the held handler: not logged yet
        with pytest.raises(TimeoutError, match="not handled"):
            rt.flush(timeout=0.05)  # it cannot be appended while the actor is held
        flushed = threading.Event()
        waiter = threading.Thread(target=lambda: (asyncio.run(rt.aflush()), flushed.set()))
        waiter.start()  # asyncio code waits for the send too, off the event loop
        assert not flushed.is_set()
        hold.release()
        rt.flush(WAIT)
        waiter.join(WAIT)
        assert flushed.is_set()
        inserted = [
            m.id
            for e in agent.session.events()
            if e.type == "agent/inbox/spliced"
            for m in e.data.inserted
        ]
        assert later in inserted  # appended before the flush went to the store
        assert agent.wait_idle(WAIT)


def test_rt_flush_waits_for_a_cancel_told_before_it_to_discard_the_inbox(
    store_path: Path,
) -> None:
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        hold = HeldActor(agent)
        agent.cancel()  # clears the inbox durably: queued behind the held handler
        with pytest.raises(TimeoutError, match="not handled"):
            rt.flush(timeout=0.05)  # the discard cannot be appended while the actor is held
        hold.release()
        rt.flush(WAIT)
        events = agent.session.events()
        discards = [e.data for e in events if e.type == "agent/inbox/spliced" and e.data.outcome]
        assert [(d.target, d.removed_count) for d in discards] == [("next-step", 1)]
        assert pending_inbox(events) == ([], [])  # appended before the flush went to the store


def test_rt_flush_from_a_listener_does_not_wait_for_agents_that_need_its_thread(
    store_path: Path,
) -> None:
    with Runtime.open(store_path, threads=1) as rt:  # one worker: the listener's
        first, second = rt.spawn(model=ScriptedModel.echo()), rt.spawn(model=ScriptedModel.echo())
        flushed: list[object] = []

        def on_settled(event: Any) -> None:
            second.followup("queued on the busy worker")
            try:
                rt.flush(WAIT)  # the second agent's send waits for this very thread
                flushed.append("returned")
            except Exception as err:  # the test looks at it
                flushed.append(err)

        first.on("agent/settled", on_settled)
        first.followup("go")
        assert first.wait_idle(WAIT)
        assert second.wait_idle(WAIT)
        assert flushed == ["returned"]
        assert second.session.messages()[-1].content[0].text == "queued on the busy worker"


def test_a_script_that_exits_without_close_still_logs_what_it_sent(store_path: Path) -> None:
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from runtime import Runtime, ScriptedModel, ToolCall, tool
rt = Runtime.open({str(store_path)!r})
agent = rt.spawn(model=ScriptedModel.echo(), session_id="script")
agent.followup("one")
agent.wait_idle(10)
print(agent.followup("two, not waited for"))
"""  # no rt.close(): the interpreter's exit closes the runtime
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    last = done.stdout.split()[-1]
    with Store.open(store_path, readonly=True) as store:
        events = store.read("script")
    inserted = [m.id for e in events if e.type == "agent/inbox/spliced" for m in e.data.inserted]
    assert last in inserted  # it used to be lost with the process
    check_store(store_path)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_rt_close_from_a_listener_is_refused_and_the_runtime_goes_on(
    store_path: Path, kind: str
) -> None:
    outcome: list[object] = []
    tried = threading.Event()

    def close_it(rt: Runtime) -> None:
        try:
            rt.close()
            outcome.append("closed")
        except RuntimeError as err:
            outcome.append(err)
        tried.set()

    with Runtime.open(store_path) as rt:
        if kind == "sync":
            rt.on("agent/settled", lambda event: close_it(rt))
        else:

            async def on_settled(event: Any) -> None:
                close_it(rt)

            rt.on("agent/settled", on_settled)
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("one")
        assert tried.wait(WAIT)
        assert isinstance(outcome[0], RuntimeError), outcome  # it used to hang, then crash
        assert "dispatcher or I/O thread" in str(outcome[0])
        agent.followup("two")  # still open
        assert agent.wait_idle(WAIT)
    check_store(store_path)


@pytest.mark.parametrize("nth", [1, 2, 4, 5], ids=lambda n: f"thread {n} fails")
def test_an_open_that_fails_to_start_a_thread_leaves_nothing_running(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, nth: int
) -> None:
    # Before, Runtime.open(threads=1000000) failed with "can't start new thread" leaving
    # every thread it had started alive (22,639) and the GC thresholds raised for good.
    # The threads an open starts, in order: the log writer, the dispatcher's workers (3
    # here), the I/O loop.
    before, thresholds = set(threading.enumerate()), gc.get_threshold()
    start, calls = threading.Thread.start, [0]

    def start_or_fail(thread: threading.Thread) -> None:
        calls[0] += 1
        if calls[0] == nth:
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_or_fail)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        Runtime.open(store_path, threads=3)
    monkeypatch.undo()
    assert set(threading.enumerate()) == before
    assert gc.get_threshold() == thresholds
    with Runtime.open(store_path, threads=3) as rt:  # nothing was left open or locked
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("hi")
        assert agent.wait_idle(WAIT)


@pytest.mark.parametrize(
    "where",
    ["thread 1", "thread 2", "thread 4", "thread 5", "after the registry"],
)
def test_an_open_interrupted_by_ctrl_c_leaves_nothing_running(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # Before, a Ctrl-C in a thread's start() (the thread had started: start() waits
    # for it to run) left that thread running: the log writer's, a dispatcher worker
    # (never told to stop), the I/O loop ("Cannot close a running event loop" hid the
    # Ctrl-C); and one once the registry had started (in the retry policy, say) left
    # every thread, the registry and the GC tuning in place. Threads, in order: the
    # log writer, the dispatcher's workers (3 here), the I/O loop.
    before, thresholds = set(threading.enumerate()), gc.get_threshold()
    registered = set(ActorRegistry.get_all())
    if where.startswith("thread"):
        start, calls, nth = threading.Thread.start, [0], int(where.split()[1])

        def start_then_interrupt(thread: threading.Thread) -> None:
            calls[0] += 1
            start(thread)
            if calls[0] == nth:
                raise KeyboardInterrupt

        monkeypatch.setattr(threading.Thread, "start", start_then_interrupt)
    else:

        def interrupted(*_: object, **__: object) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr("runtime.runtime.RetryPolicy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Runtime.open(store_path, threads=3)
    monkeypatch.undo()
    assert set(threading.enumerate()) == before
    assert set(ActorRegistry.get_all()) == registered
    assert gc.get_threshold() == thresholds
    with Runtime.open(store_path, threads=3) as rt:  # nothing was left open or locked
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
    check_store(store_path)
