"""Limits, so one agent cannot take the process down (issue 7, CONTRACT-compatible ends)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import (
    EditTimeoutError,
    InboxFullError,
    Runtime,
    ScriptedModel,
    ToolCall,
    UsageLimits,
    tool,
)

from .conftest import WAIT, HeldActor, Timeline, check_store
from .models import GateModel


def ends(agent: Any) -> list[Any]:
    return [e.data.reason for e in agent.session.events() if e.type == "turn/end"]


def test_a_full_inbox_refuses_a_send_with_a_clear_error(store_path: Path) -> None:
    with Runtime.open(store_path, inbox_limit=2) as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.inject("a")
        agent.inject("b")
        with pytest.raises(InboxFullError, match="limit"):
            agent.inject("c")
        assert agent.wait_idle(WAIT)
        assert len(agent.inbox) == 2
    check_store(store_path)


def test_a_replace_or_a_one_for_one_splice_fits_an_inbox_at_its_limit(store_path: Path) -> None:
    # The new id was counted before the old one was removed: a full inbox refused them.
    with Runtime.open(store_path, inbox_limit=2) as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        first = agent.inject("a")
        agent.inject("b")
        replaced = agent.replace(first, "a2")
        (removed,) = agent.splice("next-step", 0, 1, ["a3"])
        assert removed.id == replaced
        agent.splice("next-step", 0, 2, ["c", "d"])
        with pytest.raises(InboxFullError, match="limit"):
            agent.splice("next-step", 2, 0, ["e"])  # one more
        with pytest.raises(InboxFullError, match="limit"):
            agent.splice("next-step", 0, 1, ["e", "f"])  # two for one
        with pytest.raises(InboxFullError, match="limit"):
            agent.inject("e")
        assert [m.content[0].text for m in agent.inbox.next_step] == ["c", "d"]
        # a replace of a message whose send is still queued to the actor fits too
        agent.clear()
        held = HeldActor(agent)
        queued = agent.inject("queued")
        with pytest.raises(
            EditTimeoutError, match="was not applied within 0 s; it stays queued"
        ):  # applied once the actor is released
            agent.replace(queued, "queued2", timeout=0)
        held.release()
        assert agent.wait_idle(WAIT)
        assert [m.content[0].text for m in agent.inbox.next_step] == ["hold", "queued2"]
    check_store(store_path)


def test_a_turn_stops_at_max_steps_with_a_limit_reason(store_path: Path) -> None:
    @tool
    def again() -> str:
        return "more"

    forever = ScriptedModel(lambda request: [ToolCall(name="again")])
    with Runtime.open(store_path, max_steps=3) as rt:
        agent = rt.spawn(model=forever, tools=[again])
        agent.followup("loop")
        assert agent.wait_idle(WAIT)
        steps = [e.data.step for e in agent.session.events() if e.type == "step/start"]
        assert steps == [1, 2, 3]
        reason = ends(agent)[0]
        assert (reason.kind, reason.limit) == ("limit", "max_steps")
    check_store(store_path)


@pytest.mark.parametrize("limit", ["max_steps", "max_requests"])
def test_a_steer_sent_during_the_last_allowed_step_is_not_claimed_and_stays_pending(
    store_path: Path, limit: str
) -> None:
    # Before, it was claimed after the step (a durable claim, a live claimed event) and
    # the limit then ended the turn: the message was neither entered nor pending.
    options: dict[str, Any] = (
        {"max_steps": 1} if limit == "max_steps" else {"agent_limits": UsageLimits(max_requests=1)}
    )
    model = GateModel()
    with Runtime.open(store_path, **options) as rt:
        timeline = Timeline(rt)
        agent = rt.spawn(model=model)
        agent.followup("first")
        assert model.reached.wait(WAIT)
        steered = agent.steer("steer during the last step")
        model.release(0)
        assert timeline.wait_for("agent/settled")[0].reason.kind == "limit"
        assert agent.wait_idle(WAIT)
        assert [c.message.id for c in timeline.of("agent/inbox/claimed")] != [] and all(
            c.message.id != steered for c in timeline.of("agent/inbox/claimed")
        )
        assert agent.inbox.ids() == [steered]
    check_store(store_path)


def test_an_agent_request_limit_ends_the_turn_before_the_next_request(store_path: Path) -> None:
    @tool
    def again() -> str:
        return "more"

    model = ScriptedModel(lambda request: [ToolCall(name="again")])
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=model, tools=[again], limits=UsageLimits(max_requests=2))
        agent.followup("loop")
        assert agent.wait_idle(WAIT)
        assert model.requests == 2
        reason = ends(agent)[0]
        assert reason.limit == "requests" and "2 model requests" in reason.message
        agent.followup("again")  # still over the limit: the next turn ends at once
        assert agent.wait_idle(WAIT)
        assert model.requests == 2
        assert [r.kind for r in ends(agent)] == ["limit", "limit"]
    check_store(store_path)


def test_a_runtime_token_limit_is_shared_by_every_agent(store_path: Path) -> None:
    with Runtime.open(store_path, limits=UsageLimits(max_tokens=5)) as rt:
        first = rt.spawn(model=ScriptedModel.echo())
        first.followup("a long question that uses many tokens " * 4)
        assert first.wait_idle(WAIT)
        second = rt.spawn(model=ScriptedModel.echo())
        second.followup("hi")
        assert second.wait_idle(WAIT)
        reason = ends(second)[0]
        assert (reason.kind, reason.limit) == ("limit", "tokens")
        assert "the runtime" in reason.message
    check_store(store_path)


def _one_holds_the_only_place(rt: Runtime, gate: GateModel) -> tuple[Any, Any]:
    """Two agents of a runtime with ``max_running_turns=1``: the first holds the only
    place (its model waits at ``gate``), the second is idle."""
    busy = rt.spawn(model=gate)
    other = rt.spawn(model=ScriptedModel.echo())
    busy.followup("hold the only place")
    assert gate.reached.wait(WAIT)
    return busy, other


def _the_place_is_free(rt: Runtime) -> None:
    """A new agent's turn runs: the place was given back."""
    third = rt.spawn(model=ScriptedModel.echo())
    third.followup("the place was given back")
    assert third.wait_idle(WAIT)
    assert ends(third)[0].kind == "completed"


def test_beyond_max_running_turns_work_waits_and_then_runs(store_path: Path) -> None:
    gate = GateModel()
    with Runtime.open(store_path, max_running_turns=1) as rt:
        timeline = Timeline(rt)
        busy, waiting = _one_holds_the_only_place(rt, gate)
        waiting.followup("wait for it")
        assert not waiting.wait_idle(0.2)  # queued for a place: not idle, no turn yet
        assert [e.type for e in waiting.session.events()].count("turn/start") == 0
        gate.release(0)
        assert waiting.wait_idle(WAIT)
        assert busy.wait_idle(WAIT)
        assert [s.agent.id for s in timeline.wait_for("agent/settled", 2)] == [busy.id, waiting.id]
        assert ends(waiting)[0].kind == "completed"
    check_store(store_path)


def test_a_cancel_while_queued_for_a_place_leaves_the_queue(store_path: Path) -> None:
    gate = GateModel()
    with Runtime.open(store_path, max_running_turns=1) as rt:
        busy, queued = _one_holds_the_only_place(rt, gate)
        queued.followup("never mind")
        queued.cancel()
        assert queued.wait_idle(WAIT)
        assert len(queued.inbox) == 0
        gate.release(0)
        assert busy.wait_idle(WAIT)
        _the_place_is_free(rt)
    check_store(store_path)


def test_an_agent_killed_while_queued_for_a_place_does_not_keep_it(store_path: Path) -> None:
    # Its queued admission stayed in the queue: the place was later handed to the dead
    # actor, and every later turn of the runtime waited behind it for good.
    gate = GateModel()
    with Runtime.open(store_path, max_running_turns=1) as rt:
        timeline = Timeline(rt)
        busy, queued = _one_holds_the_only_place(rt, gate)
        queued.followup("wait for a place")
        rt.flush()  # the followup was handled: the agent is queued for the place
        queued.kill("chaos test")
        timeline.wait_for("agent/disposed")
        gate.release(0)
        assert busy.wait_idle(WAIT)
        _the_place_is_free(rt)


def test_a_cancel_sent_before_the_place_is_handed_over_wins_even_if_handled_after(
    store_path: Path,
) -> None:
    # The cancel found the admission gone from the queue (handed over, its resume on the
    # way behind the cancel) and did nothing: the parked turn ran after all.
    gate = GateModel()
    with Runtime.open(store_path, max_running_turns=1) as rt:
        timeline = Timeline(rt)
        busy, queued = _one_holds_the_only_place(rt, gate)
        parked = queued.followup("wait for a place")
        rt.flush()  # queued for the place
        held = HeldActor(queued)  # its actor busy: what follows waits in its mailbox
        queued.cancel(keep_inbox=True)
        gate.release(0)
        assert busy.wait_idle(WAIT)  # the place is handed to `queued`, behind the cancel
        held.release()
        assert queued.wait_idle(WAIT)
        assert timeline.of("agent/inbox/claimed") == [
            c for c in timeline.of("agent/inbox/claimed") if c.agent is busy
        ]
        assert parked in [m.id for m in queued.inbox.next_turn]
        _the_place_is_free(rt)
    check_store(store_path)


def test_a_passivated_agent_keeps_counting_against_its_own_limits(store_path: Path) -> None:
    # Rebuilt from its log, it got a fresh meter: 5 requests against a limit of 2.
    model = ScriptedModel.echo()
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=model, limits=UsageLimits(max_requests=2))
        for n in range(4):
            agent.followup(f"question {n}")
            assert agent.wait_idle(WAIT)
            assert agent.passivate()
        assert model.requests == 2
        assert [r.kind for r in ends(agent)] == ["completed", "completed", "limit", "limit"]
    check_store(store_path)


def test_the_admission_queue_is_first_come_first_served() -> None:
    from actors.limits import Admission

    admission = Admission(1)
    order: list[str] = []
    assert admission.enter(lambda: order.append("holder"))
    for name in ("a", "b", "c"):
        assert not admission.enter(lambda name=name: order.append(name))
    lock = threading.Lock()
    for _ in range(3):
        with lock:
            admission.leave()
    assert order == ["a", "b", "c"]
    admission.leave()
    assert admission.holders == 0


def test_agents_racing_for_the_last_request_of_a_runtime_limit_send_only_one(
    store_path: Path,
) -> None:
    import asyncio

    arrived: list[str] = []
    both: asyncio.Event | None = None

    async def meet(event: Any, next_: Any) -> Any:  # both pass the step-start check first
        nonlocal both
        both = both or asyncio.Event()
        arrived.append(event.agent.id)
        if len(arrived) == 2:
            both.set()
        await both.wait()
        return await next_()

    requests: list[Any] = []
    with Runtime.open(store_path, limits=UsageLimits(max_requests=1)) as rt:
        rt.on("agent/pre-step", meet)
        model = ScriptedModel(lambda request: requests.append(request) or "ok")
        agents = [rt.spawn(model=model) for _ in range(2)]
        for agent in agents:
            agent.followup("go")
        for agent in agents:
            assert agent.wait_idle(WAIT)
        kinds = sorted(ends(agent)[0].kind for agent in agents)
    assert len(requests) == 1  # both used to send: 2 requests against a limit of 1
    assert kinds == ["completed", "limit"]
    check_store(store_path)
