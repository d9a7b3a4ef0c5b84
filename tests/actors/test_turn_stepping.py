"""The deterministic test mode: a test steps the turn coroutine and orders completions."""

from __future__ import annotations

from typing import Any

import pytest

from actors.effects import Checkpoint, Flush, JoinTool, NextBatch, OpenStream, StartTool, StreamEnd
from actors.signal import TurnSignal
from actors.testing import TurnHarness
from actors.toolphase import ToolRun
from runtime import ScriptedModel, tool
from storage import assert_invariants
from storage.errors import InvalidEventError
from storage.events import FinishChunk, TextDelta, ToolCallDelta, ToolResultData, UserCause
from storage.projections import repair_plan
from storage.session import Session


def answer(harness: TurnHarness, effect: Any, chunks: list[Any]) -> Any:
    """Play a model: open the stream, deliver ``chunks`` in one batch, end it."""
    assert isinstance(effect, OpenStream)
    effect = harness.send("stream")
    assert isinstance(effect, NextBatch)
    return harness.send([*chunks, StreamEnd()])


def test_a_test_can_step_a_whole_turn_by_hand() -> None:
    harness = TurnHarness()
    harness.insert("hello")
    assert isinstance(harness.start(), Checkpoint)
    assert isinstance(harness.send(), Flush)  # write-ahead: durable before the request
    effect = answer(harness, harness.send(), [TextDelta(text="hi"), FinishChunk(reason="stop")])
    assert isinstance(effect, Flush)  # settle only after turn/end is durable
    # After agent/settled: what its listeners sent lands before the chain decides
    # whether to go on (the stepper skips this when nothing is queued).
    assert isinstance(harness.send(), Checkpoint)
    assert harness.send() is None and harness.done
    assert harness.types()[-4:] == ["assistant/chunk", "assistant/message", "step/end", "turn/end"]
    assert harness.live()[-2:] == ["agent/settled", "agent/status"]
    assert_invariants(harness.session.events())


def test_a_cancel_between_any_two_effects_aborts_the_turn_cleanly() -> None:
    harness = TurnHarness()
    harness.insert("hello")
    harness.start()
    harness.send()  # checkpoint passed
    assert isinstance(harness.send(), OpenStream)  # flush done, request about to be sent
    effect = harness.send("stream")
    assert isinstance(effect, NextBatch)
    effect = harness.send([TextDelta(text="par")])
    assert isinstance(effect, NextBatch)
    effect = harness.cancel(UserCause())  # interrupt the stream between two batches
    assert isinstance(effect, Flush)
    assert isinstance(harness.send(), Checkpoint)  # after settled: what it sent lands
    assert harness.send() is None
    message = next(e.data for e in harness.session.events() if e.type == "assistant/message")
    assert message.interrupted and message.message.content[0].text == "par"
    assert harness.session.events()[-1].data.reason.kind == "aborted"
    assert_invariants(harness.session.events())


def test_tool_completions_may_arrive_in_any_order_and_results_stay_in_model_order() -> None:
    @tool(concurrency_safe=True)
    def work(n: int) -> int:
        return n

    harness = TurnHarness(tools={"work": work})
    harness.insert("go")
    harness.start()
    harness.send()
    calls = [
        ToolCallDelta(index=0, call_id="a", name="work", arguments_delta='{"n": 1}'),
        ToolCallDelta(index=1, call_id="b", name="work", arguments_delta='{"n": 2}'),
        FinishChunk(reason="tool-calls"),
    ]
    effect = answer(harness, harness.send(), calls)
    assert isinstance(effect, Flush)  # tool/call facts durable before any body runs
    first = harness.send()
    assert isinstance(first, StartTool)
    second = harness.send("handle-a")
    assert isinstance(second, StartTool)
    join = harness.send("handle-b")
    assert isinstance(join, JoinTool) and join.handles == ("handle-a", "handle-b")
    # the test chooses: the second call finishes first; its result waits for the first's
    effect = harness.send(("handle-b", ToolRun(output=2)))
    assert isinstance(effect, JoinTool) and effect.handles == ("handle-a",)
    assert not [e for e in harness.session.events() if e.type == "tool/result"]
    effect = harness.send(("handle-a", ToolRun(output=1)))
    results = [e for e in harness.session.events() if e.type == "tool/result"]
    assert [r.data.message.call_id for r in results] == ["a", "b"]
    assert [r.data.message.content[0].text for r in results] == ["1", "2"]
    assert isinstance(effect, Checkpoint | OpenStream | Flush)
    assert_invariants(harness.session.events(), allow_open_tail=True)  # the next step is due


def test_a_queued_call_starts_as_soon_as_any_in_flight_call_ends() -> None:
    # Before, the phase joined the oldest call: with ten in flight, the eleventh started
    # only once the first ended, however long it ran (head-of-line blocking).
    @tool(concurrency_safe=True)
    def work(n: int) -> int:
        return n

    harness = TurnHarness(tools={"work": work})
    harness.insert("go")
    harness.start()
    harness.send()
    calls: list[Any] = [
        ToolCallDelta(index=i, call_id=f"c{i}", name="work", arguments_delta=f'{{"n": {i}}}')
        for i in range(12)
    ]
    assert isinstance(
        answer(harness, harness.send(), [*calls, FinishChunk(reason="tool-calls")]), Flush
    )
    effect = harness.send()
    for i in range(10):  # at most ten in flight
        assert isinstance(effect, StartTool)
        effect = harness.send(f"h{i}")
    assert isinstance(effect, JoinTool) and len(effect.handles) == 10
    effect = harness.send(("h5", ToolRun(output=5)))  # a late call ends first
    assert isinstance(effect, StartTool) and effect.plan.event.call_id == "c10"
    effect = harness.send("h10")
    assert isinstance(effect, JoinTool) and "h5" not in effect.handles
    effect = harness.send(("h10", ToolRun(output=10)))
    assert isinstance(effect, StartTool) and effect.plan.event.call_id == "c11"
    effect = harness.send("h11")
    assert not [e for e in harness.session.events() if e.type == "tool/result"]
    for i in [11, 9, 8, 7, 6, 4, 3, 2, 1, 0]:  # the rest, latest first
        assert isinstance(effect, JoinTool)
        effect = harness.send((f"h{i}", ToolRun(output=i)))
    results = [e.data for e in harness.session.events() if e.type == "tool/result"]
    assert [r.message.call_id for r in results] == [f"c{i}" for i in range(12)]
    assert_invariants(harness.session.events(), allow_open_tail=True)


def test_two_runs_with_the_same_choices_write_the_same_log() -> None:
    def run() -> list[tuple[str, Any]]:
        harness = TurnHarness()
        harness.insert("hello", message_id="m1")
        harness.start()
        harness.send()
        answer(harness, harness.send(), [TextDelta(text="x"), FinishChunk(reason="stop")])
        harness.send()
        return [(e.type, e.data) for e in harness.session.events()]

    assert run() == run()


def test_the_scripted_model_answers_inline_when_it_has_no_latency() -> None:
    from actors.model import ModelRequest
    from storage.events import RequestConfig

    model = ScriptedModel.echo()
    request = ModelRequest(config=RequestConfig(provider="scripted", model="scripted"), messages=[])
    assert model.answer_now(request) is not None
    assert ScriptedModel.echo(latency=0.5).answer_now(request) is None


def test_a_retry_turns_signal_is_aborted_with_the_failed_turns_and_shares_its_chain() -> None:
    first = TurnSignal()
    retry = TurnSignal(first)
    again = TurnSignal(retry)
    other = TurnSignal()
    assert again.in_chain_of(first) and retry.in_chain_of(again)
    assert not other.in_chain_of(first)
    first.abort(UserCause())
    assert retry.aborted and again.aborted and again.reason == UserCause()
    assert not other.aborted
    late = TurnSignal(first)  # opened after the failed turn's signal was aborted
    assert late.aborted


def _two_safe_calls(harness: TurnHarness) -> None:
    """Run the turn up to the first join of two started concurrency-safe calls."""
    harness.insert("go")
    harness.start()
    harness.send()
    calls = [
        ToolCallDelta(index=0, call_id="a", name="work", arguments_delta='{"n": 1}'),
        ToolCallDelta(index=1, call_id="b", name="work", arguments_delta='{"n": 2}'),
        FinishChunk(reason="tool-calls"),
    ]
    assert isinstance(answer(harness, harness.send(), calls), Flush)
    assert isinstance(harness.send(), StartTool)
    assert isinstance(harness.send("handle-a"), StartTool)
    assert isinstance(harness.send("handle-b"), JoinTool)


@tool(concurrency_safe=True)
def work(n: int) -> int:
    return n


def test_a_failure_escaping_the_tool_phase_answers_every_call_before_the_step_closes() -> None:
    # Before, the step/end of the coroutine's finally followed the unanswered calls: a
    # log the invariant checker refused for good, which no resume could repair.
    harness = TurnHarness(tools={"work": work})
    _two_safe_calls(harness)
    effect = harness.throw(RuntimeError("the stepper failed"))
    while effect is not None:  # the turn ends: settle
        effect = harness.send()
    events = harness.session.events()
    results = [e.data for e in events if e.type == "tool/result"]
    assert [r.message.call_id for r in results] == ["a", "b"]
    assert all(r.error is not None and r.error.code == "TOOL_FAILED" for r in results)
    assert "the stepper failed" in results[0].error.message
    assert [e.type for e in events][-2:] == ["step/end", "turn/end"]
    assert events[-1].data.reason.kind == "error"
    assert_invariants(events)


def test_a_tool_phase_that_cannot_log_any_result_leaves_the_step_open_for_the_repair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refuse = False
    append_fact = Session.append_fact

    def failing(self: Session, data: Any) -> Any:
        if refuse and isinstance(data, ToolResultData):
            raise InvalidEventError("the log refuses every tool/result")
        return append_fact(self, data)

    monkeypatch.setattr(Session, "append_fact", failing)
    harness = TurnHarness(tools={"work": work})
    _two_safe_calls(harness)
    refuse = True
    with pytest.raises(InvalidEventError, match="the log refuses every tool/result"):
        harness.send(("handle-a", ToolRun(output=1)))
    events = harness.session.events()
    assert events[-1].type == "tool/call"  # no step/end over the unanswered calls
    assert_invariants(events, allow_open_tail=True)
    refuse = False
    for kind, data in repair_plan(events):  # what a resume appends
        harness.session.append(kind, data)
    assert_invariants(harness.session.events())


def test_a_result_whose_refusal_cannot_be_logged_either_is_logged_as_the_last_resort(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    append_fact = Session.append_fact

    def picky(self: Session, data: Any) -> Any:
        # refuses every tool/result but the shortest: as the log would one whose id and
        # name take nearly all of the event limit
        if isinstance(data, ToolResultData) and len(data.message.content[0].text) > 40:
            raise InvalidEventError("'tool/result' event is over the limit " + "." * 500)
        return append_fact(self, data)

    @tool
    def talk() -> str:
        return "a result longer than forty characters, refused by the log"

    monkeypatch.setattr(Session, "append_fact", picky)
    harness = TurnHarness(tools={"talk": talk})
    harness.insert("go")
    harness.start()
    harness.send()
    call = [ToolCallDelta(index=0, call_id="a", name="talk"), FinishChunk(reason="tool-calls")]
    effect = answer(harness, harness.send(), call)
    assert isinstance(harness.send(), StartTool)  # past the write-ahead flush
    assert isinstance(harness.send("handle"), JoinTool)
    harness.send(("handle", ToolRun(output=talk.fn())))
    (result,) = [e.data for e in harness.session.events() if e.type == "tool/result"]
    assert result.error is not None and result.error.code == "TOOL_FAILED"
    assert result.message.content[0].text == "the tool result could not be logged"
    assert effect is not None
