"""The deterministic test mode itself: what ``TurnHarness`` refuses, and how it runs async
listeners (only when the test says so)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from actors.effects import Checkpoint, Flush, JoinTool, NextBatch, OpenStream, RunAsync, StreamEnd
from actors.testing import TurnHarness
from actors.toolphase import ToolRun
from runtime import tool
from storage import assert_invariants, check_invariants
from storage.events import FinishChunk, TextDelta, ToolCallDelta

REPLY = [TextDelta(text="hi"), FinishChunk(reason="stop"), StreamEnd()]


@tool
def work(n: int) -> int:
    """Work."""
    return n


def step_to(harness: TurnHarness, kind: type) -> Any:
    """Answer every effect the plain way until one of ``kind`` is pending."""
    effect = harness.pending
    while not isinstance(effect, kind):
        assert effect is not None, f"the turn ended before a {kind.__name__}"
        effect = harness.send(_plain(effect))
    return effect


def finish(harness: TurnHarness) -> None:
    effect = harness.pending
    while effect is not None:
        effect = harness.send(_plain(effect))


def _plain(effect: Any) -> Any:
    if isinstance(effect, OpenStream):
        return "stream"
    if isinstance(effect, NextBatch):
        return REPLY
    if isinstance(effect, JoinTool):
        return effect.handles[0], ToolRun(output=1)
    if isinstance(effect, RunAsync):
        return asyncio.run(effect.work())  # the test runs the async listeners' work itself
    if isinstance(effect, Checkpoint | Flush):
        return None
    return f"handle-{id(effect)}"  # StartTool: any handle


def tool_turn() -> TurnHarness:
    harness = TurnHarness(tools={"work": work})
    harness.insert("go")
    harness.start()
    step_to(harness, NextBatch)
    call = ToolCallDelta(index=0, call_id="a", name="work", arguments_delta='{"n": 1}')
    harness.send([call, FinishChunk(reason="tool-calls"), StreamEnd()])
    return harness


@pytest.mark.parametrize(
    ("waiting_for", "wrong"),
    [
        (JoinTool, ToolRun(output=1)),  # a ToolRun without the handle that ended
        (NextBatch, None),
        (NextBatch, "hi"),
        (NextBatch, [TextDelta(text="hi"), "more"]),
        (Flush, REPLY),  # the batch sent one effect too early
    ],
    ids=["JoinTool run", "NextBatch None", "NextBatch str", "NextBatch non-chunk", "Flush chunks"],
)
def test_send_refuses_a_value_the_pending_effect_does_not_take_and_the_turn_is_unchanged(
    waiting_for: type, wrong: object
) -> None:
    harness = tool_turn() if waiting_for is JoinTool else TurnHarness()
    if waiting_for is not JoinTool:
        harness.insert("go")
        harness.start()
    pending = step_to(harness, waiting_for)
    before = harness.types()
    with pytest.raises(TypeError, match=f"pending {waiting_for.__name__} takes"):
        harness.send(wrong)
    assert harness.pending is pending and not harness.done
    assert harness.types() == before  # not resumed: nothing unwound, nothing written
    finish(harness)  # the right value goes on from there
    assert harness.done
    assert harness.session.events()[-1].data.reason.kind == "completed"
    assert_invariants(harness.session.events())


def test_start_while_a_turn_runs_is_refused_and_the_turn_goes_on() -> None:
    harness = TurnHarness()
    harness.insert("one")
    harness.start()
    harness.send()  # past the checkpoint
    harness.insert("two")
    with pytest.raises(RuntimeError, match="a turn is running"):
        harness.start()  # used to drop the running turn, its log left open
    finish(harness)
    ends = [e.data.turn for e in harness.session.events() if e.type == "turn/end"]
    assert ends == [1, 2]  # the queued message ran as the next turn of the same drain
    assert_invariants(harness.session.events())


def test_send_when_no_turn_runs_says_to_start_one() -> None:
    harness = TurnHarness()
    with pytest.raises(RuntimeError, match="call start"):
        harness.send()


def test_a_turn_whose_coroutine_raised_is_over() -> None:
    harness = TurnHarness()
    harness.insert("go")
    harness.start()
    step_to(harness, Flush)
    with pytest.raises(OSError, match="disk full"):
        harness.throw(OSError("disk full"))
    assert harness.done and harness.pending is None  # it used to show a stale Flush


def test_an_async_listener_of_an_emitted_event_runs_only_when_the_test_runs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    harness = TurnHarness()
    called: list[int] = []

    async def settled(event: Any) -> None:
        await asyncio.sleep(0)
        called.append(event.turn)

    async def failing(event: Any) -> None:
        raise ValueError("listener bug")

    harness.bus.on("agent/settled", settled)
    harness.bus.on("agent/settled", failing)
    harness.insert("go")
    harness.start()
    finish(harness)  # used to raise AttributeError at agent/settled, the turn left running
    assert harness.done
    assert_invariants(harness.session.events())
    assert called == [] and len(harness.listener_work) == 2
    with caplog.at_level(logging.ERROR):
        assert harness.run_listeners() == 2
    assert called == [1]
    assert harness.listener_work == []
    assert "listener bug" in caplog.text  # contained and logged, as in production


def test_a_deferred_chain_with_a_sync_listener_after_an_async_one_runs_in_the_test() -> None:
    harness = TurnHarness()
    seen: list[str] = []

    async def outer(event: Any, next_: Any) -> Any:
        seen.append("async")
        return await next_()

    def inner(event: Any, next_: Any) -> Any:
        seen.append("sync")
        return next_()

    harness.bus.on("agent/pre-step", outer)
    harness.bus.on("agent/pre-step", inner)
    harness.insert("go")
    harness.start()
    effect = step_to(harness, RunAsync)
    assert effect.name == "agent/pre-step"
    finish(harness)  # runs the work with asyncio.run: the sync listener in its executor
    assert seen == ["async", "sync"]
    assert check_invariants(harness.session.events()) == []
