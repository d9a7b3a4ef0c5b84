"""A runtime on ``Runtime.open(clock=ManualClock())``: what only a manual clock shows.

Back-offs and timeouts fire when the test advances the clock, exactly at their time,
never before and never by real time; the log's times are the clock's. (The rest of the
scenario suite runs on such a clock with ``--clock=manual``; see conftest.py.)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors import MANUAL_EPOCH
from runtime import (
    LlmFailure,
    ManualClock,
    RestartPolicy,
    RetryPolicy,
    Runtime,
    ScriptedModel,
    ToolCall,
    tool,
)

from .conftest import WAIT, check_store
from .models import FailingThenOk

SERVER = LlmFailure(message="boom", code="SERVER", status=500)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def manual_rt(store_path: Path, clock: ManualClock) -> Iterator[Runtime]:
    # No jitter: each back-off is exactly base_s * 2**(attempt-1) seconds.
    policy = RetryPolicy(max_retries=4, base_s=30.0, cap_s=3600.0, jitter=0.0)
    runtime = Runtime.open(store_path, clock=clock, retry_policy=policy)
    try:
        yield runtime
    finally:
        runtime.close(timeout=WAIT)
        check_store(store_path)


def facts(agent: Any, kind: str) -> list[Any]:
    return [e for e in agent.session.events() if e.type == kind]


def test_a_retry_chain_of_long_back_offs_completes_as_the_clock_is_advanced(
    manual_rt: Runtime, clock: ManualClock
) -> None:
    # 30 + 60 + 120 + 240 s of back-off: on the real clock, 7.5 minutes.
    agent = manual_rt.spawn(model=FailingThenOk([SERVER] * 4))
    pending = agent.submit("hi")
    scheduler = manual_rt.scheduler
    for attempt, delay in enumerate([30.0, 60.0, 120.0, 240.0], start=1):
        assert scheduler.wait_pending(1, WAIT), f"retry {attempt} armed no timer"
        assert [r.data.delay_s for r in facts(agent, "llm/retry")][-1] == delay
        fired = scheduler.statistics().fired
        clock.advance(delay - 0.001)
        assert scheduler.statistics().fired == fired  # a millisecond early: nothing
        assert len(facts(agent, "turn/start")) == attempt + 1  # the retry turn waits open
        assert len(facts(agent, "step/start")) == attempt  # ... with no step yet
        clock.advance(0.001)
        assert scheduler.statistics().fired == fired + 1  # fired inside advance()
    reply = pending.result(WAIT)
    assert reply.ok and reply.text == "ok" and reply.retries == 4
    assert scheduler.statistics().threaded is False  # no timer thread: only advance() fires


def test_nothing_fires_until_the_clock_is_advanced(manual_rt: Runtime, clock: ManualClock) -> None:
    agent = manual_rt.spawn(model=FailingThenOk([SERVER]))
    agent.followup("hi")
    scheduler = manual_rt.scheduler
    assert scheduler.wait_pending(1, WAIT)
    # Real time passing changes nothing: the agent stays in its retry turn's wait.
    assert not agent.wait_idle(0.2)
    assert scheduler.statistics().fired == 0 and scheduler.statistics().pending == 1
    assert [e.data.reason.kind for e in facts(agent, "turn/end")] == ["error"]
    clock.advance(30.0)
    assert agent.wait_idle(WAIT)
    assert [e.data.reason.kind for e in facts(agent, "turn/end")] == ["error", "completed"]


def test_a_cancel_during_a_long_back_off_ends_the_retry_turn_without_advancing(
    manual_rt: Runtime, clock: ManualClock
) -> None:
    agent = manual_rt.spawn(model=FailingThenOk([SERVER]))
    agent.followup("hi")
    assert manual_rt.scheduler.wait_pending(1, WAIT)
    agent.cancel()
    assert agent.wait_idle(WAIT)
    assert [e.data.reason.kind for e in facts(agent, "turn/end")] == ["error", "aborted"]
    assert manual_rt.scheduler.statistics().pending == 0  # its timer was cancelled
    assert clock.monotonic() == 0.0


def test_a_tool_timeout_fires_exactly_at_advance(store_path: Path, clock: ManualClock) -> None:
    started = threading.Event()

    @tool(timeout=60)
    async def slow() -> str:
        started.set()
        await asyncio.Event().wait()  # never set: only the timeout ends it
        return "never"

    model = ScriptedModel([[ToolCall(name="slow")], "gave up"])
    with Runtime.open(store_path, clock=clock) as rt:
        agent = rt.spawn(model=model, tools=[slow])
        pending = agent.submit("go")
        assert started.wait(WAIT) and rt.scheduler.wait_pending(1, WAIT)
        clock.advance(59.999)
        assert not pending.done() and facts(agent, "tool/result") == []
        clock.advance(0.001)
        reply = pending.result(WAIT)
        assert reply.ok and reply.text == "gave up"
        (result,) = facts(agent, "tool/result")
        assert result.data.error is not None and result.data.error.code == "TOOL_TIMEOUT"
    check_store(store_path)


def test_a_supervised_restart_waits_its_back_off_on_the_clock(
    store_path: Path, clock: ManualClock
) -> None:
    restarted = threading.Event()
    policy = RestartPolicy(backoff_s=5.0, jitter=0.0)
    with Runtime.open(store_path, clock=clock) as rt:
        rt.on("agent/restart", lambda event: restarted.set())
        agent = rt.spawn(model=ScriptedModel.echo(), restart=policy)
        agent.kill("crash")
        assert rt.scheduler.wait_pending(1, WAIT)
        clock.advance(4.999)
        assert not restarted.is_set()
        clock.advance(0.001)
        assert restarted.wait(WAIT)
        assert rt.get(agent.id).ask("back", timeout=WAIT).text == "back"
    check_store(store_path)


def test_the_log_records_the_clocks_wall_time(manual_rt: Runtime, clock: ManualClock) -> None:
    start_ms = int(MANUAL_EPOCH * 1000)
    agent = manual_rt.spawn(model=FailingThenOk([SERVER]))
    agent.followup("hi")
    assert manual_rt.scheduler.wait_pending(1, WAIT)
    before = agent.session.events()
    assert {e.time for e in before} == {start_ms}  # no time passed yet
    clock.advance(30.0)
    assert agent.wait_idle(WAIT)
    after = agent.session.events()[len(before) :]
    assert after and {e.time for e in after} == {start_ms + 30_000}


@pytest.mark.parametrize("clock_value", [object(), ManualClock, "manual"])
def test_open_refuses_what_is_not_a_clock(store_path: Path, clock_value: Any) -> None:
    with pytest.raises(TypeError, match=r"clock must be a clock with monotonic\(\) and time\(\)"):
        Runtime.open(store_path, clock=clock_value)
