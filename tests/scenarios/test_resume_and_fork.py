"""Scenario tests of resume, crash repair and fork (CONTRACT sections 2, 3, 7)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import (
    Runtime,
    ScriptedModel,
    ToolCall,
    tool,
)
from storage import assert_invariants
from storage.events import MessageTrigger, StepStart, ToolCallData, TurnStart
from storage.lmdb.store import Store

from .conftest import WAIT, HeldActor, Timeline, check_store


def test_a_resumed_session_with_pending_inbox_items_stays_idle_until_a_waking_send(
    store_path: Path,
) -> None:
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=ScriptedModel.echo(), session_id="s1")
        pending = agent.inject("pending context")
        assert agent.wait_idle(WAIT)
    with Runtime.open(store_path) as rt:
        timeline = Timeline(rt)
        agent = rt.resume("s1", model=ScriptedModel.echo())
        assert timeline.of("agent/session-start")[0].source == "resume"
        assert agent.inbox.ids() == [pending]
        assert agent.status == "idle"
        agent.followup("now")
        assert agent.wait_idle(WAIT)
        assert agent.inbox.ids() == []
    check_store(store_path)


def _crashed_mid_tool_call(store_path: Path) -> None:
    """A store whose session "crashed" ends with a tool/call: its turn and step are open."""
    with Store.open(store_path) as store:
        session = store.create_session("crashed")
        session.append_fact(TurnStart(turn=1, trigger=MessageTrigger()))
        session.append_fact(StepStart(turn=1, step=1))
        session.append_fact(
            ToolCallData(turn=1, step=1, call_id="c1", name="probe", arguments="{}")
        )
        store.flush()


def test_resume_repairs_an_interrupted_tail_turn_durably(store_path: Path) -> None:
    _crashed_mid_tool_call(store_path)
    with Runtime.open(store_path) as rt:
        agent = rt.resume("crashed", model=ScriptedModel.echo())
        types = [e.type for e in agent.session.events()]
        assert types[-3:] == ["tool/result", "step/end", "turn/end"]
        end = agent.session.events()[-1].data
        assert end.reason.kind == "interrupted"
        result = agent.session.events()[-3].data
        assert result.error.code in ("TOOL_NOT_STARTED", "TOOL_OUTCOME_UNKNOWN")
        agent.followup("again")
        assert agent.wait_idle(WAIT)
        starts = [e.data.turn for e in agent.session.events() if e.type == "turn/start"]
        assert starts == [1, 2]
    with Store.open(store_path) as store:
        assert [e.type for e in store.read("crashed")][3:6] == [
            "tool/result",
            "step/end",
            "turn/end",
        ]
        assert_invariants(store.read("crashed"))


def test_a_fork_child_continues_turn_numbers_without_the_parents_inbox(store_path: Path) -> None:
    with Runtime.open(store_path) as rt:
        parent = rt.spawn(model=ScriptedModel.echo(), session_id="parent")
        parent.followup("one")
        assert parent.wait_idle(WAIT)
        parent.inject("parent only")
        assert parent.wait_idle(WAIT)
        boundary = next(e.seq for e in parent.session.events() if e.type == "turn/end")
        child = rt.fork("parent", boundary, model=ScriptedModel.echo(), session_id="child")
        assert child.inbox.ids() == []
        child.followup("two")
        assert child.wait_idle(WAIT)
        starts = [e.data.turn for e in child.session.events() if e.type == "turn/start"]
        assert starts == [1, 2]
        assert len(child.session.messages()) == 4
    check_store(store_path)


def test_a_runtime_that_does_not_know_a_plugins_ignorable_type_forks_its_log_intact(
    store_path: Path,
) -> None:
    with Runtime.open(store_path) as rt:
        rt.store.register_event_type("plugin/note", ignorable=True)
        parent = rt.spawn(model=ScriptedModel.echo(), session_id="parent")
        for text in ("one", "two"):
            parent.session.append("plugin/note", {"before": text})
            parent.followup(text)
            assert parent.wait_idle(WAIT)
        boundary = max(e.seq for e in parent.session.events() if e.type == "turn/end")
    with Runtime.open(store_path) as rt:  # registers no plugin type
        child = rt.fork("parent", boundary, model=ScriptedModel.echo(), session_id="child")
        assert len(child.session.messages()) == 4
        child.followup("three")
        assert child.wait_idle(WAIT)
        starts = [e.data.turn for e in child.session.events() if e.type == "turn/start"]
        assert starts == [1, 2, 3]
    check_store(store_path)
    with Store.open(store_path, readonly=True) as store:
        store.register_event_type("plugin/note", ignorable=True)
        inherited = store.read("child", upper=boundary)
        assert inherited == store.read("parent", upper=boundary)
        assert [e.data for e in inherited if e.type == "plugin/note"] == [
            {"before": "one"},
            {"before": "two"},
        ]
        assert_invariants(store.read("child"))


def test_a_tool_turn_survives_a_restart_between_turns(store_path: Path) -> None:
    @tool
    def ping() -> str:
        return "pong"

    script = [[ToolCall(name="ping")], "done", [ToolCall(name="ping")], "done again"]
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=ScriptedModel(script[:2]), tools=[ping], session_id="t")
        agent.followup("one")
        assert agent.wait_idle(WAIT)
    with Runtime.open(store_path) as rt:
        agent = rt.resume("t", model=ScriptedModel(script[2:]), tools=[ping])
        agent.followup("two")
        assert agent.wait_idle(WAIT)
        assert [m.role for m in agent.session.messages()] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
    check_store(store_path)


_RESUME_THEN_DIE = """
import os, signal, sys
from runtime import Runtime, ScriptedModel
rt = Runtime.open(sys.argv[1])
rt.resume("crashed", model=ScriptedModel.echo())
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_session_event_listeners_see_the_facts_of_the_resumes_repair(store_path: Path) -> None:
    # Before, the repair was appended before the session was bridged: a live transcript
    # never saw the interrupted turn end.
    _crashed_mid_tool_call(store_path)
    with Runtime.open(store_path) as rt:
        live: list[int] = []
        rt.on("session/event", lambda event: live.append(event.event.seq))
        agent = rt.resume("crashed", model=ScriptedModel.echo())
        agent.followup("again")
        assert agent.wait_idle(WAIT)
        rt.flush()
        assert live == [e.seq for e in agent.session.events()][3:]  # all but the crashed part


def test_the_repair_is_durable_when_resume_returns(store_path: Path) -> None:
    # A process SIGKILLed right after rt.resume returned often left the log ending at
    # its tool/call (11 of 20 runs of a probe): the repair was appended, not flushed.
    for run in range(3):
        _crashed_mid_tool_call(store_path)
        child = subprocess.run(
            [sys.executable, "-c", _RESUME_THEN_DIE, str(store_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        with Store.open(store_path) as store:
            kinds = [e.type for e in store.read("crashed")]
            assert kinds[3:] == ["tool/result", "step/end", "turn/end"], f"run {run}"
        shutil.rmtree(store_path)
    # In process: nothing of the repair is left waiting for a flush.
    with Store.open(store_path) as store:
        session = store.create_session("crashed")
        session.append_fact(TurnStart(turn=1, trigger=MessageTrigger()))
        store.flush()
    with Runtime.open(store_path) as rt:
        agent = rt.resume("crashed", model=ScriptedModel.echo())
        assert agent.session.events()[-1].data.reason.kind == "interrupted"
        assert agent.session.resident_events == 0


def test_a_wait_idle_sent_right_after_a_kill_returns_once_the_agent_is_dead(
    store_path: Path,
) -> None:
    # Queued behind the kill, its request was dropped with the dead actor: it waited
    # out its whole timeout and returned False (found by a helper).
    from .models import GateModel

    with Runtime.open(store_path) as rt:
        model = GateModel()
        agent = rt.spawn(model=model)
        agent.followup("work")
        assert model.reached.wait(WAIT)
        agent.kill("chaos test")
        assert agent.wait_idle(WAIT)
        assert agent.crash is not None


def test_a_killed_agent_is_unregistered_and_resume_repairs_its_open_turn(store_path: Path) -> None:
    from .models import GateModel

    with Runtime.open(store_path) as rt:
        timeline = Timeline(rt)
        model = GateModel()
        agent = rt.spawn(model=model, session_id="victim")
        agent.followup("work")
        assert model.reached.wait(WAIT)
        agent.kill("chaos test")
        disposed = timeline.wait_for("agent/disposed")
        assert disposed[0].agent is agent
        assert agent.crash is not None and "chaos test" in str(agent.crash)
        rt.flush()
        revived = rt.resume("victim", model=ScriptedModel.echo())
        ends = [e.data.reason.kind for e in revived.session.events() if e.type == "turn/end"]
        assert ends == ["interrupted"]
        revived.followup("again")
        assert revived.wait_idle(WAIT)
        assert revived.session.messages()[-1].content[0].text == "again"
    check_store(store_path)


def test_a_kill_while_tools_run_leaves_the_step_open_and_resume_answers_every_call(
    store_path: Path,
) -> None:
    # The killed actor closed its turn coroutine, whose `finally` logged the step's
    # step/end with two calls unanswered: a log the resume could not repair (it answers
    # the calls of an open step only), and a history with calls that have no result.
    release = threading.Event()

    @tool(concurrency_safe=True)
    def slow(i: int) -> str:
        if i > 0:
            release.wait(WAIT)
        return "done"

    calls = [ToolCall(name="slow", arguments={"i": i}) for i in range(3)]
    try:
        with Runtime.open(store_path) as rt:
            timeline = Timeline(rt)
            agent = rt.spawn(model=ScriptedModel([calls]), tools=[slow], session_id="v")
            agent.followup("go")
            timeline.wait_for("tools/result")  # call 0 answered, calls 1 and 2 running
            agent.kill("chaos test")
            timeline.wait_for("agent/disposed")
            rt.flush()
            assert agent.session.events()[-1].type == "tool/result"  # nothing logged since
            revived = rt.resume("v", model=ScriptedModel(["after"]), tools=[slow])
            results = [e.data for e in revived.session.events() if e.type == "tool/result"]
            assert [r.message.call_id for r in results] == [
                call.call_id
                for call in revived.session.messages()[1].content  # type: ignore[union-attr]
            ]
            assert [r.error.code if r.error else None for r in results] == [
                None,
                "TOOL_OUTCOME_UNKNOWN",
                "TOOL_OUTCOME_UNKNOWN",
            ]
            revived.followup("again")
            assert revived.wait_idle(WAIT)
            release.set()  # the killed turn's bodies may end now: the close need not wait
    finally:
        release.set()
    check_store(store_path)


def test_a_send_queued_behind_a_crash_is_kept_for_the_resume(store_path: Path) -> None:
    with Runtime.open(store_path) as rt:
        timeline = Timeline(rt)
        agent = rt.spawn(model=ScriptedModel.echo(), session_id="victim")
        hold = HeldActor(agent)
        agent.kill("crash with mail queued")
        late = agent.followup("sent before the crash")  # behind the kill: never handled
        hold.release()
        assert timeline.wait_for("agent/disposed")
        rt.flush()
        revived = rt.resume("victim", model=ScriptedModel.echo())
        assert revived.inbox.ids() == [late, hold.message_id]  # it used to be lost
        revived.followup("wake")
        assert revived.wait_idle(WAIT)
        texts = [m.content[0].text for m in revived.session.messages() if m.role == "user"]
        assert texts == ["sent before the crash", "hold", "wake"]
    check_store(store_path)


def test_a_second_resume_of_a_session_while_the_first_runs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    with Runtime.open(path) as rt:
        agent_id = rt.spawn(model=ScriptedModel.echo()).id
    with Runtime.open(path) as rt:
        inside, go = threading.Event(), threading.Event()
        real_open = rt.store.open_session

        def open_session(session_id: str) -> Any:
            if not inside.is_set():  # the first resume waits in here
                inside.set()
                assert go.wait(WAIT)
            return real_open(session_id)

        monkeypatch.setattr(rt.store, "open_session", open_session)
        first: list[Any] = []
        resumer = threading.Thread(
            target=lambda: first.append(rt.resume(agent_id, model=ScriptedModel.echo()))
        )
        resumer.start()
        assert inside.wait(WAIT)
        with pytest.raises(ValueError, match="already in this runtime"):
            rt.resume(agent_id, model=ScriptedModel.echo())
        go.set()
        resumer.join(WAIT)
        (agent,) = first
        assert rt.get(agent_id) is agent  # still registered
        agent.followup("after both")  # its session takes appends: nothing reopened it
        assert agent.wait_idle(WAIT)
        assert [e.type for e in agent.session.events()][-1] == "turn/end"
    check_store(path)
