"""agent.ask / submit and the Reply record, for every way a chain settles; fan-in."""

from __future__ import annotations

import threading

import pytest

from runtime import (
    Aborted,
    AgentStateError,
    Completed,
    Errored,
    LimitExceeded,
    LlmFailure,
    ReplyTimeoutError,
    Runtime,
    ScriptedModel,
    TextBlock,
    UsageLimits,
    UserCause,
    as_completed,
    gather,
    wait_all_idle,
)

from .conftest import WAIT, ScenarioClock
from .models import GateModel

SERVER = LlmFailure(message="boom", code="SERVER", status=500)
AUTH = LlmFailure(message="bad key", code="AUTH", status=401)


def test_ask_returns_the_final_text_its_blocks_turns_and_usage(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel(["forty-two"]))
    reply = agent.ask("the answer?", timeout=WAIT)
    assert reply.status == "settled" and reply.ok
    assert isinstance(reply.reason, Completed)
    assert reply.text == "forty-two"
    assert reply.content == (TextBlock(text="forty-two"),)
    assert reply.turns == (1,) and reply.retries == 0
    assert reply.usage.output_tokens > 0
    claimed = [e.data for e in agent.session.events() if e.type == "agent/inbox/spliced"]
    assert reply.message_id in {m.id for d in claimed for m in d.inserted}


def test_a_second_ask_reads_only_its_own_chain(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel(["one", "two"]))
    assert agent.ask("first", timeout=WAIT).text == "one"
    second = agent.ask("second", timeout=WAIT)
    assert (second.text, second.turns) == ("two", (2,))


def test_a_retried_chain_reports_every_turn_and_the_retries(
    fast_rt: Runtime, scenario_clock: ScenarioClock
) -> None:
    agent = fast_rt.spawn(model=ScriptedModel([SERVER, SERVER, "finally"]))
    pending = agent.submit("go")
    for _ in range(2):
        scenario_clock.elapse(fast_rt, 0.002 * 1.1)  # cap_s and its 10% jitter
    reply = pending.result(WAIT)
    assert reply.ok and reply.text == "finally"
    assert reply.turns == (1, 2, 3) and reply.retries == 2


def test_an_error_chain_settles_with_its_failure(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel([AUTH]))
    reply = agent.ask("go", timeout=WAIT)
    assert reply.status == "settled" and not reply.ok
    assert isinstance(reply.reason, Errored) and reply.reason.error.code == "AUTH"
    assert reply.text == "" and reply.turns == (1,)


def test_a_limit_chain_settles_limit(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel(["a", "b"]), limits=UsageLimits(max_requests=1))
    assert agent.ask("one", timeout=WAIT).ok
    reply = agent.ask("two", timeout=WAIT)
    assert isinstance(reply.reason, LimitExceeded)


def test_a_cancel_while_asking_ends_the_wait_aborted(rt: Runtime) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    pending = agent.submit("wait at the gate")
    assert model.wait_reached(1)
    assert not pending.done()
    agent.cancel(UserCause())
    reply = pending.result(WAIT)
    assert isinstance(reply.reason, Aborted) and reply.reason.reason == UserCause()
    assert reply.text == "partial "  # the visible prefix the cancel kept


def test_a_message_cancelled_before_its_turn_is_reported_discarded(rt: Runtime) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    first = agent.submit("runs")
    assert model.wait_reached(1)
    queued = agent.submit("waits its turn")
    agent.cancel()  # clears the inbox, aborts the running turn
    assert queued.result(WAIT).status == "discarded"
    assert isinstance(first.result(WAIT).reason, Aborted)


def test_a_dispose_while_asking_ends_the_wait(rt: Runtime) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    queued_behind = agent.submit("runs")
    assert model.wait_reached(1)
    later = agent.submit("never runs")
    assert agent.dispose(WAIT)
    assert later.result(WAIT).status in ("discarded", "disposed")
    reply = queued_behind.result(WAIT)
    assert reply.status == "settled" and isinstance(reply.reason, Aborted)


def test_a_crash_while_asking_ends_the_wait_crashed(rt: Runtime) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    pending = agent.submit("runs")
    assert model.wait_reached(1)
    agent.kill("fault injection")
    assert pending.result(WAIT).status == "crashed"
    rt.resume(agent.id, model=ScriptedModel()).dispose(WAIT)  # repairs the open turn


def test_a_steer_replies_with_the_turn_it_lands_in(rt: Runtime) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    first = agent.submit("start")
    assert model.wait_reached(1)
    steer = agent.submit("and also this", steer=True)
    model.release(0)
    assert model.wait_reached(2)  # the steer is owed: a second step of turn 1
    model.release(1)
    a, b = first.result(WAIT), steer.result(WAIT)
    assert a.ok and b.ok
    assert a.turns == b.turns == (1,)
    assert b.text == "partial rest"
    assert len(model.requests) == 2


def test_ask_times_out_with_a_reply_timeout_error_and_the_turn_goes_on(rt: Runtime) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    with pytest.raises(ReplyTimeoutError, match="no reply to message") as caught:
        agent.ask("slow", timeout=0.05)
    assert isinstance(caught.value, TimeoutError)
    assert model.wait_reached(1)
    model.release()
    assert agent.wait_idle(WAIT)


def test_ask_from_the_agents_own_listener_is_refused(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel(["x", "y"]))
    seen: list[BaseException] = []
    done = threading.Event()

    def on_settled(event: object) -> None:
        try:
            agent.ask("again", timeout=1)
        except AgentStateError as err:
            seen.append(err)
        done.set()

    stop = agent.on("agent/settled", on_settled)
    agent.followup("go")
    assert done.wait(WAIT)
    stop()
    assert seen and "wait for itself" in str(seen[0])


def test_fan_in_gathers_replies_of_many_agents_in_order_and_as_completed(rt: Runtime) -> None:
    model = ScriptedModel(lambda r: "done", latency=ScriptedModel.jittered(0.02, 0.015, seed=3))
    agents = [rt.spawn(model=model) for _ in range(20)]
    pending = [a.submit(f"task {i}") for i, a in enumerate(agents)]
    replies = gather(pending, timeout=WAIT)
    assert [r.agent_id for r in replies] == [a.id for a in agents]
    assert all(r.ok and r.text == "done" for r in replies)
    more = [a.submit("again") for a in agents]
    seen = {r.agent_id for r in as_completed(more, timeout=WAIT)}
    assert seen == {a.id for a in agents}
    assert wait_all_idle(agents, WAIT)


def test_as_completed_times_out_naming_a_late_reply(rt: Runtime) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    pending = agent.submit("stuck")
    with pytest.raises(ReplyTimeoutError, match=pending.message_id):
        list(as_completed([pending], timeout=0.05))
    assert not wait_all_idle([agent], 0.05)
    model.release()
    assert wait_all_idle([agent], WAIT)
