"""Scenario tests of resume, crash repair and fork (CONTRACT sections 2, 3, 7)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pykka import ActorRef
from pykka.messages import _ActorStop

from actors.agent import AwaitIdle, Cancel, Edit, Insert, Quiescent
from runtime import (
    Agent,
    AgentDisposedError,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolCall,
    UserMessage,
    tool,
)
from storage import assert_invariants, pending_inbox
from storage.events import DisposedCause, MessageTrigger, StepStart, ToolCallData, TurnStart
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


def test_the_agents_mailbox_is_its_inbox(rt: Runtime) -> None:
    from actors.agent import AgentMailbox

    agent = rt.spawn(model=ScriptedModel.echo())
    mid = agent.inject("pending")
    assert agent.wait_idle(WAIT)
    mailbox = agent._slot.ref.actor_inbox  # type: ignore[union-attr]
    assert isinstance(mailbox, AgentMailbox)
    assert mailbox.pending_messages().ids() == [mid] == agent.inbox.ids()


def test_a_passivated_agent_drops_its_session_and_its_next_send_rehydrates_it(
    store_path: Path,
) -> None:
    import gc
    import weakref

    with Runtime.open(store_path) as rt:
        timeline = Timeline(rt)
        agent = rt.spawn(model=ScriptedModel.echo(), session_id="sleepy")
        agent.followup("one")
        assert agent.wait_idle(WAIT)
        pending = agent.inject("kept while passive")
        assert agent.wait_idle(WAIT)
        old_session = weakref.ref(agent.session)
        assert agent.passivate()
        assert agent.passive and agent.status == "idle"
        gc.collect()
        assert old_session() is None, "the in-memory session was evicted"
        agent.followup("two")  # rehydrates from the log
        assert not agent.passive
        assert agent.wait_idle(WAIT)
        starts = [e.data.turn for e in agent.session.events() if e.type == "turn/start"]
        assert starts == [1, 2]
        claimed = [e.message.id for e in timeline.of("agent/inbox/claimed")]
        assert pending in claimed
        assert rt.get("sleepy") is agent
        assert [e.agent.id for e in timeline.of("agent/created")] == ["sleepy"]
    check_store(store_path)


def test_a_busy_agent_is_not_passivated(rt: Runtime) -> None:
    from .models import GateModel

    gate = GateModel()
    agent = rt.spawn(model=gate)
    agent.followup("busy")
    assert gate.reached.wait(WAIT)
    assert agent.passivate() is False
    gate.release(0)
    assert agent.wait_idle(WAIT)
    assert rt.passivate_idle() == 1
    assert agent.passive
    assert rt.passivate_idle() == 0  # it was passive already
    assert agent.dispose(WAIT)  # a passive agent disposes (its inbox durably discarded)


class _SpyLock:
    """An agent's live lock that says when a thread has to wait for it."""

    def __init__(self, inner: Any, contended: threading.Event) -> None:
        self._inner = inner
        self._contended = contended

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._inner.acquire(False):
            return True
        if not blocking:
            return False
        self._contended.set()
        return bool(self._inner.acquire(True, timeout))

    def release(self) -> None:
        self._inner.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _call_racing_a_passivation(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, call: Callable[[Agent], Any]
) -> tuple[Runtime, Agent, Any]:
    """Run ``call(agent)`` from another thread at the worst moment for it: a passivation
    found the agent idle and asked its actor to stop, and the only dispatcher worker is
    held (by another agent's listener) so the stop is not handled yet. Returns what the
    call returned (or raised), once the worker is let go and the call ended."""
    rt = Runtime.open(store_path, threads=1)  # one worker, no standby: holding it holds all
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("one")
    assert agent.wait_idle(WAIT)
    agent.inject("pending")  # what a cancel or a remove must discard
    assert agent.wait_idle(WAIT)
    blocker, held, gate = rt.spawn(model=ScriptedModel.echo()), threading.Event(), threading.Event()

    def hold_the_worker(event: Any) -> None:
        held.set()
        gate.wait(WAIT)

    blocker.on("agent/settled", hold_the_worker)
    stop_queued, reached = threading.Event(), threading.Event()
    agent._slot.lock = _SpyLock(agent._slot.lock, reached)  # type: ignore[assignment]
    real_ask, agent_ref = ActorRef.ask, agent._slot.ref

    def ask(self: ActorRef[Any], message: Any, **kwargs: Any) -> Any:
        if self is agent_ref and isinstance(message, _ActorStop) and not stop_queued.is_set():
            blocker.followup("hold the worker")
            assert held.wait(WAIT)
            future = real_ask(self, message, **kwargs)  # queued; the held worker cannot run it
            stop_queued.set()
            return future
        if self is agent_ref and isinstance(message, Edit):
            reached.set()
        return real_ask(self, message, **kwargs)

    real_tell = ActorRef.tell

    def tell(self: ActorRef[Any], message: Any) -> None:
        if self is agent_ref and isinstance(message, Cancel | AwaitIdle):
            reached.set()  # told the old actor, behind its stop
        real_tell(self, message)

    monkeypatch.setattr(ActorRef, "ask", ask)
    monkeypatch.setattr(ActorRef, "tell", tell)
    passivating = threading.Thread(target=agent.passivate)
    passivating.start()
    assert stop_queued.wait(WAIT)
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call(agent))
        except Exception as err:  # the test looks at it
            outcome.append(err)

    caller = threading.Thread(target=run)
    caller.start()
    assert reached.wait(WAIT)  # the call waits for the passivation, or told the old actor
    gate.set()
    passivating.join(WAIT)
    caller.join(2 * WAIT)
    assert not caller.is_alive()
    return rt, agent, outcome[0]


@pytest.mark.parametrize("verb", ["dispose", "cancel", "wait_idle", "remove"])
def test_a_verb_sent_while_a_passivation_stops_the_agent_is_not_lost(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    calls: dict[str, Callable[[Agent], Any]] = {
        "dispose": lambda agent: agent.dispose(timeout=WAIT),
        "cancel": lambda agent: agent.cancel(),
        "wait_idle": lambda agent: agent.wait_idle(timeout=WAIT),
        "remove": lambda agent: agent.remove(agent.inbox.ids()[0]),
    }
    rt, agent, result = _call_racing_a_passivation(store_path, monkeypatch, calls[verb])
    try:
        assert not isinstance(result, Exception), result
        if verb == "dispose":
            assert result is True
            assert agent.id not in [a.id for a in rt.agents()]
        elif verb == "wait_idle":
            assert result is True
        else:  # the pending message is discarded, durably (a cancel is told: wait for it)
            assert agent.wait_idle(WAIT)
            assert agent.inbox.ids() == []
            spliced = [e.data for e in agent.session.events() if e.type == "agent/inbox/spliced"]
            assert spliced[-1].removed_count == 1
    finally:
        rt.close()
    check_store(store_path)


def test_a_send_that_passed_its_check_before_a_dispose_is_refused_once_it_gets_the_lock(
    rt: Runtime,
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    contended = threading.Event()
    lock = agent._slot.lock
    agent._slot.lock = _SpyLock(lock, contended)  # type: ignore[assignment]
    outcome: list[Any] = []

    def send() -> None:
        try:
            outcome.append(agent.followup("late"))
        except Exception as err:  # the test looks at it
            outcome.append(err)

    with lock:  # as a disposal holds it while it tells its messages
        sender = threading.Thread(target=send)
        sender.start()
        assert contended.wait(WAIT)  # the send passed its first check and waits
        with agent._slot.dispose_lock:
            agent._slot.disposing = True  # what dispose() does first
    sender.join(WAIT)
    assert isinstance(outcome[0], AgentDisposedError), outcome
    assert [e.type for e in agent.session.events()] == []  # nothing was written
    agent._slot.disposing = False  # the disposal the test stood in for, for real
    assert agent.dispose(WAIT)


def test_a_wake_that_reaches_the_actor_after_its_disposal_began_starts_no_turn(
    rt: Runtime,
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("one")
    assert agent.wait_idle(WAIT)
    ref = agent._slot.ref
    assert ref is not None and agent._slot.inbox is not None
    ref.tell(Cancel(cause=DisposedCause(), keep_inbox=False))  # a disposal's first message
    late = UserMessage(id="late", content=[TextBlock(text="too late")])
    agent._slot.inbox.reserve(late.id)  # as a send that raced the disposal does
    ref.tell(Insert(lane="next-turn", message=late, wake=True, unwinding=False))
    done = threading.Event()
    ref.tell(AwaitIdle(callback=done.set))
    assert done.wait(WAIT)
    types = [e.type for e in agent.session.events()]
    assert types.count("turn/start") == 1, "the late wake started a turn"
    assert agent.inbox.ids() == ["late"]  # kept, durably: a resume would run it
    assert types[-1] == "agent/inbox/spliced"


def test_a_splice_sent_while_a_disposal_waits_for_the_agent_is_refused(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    hold = HeldActor(agent, "held")
    assert not agent.dispose(timeout=0)  # begun: its cancel waits behind the listener
    with pytest.raises(AgentDisposedError):
        agent.splice("next-step", 0, 0, ["late"])  # was queued behind the disposal's cancel
    with pytest.raises(AgentDisposedError):
        agent.replace(hold.message_id, "late")
    hold.release()
    assert agent.dispose(WAIT)
    events = agent.session.events()
    assert pending_inbox(events) == ([], [])  # the disposal discarded it all, durably
    texts = [
        m.content[0].text
        for e in events
        if e.type == "agent/inbox/spliced"
        for m in e.data.inserted
    ]
    assert texts == ["held"]


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


_OWN_VERBS: dict[str, Callable[[Agent], Any]] = {
    "steer": lambda agent: agent.steer("more"),
    "splice": lambda agent: agent.splice("next-step", 0, 0, ["more"]),
}


@pytest.mark.parametrize("verb", list(_OWN_VERBS))
def test_a_listener_that_sends_to_its_own_agent_while_it_is_being_passivated_goes_on(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    asked, passivated, sent = threading.Event(), threading.Event(), threading.Event()
    outcome: list[Any] = []
    real_tell = ActorRef.tell

    def tell(self: ActorRef[Any], message: Any) -> None:
        real_tell(self, message)
        if isinstance(message, Quiescent):
            asked.set()  # queued behind the listener's handler, which is running

    monkeypatch.setattr(ActorRef, "tell", tell)

    def passivate() -> None:
        try:
            outcome.append(agent.passivate(timeout=WAIT))
        except Exception as err:  # the test looks at it
            outcome.append(err)
        outcome.append(sent.is_set())  # the verb did not wait for the passivation
        passivated.set()

    def on_settled(event: Any) -> None:
        if event.turn != 1:
            return
        threading.Thread(target=passivate).start()
        assert asked.wait(WAIT)  # the passivation holds the agent's live lock and waits
        _OWN_VERBS[verb](agent)  # from the agent's own actor: must not wait for it
        sent.set()

    agent.on("agent/settled", on_settled)
    agent.followup("one")
    assert passivated.wait(2 * WAIT)
    # No Timeout, and no wait: the verb was done before the passivation gave up; the new
    # message goes on the chain as its next turn, so the agent was busy, not idle.
    assert outcome == [False, True], outcome
    assert agent.wait_idle(WAIT)
    starts = [e.data.turn for e in agent.session.events() if e.type == "turn/start"]
    assert starts == [1, 2]


def test_passivate_from_the_agents_own_listener_answers_busy_without_waiting_for_itself(
    rt: Runtime,
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    answered = threading.Event()
    answers: list[bool] = []

    def on_settled(event: Any) -> None:
        answers.append(event.agent.passivate(timeout=None))  # no timeout: it used to hang
        answered.set()

    agent.on("agent/settled", on_settled)
    agent.followup("one")
    assert answered.wait(WAIT)
    assert answers == [False]  # busy: running this listener
    assert agent.wait_idle(WAIT)
    assert agent.passivate()  # from outside, once idle
