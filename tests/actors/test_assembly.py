"""The assembler takes each chunk type through one table; a subclass of a chunk type
(a provider's own) is taken as its base type is."""

from __future__ import annotations

from actors.assembly import Assembler
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
