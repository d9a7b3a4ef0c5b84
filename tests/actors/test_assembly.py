"""The assembler takes each chunk type through one table; a subclass of a chunk type
(a provider's own) is taken as its base type is."""

from __future__ import annotations

from actors.turn.assembly import Assembler
from storage.events import (
    FinishChunk,
    ReasoningDelta,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)


class _ProviderText(TextDelta, frozen=True):
    pass


class _ProviderFinish(FinishChunk, frozen=True):
    pass


def _assembled(chunks: list[object]) -> Assembler:
    assembler = Assembler(1, 1)
    for seq, chunk in enumerate(chunks):
        assembler.add(chunk, seq)  # type: ignore[arg-type]
    return assembler


def _turn_chunks(text: type[TextDelta], finish: type[FinishChunk], usage: Usage) -> list[object]:
    """One reply's chunks of every type, its first text and its finish of the given types."""
    return [
        ReasoningDelta(text="think"),
        text(text="he"),
        TextDelta(text="llo"),
        ToolCallDelta(index=0, call_id="c1", name="echo", arguments_delta="{}"),
        UsageChunk(usage=usage),
        finish(reason="tool-calls"),
    ]


def test_chunks_of_every_type_and_of_subclasses_are_assembled_alike() -> None:
    usage = Usage(input_tokens=3, output_tokens=2)
    plain = _assembled(_turn_chunks(TextDelta, FinishChunk, usage))
    subclassed = _assembled(_turn_chunks(_ProviderText, _ProviderFinish, usage))
    for assembler in (plain, subclassed):
        assert assembler.chunk_seqs == [0, 1, 2, 3, 4, 5]
        assert assembler.finish == "tool-calls"
        assert assembler.usage == usage
        assert [c.call_id for c in assembler.calls()] == ["c1"]
        assert TextBlock(text="hello") in assembler.message(with_calls=True).content
        assert assembler.failure() is None
    assert plain.message(with_calls=True) == subclassed.message(with_calls=True)


def _call(index: int, call_id: str | None) -> ToolCallDelta:
    return ToolCallDelta(index=index, call_id=call_id, name="echo", arguments_delta="{}")


def test_a_repeated_or_missing_call_id_becomes_unique_in_the_step_and_stays_so() -> None:
    assembler = _assembled(
        [
            _call(0, "dup"),
            _call(1, "dup"),
            _call(2, "dup_1"),  # the model's own id, which the repeat must not take
            _call(3, None),
            _call(4, "call_1_1_5"),  # the id a missing one at index 5 would be given
            _call(5, None),
            _call(6, "dup"),
            FinishChunk(reason="tool-calls"),
        ]
    )
    ids = [c.call_id for c in assembler.calls()]
    assert ids == ["dup", "dup_1_2", "dup_1", "call_1_1_3", "call_1_1_5", "call_1_1_5_2", "dup_6"]
    assert [c.call_id for c in assembler.calls()] == ids  # the same chunks, the same ids


def test_a_max_tokens_finish_with_nothing_visible_is_no_failure_but_a_stop_is_empty() -> None:
    # CONTRACT 4: a max-tokens finish ends the turn max-tokens (e.g. a reasoning model
    # that spent its whole budget on hidden reasoning); it was taken for EMPTY_RESPONSE.
    usage = UsageChunk(usage=Usage(input_tokens=5, output_tokens=256))
    assert _assembled([usage, FinishChunk(reason="max-tokens")]).failure() is None
    empty = _assembled([usage, FinishChunk(reason="stop")]).failure()
    assert empty is not None and empty.code == "EMPTY_RESPONSE"
