"""Scenario tests of request failure and retry turns (CONTRACT section 5)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from runtime import LlmFailure, Retry, RetryPolicy, Runtime, ScriptedModel
from storage.events import TextDelta

from .conftest import WAIT, ScenarioClock, Timeline, check_store
from .models import FailingThenOk, GateModel

SERVER = LlmFailure(message="boom", code="SERVER", status=500)


def turn_events(agent: Any, kind: str) -> list[Any]:
    return [e.data for e in agent.session.events() if e.type == kind]


def test_two_failures_then_success_give_three_turns_one_running_interval_and_one_settled(
    fast_rt: Runtime, scenario_clock: ScenarioClock
) -> None:
    timeline = Timeline(fast_rt)
    agent = fast_rt.spawn(model=FailingThenOk([SERVER, SERVER]))
    agent.followup("hi")
    for _ in range(2):  # two back-offs
        scenario_clock.elapse(fast_rt, 0.002 * 1.1)  # cap_s and its 10% jitter
    assert agent.wait_idle(WAIT)
    starts = turn_events(agent, "turn/start")
    assert [s.turn for s in starts] == [1, 2, 3]
    assert [s.trigger.kind for s in starts] == ["message", "retry", "retry"]
    assert [e.reason.kind for e in turn_events(agent, "turn/end")] == [
        "error",
        "error",
        "completed",
    ]
    assert [r.attempt for r in turn_events(agent, "llm/retry")] == [1, 2]
    timeline.wait_for("agent/status", 2)
    assert [e.status for e in timeline.of("agent/status")] == ["running", "idle"]
    settled = timeline.of("agent/settled")
    assert [(s.turn, s.reason.kind) for s in settled] == [(3, "completed")]
    assert timeline.of("agent/error") == []


def test_a_failure_closes_its_step_before_request_error_runs(store_path: Path) -> None:
    seen: list[list[str]] = []

    def recover(event: Any, next_: Any) -> Any:
        seen.append([e.type for e in event.agent.session.events()])
        return Retry()

    with Runtime.open(store_path, retry_policy=None) as rt:
        rt.on("agent/request-error", recover)
        agent = rt.spawn(model=FailingThenOk([SERVER]))
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
    assert seen[0][-1] == "step/end"
    check_store(store_path)


def test_a_non_retryable_failure_ends_the_turn_error_after_agent_error(fast_rt: Runtime) -> None:
    timeline = Timeline(fast_rt)
    auth = LlmFailure(message="bad key", code="AUTH", status=401)
    agent = fast_rt.spawn(model=FailingThenOk([auth]))
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    timeline.wait_for("agent/settled")
    labels = timeline.labels(agent=agent.id)
    assert labels.index("agent/error") < labels.index("turn/end")
    assert timeline.of("agent/error")[0].error == auth
    assert [e.reason.kind for e in turn_events(agent, "turn/end")] == ["error"]


def test_retries_stop_at_the_policy_limit(store_path: Path, scenario_clock: ScenarioClock) -> None:
    policy = RetryPolicy(max_retries=2, base_s=0.001, cap_s=0.001)
    with Runtime.open(store_path, retry_policy=policy) as rt:
        agent = rt.spawn(model=FailingThenOk([SERVER] * 5))
        agent.followup("hi")
        for _ in range(2):
            scenario_clock.elapse(rt, 0.0011)  # cap_s and its 10% jitter
        assert agent.wait_idle(WAIT)
        assert [e.reason.kind for e in turn_events(agent, "turn/end")] == ["error"] * 3
    check_store(store_path)


def test_without_a_retry_listener_a_failure_is_terminal(store_path: Path) -> None:
    with Runtime.open(store_path, retry_policy=None) as rt:
        agent = rt.spawn(model=FailingThenOk([SERVER]))
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
        assert len(turn_events(agent, "turn/start")) == 1


RATE_LIMIT = LlmFailure(message="slow down", code="RATE_LIMIT", status=429)


@pytest.mark.parametrize("scope", ["runtime", "agent"])
def test_a_listener_sees_a_failure_before_the_default_policy_and_its_own_retry_is_used(
    store_path: Path, scope: str
) -> None:
    # The runtime's policy is registered first, in Runtime.open; a user listener added
    # later still runs before it (CONTRACT 5: a listener that owns recovery returns a
    # retry and stops delegating).
    seen: list[tuple[int, str, str]] = []

    def own_recovery(event: Any, next_: Any) -> Any:
        last = event.agent.session.events()[-1].type
        seen.append((event.turn, event.failure.code, last))
        return Retry(delay_s=0)

    with Runtime.open(store_path) as rt:  # the default RetryPolicy: 0.5 s backoff
        agent = rt.spawn(model=FailingThenOk([RATE_LIMIT]))
        (rt if scope == "runtime" else agent).on("agent/request-error", own_recovery)
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
        assert seen == [(1, "RATE_LIMIT", "step/end")]  # the failed step closed first
        assert [(r.attempt, r.delay_s) for r in turn_events(agent, "llm/retry")] == [(1, 0.0)]
        assert [e.reason.kind for e in turn_events(agent, "turn/end")] == ["error", "completed"]
        types = [e.type for e in agent.session.events()]
        retried = types.index("llm/retry")
        assert types[retried - 1 : retried + 3] == [
            "step/end",
            "llm/retry",
            "turn/end",
            "turn/start",
        ]
    check_store(store_path)


@pytest.mark.parametrize("scope", ["runtime", "agent"])
def test_a_listener_that_calls_next_gets_the_default_policys_decision(
    store_path: Path, scope: str, scenario_clock: ScenarioClock
) -> None:
    decisions: list[tuple[str, Any]] = []

    def observe(event: Any, next_: Any) -> Any:
        decision = next_()
        decisions.append((event.failure.code, decision))
        return decision

    auth = LlmFailure(message="bad key", code="AUTH", status=401)
    policy = RetryPolicy(base_s=0.001, cap_s=0.002)
    with Runtime.open(store_path, retry_policy=policy) as rt:
        agent = rt.spawn(model=FailingThenOk([RATE_LIMIT, auth]))
        (rt if scope == "runtime" else agent).on("agent/request-error", observe)
        agent.followup("hi")
        scenario_clock.elapse(rt, 0.002)
        assert agent.wait_idle(WAIT)
        (retry,) = turn_events(agent, "llm/retry")
        assert [code for code, _ in decisions] == ["RATE_LIMIT", "AUTH"]
        assert decisions[0][1] == Retry(delay_s=retry.delay_s)  # the policy's backoff
        assert 0 < retry.delay_s <= 0.002
        assert decisions[1][1] is None  # AUTH: the policy does not retry
        assert [e.reason.kind for e in turn_events(agent, "turn/end")] == ["error", "error"]
    check_store(store_path)


def test_prior_failures_list_the_failures_already_retried_in_the_chain(store_path: Path) -> None:
    seen: list[int] = []

    def policy(event: Any, next_: Any) -> Any:
        seen.append(len(event.prior_failures))
        return Retry() if len(event.prior_failures) < 2 else next_()

    with Runtime.open(store_path, retry_policy=None) as rt:
        rt.on("agent/request-error", policy)
        agent = rt.spawn(model=FailingThenOk([SERVER] * 3))
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
    assert seen == [0, 1, 2]


def test_after_an_error_queued_work_stays_parked_until_the_next_waking_send(
    store_path: Path,
) -> None:
    with Runtime.open(store_path, retry_policy=None) as rt:
        model = GateModel(fail_after_gate=SERVER)
        agent = rt.spawn(model=model)
        agent.followup("first")
        assert model.reached.wait(WAIT)
        parked = agent.followup("second")
        model.release()
        assert agent.wait_idle(WAIT)
        assert agent.inbox.ids() == [parked]
        assert len(turn_events(agent, "turn/start")) == 1
    check_store(store_path)


def test_a_cancel_racing_a_failure_is_classified_aborted(store_path: Path) -> None:
    gate = GateModel(fail_after_gate=SERVER)

    def slow_policy(event: Any, next_: Any) -> Any:
        event.agent.cancel()
        return Retry()

    with Runtime.open(store_path, retry_policy=None) as rt:
        rt.on("agent/request-error", slow_policy)
        agent = rt.spawn(model=gate)
        agent.followup("hi")
        assert gate.reached.wait(WAIT)
        gate.release()
        assert agent.wait_idle(WAIT)
        ends = turn_events(agent, "turn/end")
        assert [e.reason.kind for e in ends] == ["aborted"]
    check_store(store_path)


def test_the_request_config_comes_only_from_next_and_a_listener_may_replace_it(
    rt: Runtime,
) -> None:
    import msgspec

    def tune(event: Any, next_: Any) -> Any:
        config = next_()
        return msgspec.structs.replace(config, temperature=0.5, max_tokens=64)

    rt.on("agent/request", tune)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    header = turn_events(agent, "request/header")[0]
    assert (header.config.provider, header.config.temperature, header.config.max_tokens) == (
        "scripted",
        0.5,
        64,
    )


def test_a_failing_request_listener_is_not_offered_to_request_error(rt: Runtime) -> None:
    offered: list[Any] = []
    rt.on("agent/request-error", lambda e, n: offered.append(e))

    def broken(event: Any, next_: Any) -> Any:
        raise RuntimeError("listener bug")

    rt.on("agent/request", broken)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    assert offered == []
    assert [e.reason.kind for e in turn_events(agent, "turn/end")] == ["error"]


@pytest.mark.parametrize("from_thread", [False, True], ids=["own thread", "another thread"])
def test_a_cancel_while_the_failed_turn_closes_ends_it_aborted_and_opens_no_retry_turn(
    store_path: Path, from_thread: bool
) -> None:
    # The cancel lands while the llm/retry is logged (an observer of it): the retry turn,
    # with no delay, would open in the same breath and the cancel aimed at the failed
    # turn was dropped.
    model = ScriptedModel([SERVER, "second answer"])
    with Runtime.open(store_path, retry_policy=None) as rt:
        timeline = Timeline(rt)
        rt.on("agent/request-error", lambda event, next_: Retry())
        agent = rt.spawn(model=model)

        def on_event(event: Any) -> None:
            if event.event.type == "llm/retry":
                if from_thread:
                    canceller = threading.Thread(target=agent.cancel)
                    canceller.start()
                    canceller.join()
                else:
                    agent.cancel()

        agent.on("session/event", on_event)
        agent.followup("hi")
        settled = timeline.wait_for("agent/settled")
        assert agent.wait_idle(WAIT)
        assert [(s.turn, s.reason.kind) for s in settled] == [(1, "aborted")]
        assert [e.reason.kind for e in turn_events(agent, "turn/end")] == ["aborted"]
        assert model.requests == 1
    check_store(store_path)


def _waiting_to_retry(store_path: Path) -> tuple[Runtime, Timeline, Any]:
    """A runtime whose agent failed once; its retry turn is open and waits 60 s."""
    rt = Runtime.open(store_path, retry_policy=None)
    timeline = Timeline(rt)
    rt.on("agent/request-error", lambda event, next_: Retry(delay_s=60.0))
    agent = rt.spawn(model=ScriptedModel([SERVER, "after the retry"]))
    agent.followup("hi")
    timeline.wait_for("turn/start", 2)  # the retry turn's: its wait follows
    return rt, timeline, agent


def test_a_retry_turn_opens_at_once_and_waits_out_its_delay_open(store_path: Path) -> None:
    # The failed turn closes and the retry turn opens in the same breath (the seed:
    # "closes the failed turn and immediately opens another"); the delay is the retry
    # turn's wait before its first step.
    rt, _timeline, agent = _waiting_to_retry(store_path)
    try:
        kinds = [e.type for e in agent.session.events()]
        assert kinds[-3:] == ["llm/retry", "turn/end", "turn/start"]
        assert agent.session.state.open_turn == 2
        assert agent.status == "running"
    finally:
        rt.close()
    check_store(store_path)


def test_a_cancel_during_a_retry_delay_ends_the_retry_turn_aborted_with_no_step(
    store_path: Path,
) -> None:
    rt, timeline, agent = _waiting_to_retry(store_path)
    try:
        agent.cancel()
        settled = timeline.wait_for("agent/settled")
        assert [(s.turn, s.reason.kind) for s in settled] == [(2, "aborted")]
        assert timeline.of("agent/error") == []  # abort is classified before error
        assert [e.reason.kind for e in turn_events(agent, "turn/end")] == ["error", "aborted"]
        assert [e.turn for e in turn_events(agent, "step/start")] == [1]
    finally:
        rt.close()
    check_store(store_path)


@pytest.mark.parametrize("keep_inbox", [False, True])
def test_a_followup_sent_right_after_a_cancel_during_a_retry_delay_runs_once_the_chain_settles(
    store_path: Path, keep_inbox: bool
) -> None:
    rt, timeline, agent = _waiting_to_retry(store_path)
    try:
        agent.cancel(keep_inbox=keep_inbox)
        message_id = agent.followup("again")
        settled = timeline.wait_for("agent/settled", 2)
        assert [(s.turn, s.reason.kind) for s in settled] == [(2, "aborted"), (3, "completed")]
        claimed = timeline.of("agent/inbox/claimed")
        assert [(c.message.id, c.turn) for c in claimed][-1] == (message_id, 3)
        assert agent.wait_idle(WAIT)
        assert agent.inbox.next_turn == () and agent.inbox.next_step == ()
    finally:
        rt.close()
    check_store(store_path)


def test_a_crash_during_a_retry_delay_leaves_the_retry_turn_for_the_resume_to_close(
    store_path: Path,
) -> None:
    # Before, the retry turn opened only after the delay: a crash during it left a log
    # whose llm/retry announced a turn that never came, and nothing to repair.
    rt, timeline, agent = _waiting_to_retry(store_path)
    try:
        rt.flush()
        agent.kill()
        timeline.wait_for("agent/disposed")
        resumed = rt.resume(agent.id, model=ScriptedModel(["after the resume"]))
        ends = [(e.turn, e.reason.kind) for e in turn_events(resumed, "turn/end")]
        assert ends == [(1, "error"), (2, "interrupted")]
        starts = [(e.turn, e.trigger.kind) for e in turn_events(resumed, "turn/start")]
        assert starts == [(1, "message"), (2, "retry")]
        resumed.followup("go on")
        assert resumed.wait_idle(WAIT)
        assert turn_events(resumed, "turn/end")[-1].reason.kind == "completed"
    finally:
        rt.close()
    check_store(store_path)


def test_a_steer_sent_while_a_retry_turn_waits_is_claimed_for_its_first_step(
    store_path: Path, scenario_clock: ScenarioClock
) -> None:
    model = ScriptedModel([SERVER, "after the retry"])
    with Runtime.open(store_path, retry_policy=None) as rt:
        rt.on("agent/request-error", lambda event, next_: Retry(delay_s=0.05))
        agent = rt.spawn(model=model)

        def on_event(event: Any) -> None:
            fact = event.event
            if fact.type == "turn/start" and fact.data.trigger.kind == "retry":
                agent.steer("and this too")  # before the wait has even begun

        agent.on("session/event", on_event)
        agent.followup("hi")
        scenario_clock.elapse(rt, 0.05)
        assert agent.wait_idle(WAIT)
        claims = [
            e.data.target
            for e in agent.session.events()
            if e.type == "agent/inbox/spliced" and not e.data.inserted and e.data.outcome is None
        ]
        assert claims == ["next-turn", "next-step"]  # the retry turn's after its wait
        texts = [m.content[0].text for m in agent.session.messages() if m.role == "user"]
        assert texts == ["hi", "and this too"]
        assert [e.reason.kind for e in turn_events(agent, "turn/end")] == ["error", "completed"]
    check_store(store_path)


@pytest.mark.parametrize(
    "delay", [float("nan"), float("inf"), "0.01", True], ids=["nan", "inf", "str", "bool"]
)
def test_a_retry_with_a_malformed_delay_ends_the_turn_as_error_and_the_agent_goes_on(
    store_path: Path, delay: Any
) -> None:
    with Runtime.open(store_path, retry_policy=None) as rt:
        timeline = Timeline(rt)
        rt.on("agent/request-error", lambda event, next_: Retry(delay_s=delay))
        agent = rt.spawn(model=ScriptedModel([SERVER, "fine"]))
        agent.followup("hi")
        assert timeline.wait_for("agent/settled")[0].reason.kind == "error"
        assert [e.turn for e in timeline.of("agent/error")] == [1]
        agent.followup("again")
        assert timeline.wait_for("agent/settled", 2)[1].reason.kind == "completed"
        assert timeline.of("agent/disposed") == []
    check_store(store_path)


@pytest.mark.parametrize(
    ("delay", "error"),
    [
        (-1, ValueError),
        (-0.001, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (1e12, ValueError),
        (86_400.5, ValueError),  # past MAX_RETRY_DELAY_S, one day
        ("0.01", TypeError),
        (True, TypeError),
    ],
)
def test_a_retry_delay_that_is_negative_not_finite_or_over_a_day_is_refused_when_made(
    delay: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="delay_s is a number of seconds"):
        Retry(delay_s=delay)
    for fine in (None, 0, 0.5, 86_400):
        assert Retry(delay_s=fine).delay_s == fine


def _forced(delay: float) -> Retry:
    """A Retry whose delay was changed after its check (what the turn takes is checked again)."""
    retry = Retry(delay_s=0.01)
    msgspec.structs.force_setattr(retry, "delay_s", delay)
    return retry


@pytest.mark.parametrize(
    ("decision", "named"),
    [
        (lambda: "retry", "must return a Retry or None, got 'retry'"),
        (lambda: {"kind": "retry"}, "must return a Retry or None, got {'kind': 'retry'}"),
        (lambda: Retry, "must return a Retry or None, got <class"),
        (lambda: Retry(delay_s=-1), "listener failed: ValueError('Retry: delay_s is a number"),
        (lambda: _forced(-1.0), "returned a Retry whose delay_s is a number of seconds"),
        (lambda: _forced(1e12), "returned a Retry whose delay_s is a number of seconds"),
    ],
    ids=["a str", "a dict", "the Retry class", "Retry(delay_s=-1)", "forced -1", "forced 1e12"],
)
def test_a_request_error_decision_that_is_not_a_valid_retry_ends_the_turn_as_error_naming_it(
    store_path: Path, decision: Any, named: str
) -> None:
    with Runtime.open(store_path, retry_policy=None) as rt:
        timeline = Timeline(rt)
        rt.on("agent/request-error", lambda event, next_: decision())
        agent = rt.spawn(model=ScriptedModel([SERVER, "fine"]))
        agent.followup("hi")
        settled = timeline.wait_for("agent/settled")[0]
        assert settled.reason.kind == "error"
        [error] = timeline.of("agent/error")
        assert error.error.code == "SERVER"  # the request's failure, with what went wrong
        assert error.error.message.startswith("boom (no retry: ")
        assert named in error.error.message
        assert settled.reason.error == error.error
        assert turn_events(agent, "llm/retry") == []
        agent.followup("again")
        assert timeline.wait_for("agent/settled", 2)[1].reason.kind == "completed"
    check_store(store_path)


def test_the_policy_honours_a_providers_retry_after(
    store_path: Path, scenario_clock: ScenarioClock
) -> None:
    slow_down = LlmFailure(message="slow down", code="RATE_LIMIT", status=429, retry_after_s=0.05)
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=ScriptedModel([slow_down, "ok"]))
        agent.followup("hi")
        scenario_clock.elapse(rt, 0.05 * 1.1)
        assert agent.wait_idle(WAIT)
        (delay,) = [r.delay_s for r in turn_events(agent, "llm/retry")]
        assert 0.05 <= delay <= 0.05 * 1.1  # never sooner; spread later by the 10% jitter
        assert [e.reason.kind for e in turn_events(agent, "turn/end")] == ["error", "completed"]
    check_store(store_path)


@pytest.mark.parametrize("retry_after", [121.0, 1e10])
def test_a_provider_asking_to_wait_longer_than_the_policy_allows_is_not_retried(
    store_path: Path, retry_after: float
) -> None:
    # Honoured as is, 1e10 s made a timer that killed the runtime's timer thread.
    slow_down = LlmFailure(
        message="come back later", code="RATE_LIMIT", status=429, retry_after_s=retry_after
    )
    with Runtime.open(store_path) as rt:
        timeline = Timeline(rt)
        agent = rt.spawn(model=ScriptedModel([slow_down, "ok"]))
        agent.followup("hi")
        settled = timeline.wait_for("agent/settled")
        assert (settled[0].turn, settled[0].reason.kind) == (1, "error")
        assert [e.error.code for e in timeline.of("agent/error")] == ["RATE_LIMIT"]
        assert turn_events(agent, "llm/retry") == []
    check_store(store_path)


@pytest.mark.parametrize(
    "bad",
    [
        {"base_s": -1.0},
        {"cap_s": float("nan")},
        {"max_retry_after_s": float("inf")},
        {"max_retry_after_s": 86_401.0},  # a Retry may wait a day at most
    ],
    ids=["negative base", "nan cap", "inf max_retry_after_s", "max_retry_after_s over a day"],
)
def test_a_retry_policy_with_a_bad_number_of_seconds_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="finite number of seconds"):
        RetryPolicy(**bad)


class _RaisingModel:
    """Streams one text chunk, then raises ``error`` (no finish); an ``inline`` one raises
    it from ``answer_now`` instead."""

    provider = "test"
    name = "raising"

    def __init__(self, error: BaseException | str, *, inline: bool = False) -> None:
        self.error = error
        if inline:
            self.answer_now = self._raise  # type: ignore[method-assign]

    def _raise(self, request: Any) -> Any:
        raise self._exception()

    def _exception(self) -> BaseException:
        assert isinstance(self.error, BaseException)
        return self.error

    async def stream(self, request: Any) -> Any:
        yield TextDelta(text="part")
        if self.error == "inner-cancelled":  # an inner task something else cancelled
            inner = asyncio.ensure_future(asyncio.sleep(WAIT))
            await asyncio.sleep(0)
            inner.cancel()
            await inner
        raise self._exception()


_BASE_EXCEPTIONS: dict[str, BaseException] = {
    "SystemExit": SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt(),
    "GeneratorExit": GeneratorExit(),
    "CancelledError": asyncio.CancelledError(),
}


@pytest.mark.parametrize(
    ("error", "inline"),
    [
        *((error, inline) for error in _BASE_EXCEPTIONS.values() for inline in (False, True)),
        ("inner-cancelled", False),  # an inner task only exists in a stream
    ],
    ids=[
        *(f"{name}-{how}" for name in _BASE_EXCEPTIONS for how in ("streamed", "inline")),
        "inner-cancelled-streamed",
    ],
)
def test_a_model_raising_a_base_exception_fails_its_request_and_the_runtime_goes_on(
    store_path: Path, error: BaseException | str, inline: bool
) -> None:
    # Before: inline, every actor of the process stopped (registry included); streamed,
    # the turn waited forever (or, for KeyboardInterrupt, the I/O loop's thread ended).
    with Runtime.open(store_path, retry_policy=None) as rt:
        timeline = Timeline(rt)
        agent = rt.spawn(model=_RaisingModel(error, inline=inline))
        agent.followup("hi")
        assert timeline.wait_for("agent/settled")[0].reason.kind == "error"
        assert agent.wait_idle(WAIT)
        assert [e.turn for e in timeline.of("agent/error")] == [1]
        bystander = rt.spawn(model=ScriptedModel.echo(latency=0.01))
        bystander.followup("still here")
        assert bystander.wait_idle(WAIT)
        assert bystander.session.messages()[-1].content[0].text == "still here"
    check_store(store_path)
