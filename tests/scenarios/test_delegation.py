"""agent_tool: a tool a child agent answers; a cancel at the top reaches every child."""

from __future__ import annotations

import json

import pytest

from runtime import (
    Aborted,
    ParentCause,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolResultData,
    TurnEnd,
    UserCause,
    agent_tool,
)

from .conftest import WAIT
from .models import GateModel


def results(agent_session: object) -> list[dict[str, str]]:
    events = agent_session.events()  # type: ignore[attr-defined]
    return [
        json.loads(e.data.message.content[0].text)
        for e in events
        if isinstance(e.data, ToolResultData) and e.data.error is None
    ]


def ends(rt: Runtime, session_id: str) -> list[object]:
    session = rt.store.open_session(session_id)
    return [e.data.reason for e in session.events() if isinstance(e.data, TurnEnd)]


def test_a_planner_gets_its_workers_replies_and_their_session_ids(rt: Runtime) -> None:
    worker = agent_tool(rt, name="worker", model=ScriptedModel(lambda r: "worked"))
    planner = rt.spawn(
        model=ScriptedModel(
            [[ToolCall("worker", {"task": "a"}), ToolCall("worker", {"task": "b"})], "done"]
        ),
        tools=[worker],
    )
    reply = planner.ask("plan", timeout=WAIT)
    assert reply.ok and reply.text == "done"
    found = results(planner.session)
    assert [r["reply"] for r in found] == ["worked", "worked"]
    assert all(r["reason"] == "completed" for r in found)
    children = [r["session"] for r in found]
    assert len(set(children)) == 2
    for child in children:  # each child's own log holds its task and answer
        session = rt.store.open_session(child)
        assert [type(m).__name__ for m in session.derive_messages()] == [
            "UserMessage",
            "AssistantMessage",
        ]
    worker.close()


def test_a_kept_child_answers_every_call_of_its_parent(rt: Runtime) -> None:
    helper = agent_tool(rt, name="helper", model=ScriptedModel.echo(), keep=True)
    parent = rt.spawn(
        model=ScriptedModel(
            [[ToolCall("helper", {"task": "one"})], [ToolCall("helper", {"task": "two"})], "ok"]
        ),
        tools=[helper],
    )
    assert parent.ask("go", timeout=WAIT).ok
    found = results(parent.session)
    assert [r["reply"] for r in found] == ["one", "two"]
    assert found[0]["session"] == found[1]["session"]
    helper.close()


def test_a_delegation_tree_of_depth_two_is_cancelled_from_the_top(rt: Runtime) -> None:
    gate = GateModel()
    leaf = agent_tool(rt, name="leaf", model=gate)
    middle = agent_tool(
        rt,
        name="middle",
        model=ScriptedModel([[ToolCall("leaf", {"task": "deep"})], "unused"]),
        tools=[leaf],
    )
    assert middle.depth == 2
    top = rt.spawn(
        model=ScriptedModel([[ToolCall("middle", {"task": "mid"})], "unused"]), tools=[middle]
    )
    pending = top.submit("start")
    assert gate.wait_reached(1)  # the grandchild's request is in flight
    top.cancel(UserCause())
    reply = pending.result(WAIT)
    assert isinstance(reply.reason, Aborted) and reply.reason.reason == UserCause()
    (middle_result,) = results(top.session)
    assert middle_result["reason"] == "aborted"
    middle_id = middle_result["session"]
    assert ends(rt, middle_id) == [Aborted(reason=ParentCause())]
    middle_session = rt.store.open_session(middle_id)
    (leaf_result,) = results(middle_session)
    assert leaf_result["reason"] == "aborted"
    assert ends(rt, leaf_result["session"]) == [Aborted(reason=ParentCause())]
    assert gate.closed.wait(WAIT)  # the grandchild's model call was cancelled
    for tool in (leaf, middle):
        tool.close()


def test_a_tree_deeper_than_max_depth_is_refused(rt: Runtime) -> None:
    one = agent_tool(rt, name="one", model=ScriptedModel.echo())
    two = agent_tool(rt, name="two", model=ScriptedModel.echo(), tools=[one])
    with pytest.raises(ValueError, match="nest 3 levels deep, over max_depth=2"):
        agent_tool(rt, name="three", model=ScriptedModel.echo(), tools=[two], max_depth=2)
    for tool in (one, two):
        tool.close()
