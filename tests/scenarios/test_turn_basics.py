"""Scenario tests of CONTRACT sections 1 and 4: a turn, in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import Reject, Runtime, ScriptedModel, ToolCall, tool
from storage.events import AssistantMessage, TextBlock, ToolMessage, UserMessage

from .conftest import WAIT, Timeline, check_store


def test_a_followup_runs_one_turn_in_the_contract_order(rt: Runtime, timeline: Timeline) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hello")
    assert agent.wait_idle(WAIT)
    timeline.wait_for("agent/status", 2)
    assert timeline.labels(agent=agent.id) == [
        "agent/created",
        "agent/session-start",
        "agent/inbox/spliced",
        "agent/inbox/inserted",
        "agent/status",
        "turn/start",
        "agent/inbox/spliced",
        "agent/inbox/claimed",
        "step/start",
        "user/message",
        "request/header",
        "assistant/chunk",
        "assistant/chunk",
        "assistant/chunk",
        "assistant/message",
        "step/end",
        "turn/end",
        "agent/settled",
        "agent/status",
    ]
    assert [e.status for e in timeline.of("agent/status")] == ["running", "idle"]


def test_the_echo_model_answers_with_the_last_user_text(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel.echo(chunks=3))
    mid = agent.followup("hello there")
    assert agent.wait_idle(WAIT)
    messages = agent.session.messages()
    assert isinstance(messages[0], UserMessage) and messages[0].id == mid
    assert messages[1] == AssistantMessage(content=(TextBlock(text="hello there"),))


def test_created_and_session_start_are_announced_at_spawn_and_the_agent_stays_idle(
    rt: Runtime, timeline: Timeline
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    assert timeline.labels(agent=agent.id) == ["agent/created", "agent/session-start"]
    assert timeline.of("agent/session-start")[0].source == "startup"
    assert agent.status == "idle"
    assert agent.session.events() == []


def test_two_queued_followups_run_two_turns_in_one_running_interval(
    rt: Runtime, timeline: Timeline
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo(latency=0.01))
    first = agent.followup("one")
    second = agent.followup("two")
    assert agent.wait_idle(WAIT)
    timeline.wait_for("agent/settled", 2)
    assert [e.status for e in timeline.of("agent/status")] == ["running", "idle"]
    claimed = timeline.of("agent/inbox/claimed")
    assert [(c.message.id, c.turn) for c in claimed] == [(first, 1), (second, 2)]
    assert [s.turn for s in timeline.of("agent/settled")] == [1, 2]


def test_a_tool_call_runs_the_tool_and_takes_another_step(rt: Runtime) -> None:
    seen: list[int] = []

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        seen.append(a + b)
        return a + b

    model = ScriptedModel([[ToolCall(name="add", arguments={"a": 2, "b": 3})], "five"])
    agent = rt.spawn(model=model, tools=[add])
    agent.followup("what is 2+3?")
    assert agent.wait_idle(WAIT)
    assert seen == [5]
    types = [e.type for e in agent.session.events()]
    assert types.count("step/start") == 2
    call = next(e for e in agent.session.events() if e.type == "tool/call")
    result = next(e for e in agent.session.events() if e.type == "tool/result")
    assert result.data.source_event_seqs == (call.seq,)
    assert result.data.message == ToolMessage(
        call_id=call.data.call_id, name="add", content=(TextBlock(text="5"),)
    )
    assert agent.session.messages()[-1] == AssistantMessage(content=(TextBlock(text="five"),))


def test_a_rejecting_pre_step_ends_the_turn_blocked_without_a_step(
    rt: Runtime, timeline: Timeline
) -> None:
    rt.on("agent/pre-step", lambda event, next_: Reject(reason="no"))
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    types = [e.type for e in agent.session.events()]
    assert "step/start" not in types
    end = next(e for e in agent.session.events() if e.type == "turn/end")
    assert end.data.reason.kind == "blocked"
    assert timeline.wait_for("agent/settled")[0].reason.kind == "blocked"


def test_request_messages_are_exactly_the_derived_history_at_dispatch(rt: Runtime) -> None:
    sent: list[object] = []

    def reply(request: object) -> str:
        sent.append(request)
        return "ok"

    agent = rt.spawn(model=ScriptedModel(reply))
    agent.followup("one")
    assert agent.wait_idle(WAIT)
    agent.followup("two")
    assert agent.wait_idle(WAIT)
    history = agent.session.messages()
    assert list(sent[0].messages) == history[:1]  # type: ignore[attr-defined]
    assert list(sent[1].messages) == history[:3]  # type: ignore[attr-defined]


def test_a_resumed_agent_continues_turn_numbers(store_path: Path) -> None:
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=ScriptedModel.echo(), session_id="a1")
        agent.followup("one")
        assert agent.wait_idle(WAIT)
    with Runtime.open(store_path) as rt:
        agent = rt.resume("a1", model=ScriptedModel.echo())
        assert agent.status == "idle"
        agent.followup("two")
        assert agent.wait_idle(WAIT)
        starts = [e.data.turn for e in agent.session.events() if e.type == "turn/start"]
        assert starts == [1, 2]


@pytest.mark.parametrize("source", ["startup", "resume"])
def test_session_start_is_announced_before_the_work_an_agent_created_listener_sends(
    store_path: Path, source: str
) -> None:
    # Before, agent/created ran on the registry's thread and session-start in the
    # spawning one after it returned: a followup sent by a created listener had its turn
    # claimed (or settled) before session-start (CONTRACT 2: created -> session-start,
    # and the agent does not start working at creation).
    if source == "resume":
        with Runtime.open(store_path) as rt:
            rt.spawn(model=ScriptedModel.echo(), session_id="a")
    with Runtime.open(store_path) as rt:
        timeline = Timeline(rt)
        rt.on("agent/created", lambda event: event.agent.followup("from created"))
        if source == "resume":
            agent = rt.resume("a", model=ScriptedModel.echo())
        else:
            agent = rt.spawn(model=ScriptedModel.echo())
        assert agent.wait_idle(WAIT)
        timeline.wait_for("agent/status", 2)
        live = [name for name in timeline.labels(agent=agent.id) if name in Timeline.NAMES]
        assert live == [
            "agent/created",
            "agent/session-start",
            "agent/inbox/inserted",
            "agent/status",
            "agent/inbox/claimed",
            "agent/settled",
            "agent/status",
        ]
        assert timeline.of("agent/session-start")[0].source == source
    check_store(store_path)
