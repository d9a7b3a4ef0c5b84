"""Scenario tests of cancel, abort and dispose (CONTRACT sections 2, 3, 4)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from runtime import AgentDisposedError, HookCause, Runtime, ScriptedModel, UserCause
from storage.events import AssistantMessage, TextBlock

from .conftest import WAIT, Timeline
from .models import GateModel


def end_reasons(agent: object) -> list[object]:
    return [e.data.reason for e in agent.session.events() if e.type == "turn/end"]  # type: ignore[attr-defined]


def test_a_cancel_right_after_a_waking_send_closes_a_no_step_aborted_turn(
    rt: Runtime, timeline: Timeline
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hello")
    agent.cancel()
    assert agent.wait_idle(WAIT)
    types = [e.type for e in agent.session.events()]
    assert "turn/start" in types and "step/start" not in types
    assert [r.kind for r in end_reasons(agent)] == ["aborted"]
    assert end_reasons(agent)[0].reason == UserCause()
    settled = timeline.wait_for("agent/settled")
    assert settled[0].reason.kind == "aborted"


def test_a_cancel_right_after_a_waking_send_settles_only_once_its_turn_end_is_durable(
    rt: Runtime,
) -> None:
    # The turn's first effect (a checkpoint) resumes itself through the mailbox; the
    # cancel aborts it first, and that stale resume must not answer the settle's flush.
    seen: list[str] = []

    def on_settled(event: Any) -> None:
        seen.append(rt.store.read(event.agent.id)[-1].type)

    rt.on("agent/settled", on_settled)
    agent = rt.spawn(model=ScriptedModel.echo())
    for keep_inbox in (True, False):
        agent.followup("hello")
        agent.cancel(keep_inbox=keep_inbox)
        assert agent.wait_idle(WAIT)
    assert seen == ["turn/end", "turn/end"]


def test_an_async_listener_that_cancels_then_fails_ends_its_turn_aborted_and_the_agent_goes_on(
    rt: Runtime, timeline: Timeline
) -> None:
    # The listener's failure arrives after its cancel was handled: it must not be thrown
    # into whatever the turn awaits next (the settle's flush), which crashed the actor.
    agent = rt.spawn(model=ScriptedModel.echo())

    async def pre_step(event: Any, next_: Any) -> Any:
        if event.turn == 1:
            agent.cancel()
            raise RuntimeError("after the cancel")
        return await next_()

    agent.on("agent/pre-step", pre_step)
    agent.followup("one")
    settled = timeline.wait_for("agent/settled")
    assert settled[0].reason.kind == "aborted"
    agent.followup("two")
    assert timeline.wait_for("agent/settled", 2)[1].reason.kind == "completed"
    assert timeline.of("agent/disposed") == []


def test_cancel_mid_stream_keeps_the_visible_prefix_as_an_interrupted_message(rt: Runtime) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    agent.followup("go")
    assert model.reached.wait(WAIT)
    agent.cancel()
    assert agent.wait_idle(WAIT)
    assert model.cancelled.wait(WAIT) and model.closed.wait(WAIT)
    message = next(e for e in agent.session.events() if e.type == "assistant/message")
    assert message.data.interrupted is True
    assert message.data.message == AssistantMessage(content=(TextBlock(text="partial "),))
    chunks = [e.seq for e in agent.session.events() if e.type == "assistant/chunk"]
    assert message.data.source_event_seqs == tuple(chunks)
    assert [r.kind for r in end_reasons(agent)] == ["aborted"]


def test_the_first_cancel_cause_wins(rt: Runtime) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    agent.followup("go")
    assert model.reached.wait(WAIT)
    agent.cancel(HookCause(reason="first"))
    agent.cancel(UserCause())
    assert agent.wait_idle(WAIT)
    assert end_reasons(agent)[0].reason == HookCause(reason="first")


def test_cancel_without_keep_inbox_discards_pending_messages_durably_even_when_idle(
    rt: Runtime, timeline: Timeline
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    mid = agent.inject("later")
    agent.cancel()
    assert agent.wait_idle(WAIT)
    assert len(agent.inbox) == 0
    splices = [e.data for e in agent.session.events() if e.type == "agent/inbox/spliced"]
    assert splices[-1].outcome == "canceled" and splices[-1].removed_count == 1
    assert [d.message.id for d in timeline.of("agent/inbox/discarded")] == [mid]
    assert "turn/start" not in [e.type for e in agent.session.events()]


def test_cancel_with_keep_inbox_leaves_queued_work_parked(rt: Runtime) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    agent.followup("first")
    assert model.reached.wait(WAIT)
    queued = agent.followup("second")
    agent.cancel(keep_inbox=True)
    assert agent.wait_idle(WAIT)
    assert agent.inbox.ids() == [queued]
    assert [r.kind for r in end_reasons(agent)] == ["aborted"]


def test_dispose_discards_the_inbox_durably_and_announces_disposed_once(
    rt: Runtime, timeline: Timeline
) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    agent.followup("first")
    assert model.reached.wait(WAIT)
    agent.followup("queued")
    assert agent.dispose(WAIT)
    assert agent.dispose(WAIT)
    disposed = timeline.wait_for("agent/disposed")
    assert len(disposed) == 1 and disposed[0].agent is agent
    assert [r.kind for r in end_reasons(agent)] == ["aborted"]
    assert end_reasons(agent)[0].reason.kind == "disposed"
    assert len(agent.inbox) == 0
    with pytest.raises(AgentDisposedError, match="is disposed; a wake sent to it is refused"):
        agent.followup("too late")


def test_a_pre_step_listener_that_cancels_then_raises_ends_its_turn_aborted(
    rt: Runtime, timeline: Timeline
) -> None:
    # Abort is classified before error, as for the other hooks.
    agent = rt.spawn(model=ScriptedModel.echo())

    def pre_step(event: Any, next_: Any) -> Any:
        agent.cancel()
        raise RuntimeError("after the cancel")

    agent.on("agent/pre-step", pre_step)
    agent.followup("hi")
    settled = timeline.wait_for("agent/settled")
    assert settled[0].reason.kind == "aborted"
    assert timeline.of("agent/error") == []


def _statuses(timeline: Timeline) -> list[str]:
    return [e.status for e in timeline.of("agent/status")]


def test_a_followup_from_a_sync_settled_listener_keeps_the_agent_running_into_the_next_turn(
    rt: Runtime, timeline: Timeline
) -> None:
    # CONTRACT 1: no idle between a turn and the next queued one. Before, the chain
    # decided before the listener's followup landed: running, idle, running, idle.
    agent = rt.spawn(model=ScriptedModel.echo())

    def once(event: Any) -> None:
        if event.turn == 1:
            agent.followup("second")

    agent.on("agent/settled", once)
    agent.followup("first")
    timeline.wait_for("agent/settled", 2)
    assert agent.wait_idle(WAIT)
    assert _statuses(timeline) == ["running", "idle"]


def test_a_followup_from_a_sync_settled_listener_after_an_aborted_turn_keeps_the_agent_running(
    rt: Runtime, timeline: Timeline
) -> None:
    # CONTRACT 4: after `aborted` queued work stays parked until the next waking send;
    # the listener's followup is that send, and CONTRACT 1 wants no idle before its turn.
    # Before, the chain did not let it land after an aborted turn: running, idle, running.
    model = GateModel()
    agent = rt.spawn(model=model)

    def once(event: Any) -> None:
        if event.turn == 1:
            assert event.reason.kind == "aborted"
            agent.followup("second")

    agent.on("agent/settled", once)
    agent.followup("first")
    assert model.wait_reached(1)
    agent.cancel()
    assert model.wait_reached(2)  # the followup's turn reached the model
    model.release()
    settled = timeline.wait_for("agent/settled", 2)
    assert [e.reason.kind for e in settled] == ["aborted", "completed"]
    assert agent.wait_idle(WAIT)
    assert _statuses(timeline) == ["running", "idle"]


def test_a_cancel_from_a_settled_listener_aborts_the_turn_its_followup_opens(
    rt: Runtime, timeline: Timeline
) -> None:
    # As a cancel right after a waking send (CONTRACT 4): the followup's turn opens and
    # ends aborted with no step; what is queued behind it stays parked.
    agent = rt.spawn(model=ScriptedModel.echo())
    queued: list[str] = []

    def on_settled(event: Any) -> None:
        if event.turn == 1:
            queued.append(agent.followup("second"))
            queued.append(agent.followup("third"))
            agent.cancel(keep_inbox=True)

    agent.on("agent/settled", on_settled)
    agent.followup("first")
    assert agent.wait_idle(WAIT)
    settled = [(s.turn, s.reason.kind) for s in timeline.of("agent/settled")]
    assert settled == [(1, "completed"), (2, "aborted")]
    assert [e.data.turn for e in agent.session.events() if e.type == "step/start"] == [1]
    assert agent.inbox.ids() == queued[1:]
    assert _statuses(timeline) == ["running", "idle"]


def test_a_cancel_handled_between_two_turns_of_a_chain_aborts_the_next_one_before_its_step(
    rt: Runtime, timeline: Timeline
) -> None:
    # The cancel lands while turn 1 settles (sent from another thread by an observer of
    # its turn/end), with followups queued during turn 1. Before, the cancel hit the
    # next turn wherever it was: its user/message was entered, then it was aborted.
    agent = rt.spawn(model=ScriptedModel.echo())
    queued: list[str] = []

    def on_request(event: Any, next_: Any) -> Any:
        if not queued:
            queued.append(agent.followup("second"))
            queued.append(agent.followup("third"))
        return next_()

    def on_event(event: Any) -> None:
        if event.event.type == "turn/end" and event.event.data.turn == 1:
            canceller = threading.Thread(target=agent.cancel, kwargs={"keep_inbox": True})
            canceller.start()
            canceller.join()

    agent.on("agent/request", on_request)
    agent.on("session/event", on_event)
    agent.followup("first")
    assert agent.wait_idle(WAIT)
    settled = [(s.turn, s.reason.kind) for s in timeline.of("agent/settled")]
    assert settled == [(1, "completed"), (2, "aborted")]
    users = [m.content[0].text for m in agent.session.messages() if m.role == "user"]
    assert users == ["first"]
    assert agent.inbox.ids() == queued[1:]
