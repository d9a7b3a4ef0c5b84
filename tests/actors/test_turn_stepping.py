"""The deterministic test mode: a test steps the turn coroutine and orders completions."""

from __future__ import annotations

from typing import Any

from actors.effects import Checkpoint, Flush, JoinTool, NextBatch, OpenStream, StartTool, StreamEnd
from actors.live import TurnSignal
from actors.testing import TurnHarness
from actors.toolphase import ToolRun
from runtime import ScriptedModel, tool
from storage import assert_invariants
from storage.events import FinishChunk, TextDelta, ToolCallDelta, UserCause


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
    assert isinstance(join, JoinTool) and join.handle == "handle-a"
    # the second call finished first; the harness answers the joins in model order anyway
    effect = harness.send(ToolRun(output=1))
    assert isinstance(effect, JoinTool) and effect.handle == "handle-b"
    effect = harness.send(ToolRun(output=2))
    results = [e for e in harness.session.events() if e.type == "tool/result"]
    assert [r.data.message.call_id for r in results] == ["a", "b"]
    assert isinstance(effect, Checkpoint | OpenStream | Flush)


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
