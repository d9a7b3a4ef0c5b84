"""Scenario tests of passivation (an idle agent evicted from memory and rebuilt from its
log by its next use) and of verbs that race a passivation or a disposal: none is lost,
none reaches an actor that is being stopped, none starts work on a disposed agent."""

from __future__ import annotations

import re
import threading
import time
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
    UserMessage,
)
from storage import pending_inbox
from storage.events import DisposedCause

from .conftest import WAIT, HeldActor, Timeline, check_store


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
        evicted = threading.Event()
        weakref.finalize(agent.session, evicted.set)
        assert agent.passivate()
        assert agent.passive and agent.status == "idle"
        # The writer may still hold the session for a flush completion in flight (it lets
        # go when that completion runs): the session must be freed, if not at once.
        deadline = time.monotonic() + WAIT
        while not evicted.is_set() and time.monotonic() < deadline:
            gc.collect()
            evicted.wait(0.05)
        assert evicted.is_set(), "the in-memory session was evicted"
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
        assert agent._slot.begin_disposing()  # what dispose() does first
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
    refused = f"agent {agent.id} is disposed; a {{}} inserting messages sent to it is refused"
    with pytest.raises(AgentDisposedError, match=re.escape(refused.format("splice"))):
        agent.splice("next-step", 0, 0, ["late"])  # was queued behind the disposal's cancel
    with pytest.raises(AgentDisposedError, match=re.escape(refused.format("replace"))):
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
