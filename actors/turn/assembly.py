"""Assembling a model's streamed chunks into one assistant message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from storage import (
    AssistantMessage,
    AssistantPart,
    FinishChunk,
    FinishReason,
    LlmFailure,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    Usage,
    UsageChunk,
)

__all__ = ["Assembler", "HeldChunks"]


class _PartialCall:
    __slots__ = ("arguments", "call_id", "name")

    def __init__(self) -> None:
        self.call_id: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []


class Assembler:
    """Accumulates chunks; knows the visible prefix and the complete calls."""

    def __init__(self, turn: int, step: int) -> None:
        self._turn = turn
        self._step = step
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._signature: str | None = None
        self._calls: dict[int, _PartialCall] = {}
        self.usage: Usage | None = None
        self.finish: FinishReason | None = None
        self.chunk_seqs: list[int] = []
        # Invariant: the characters of text, reasoning and call arguments taken so far; a
        # lower bound of the encoded size of the message they will make (see the turn).
        self.streamed = 0
        # Invariant: the bytes ``chunk_seqs`` take in the message's JSON (each seq's
        # digits and a comma; seqs only grow); ``_digits`` is the digit count of the seqs
        # from ``_next_power // 10`` up to ``_next_power``.
        self.cited = 0
        self._digits = 1
        self._next_power = 10

    def add(self, chunk: StreamChunk, seq: int) -> None:
        """Take ``chunk``, logged as the chunk event ``seq``."""
        self.cite(seq)
        self.take(chunk)

    def cite(self, seq: int) -> None:
        """Cite the chunk event ``seq``, whose chunk :meth:`take` took."""
        self.chunk_seqs.append(seq)
        while seq >= self._next_power:
            self._digits += 1
            self._next_power *= 10
        self.cited += self._digits + 1

    def take(self, chunk: StreamChunk) -> None:
        """Take ``chunk``'s content (what the message will hold), not its citation."""
        take = _TAKERS.get(chunk.__class__)
        if take is None:
            self._take(chunk)  # a subclass of a chunk type: the general dispatch
        else:
            take(self, chunk)

    def _text_delta(self, chunk: TextDelta) -> None:
        self._text.append(chunk.text)
        self.streamed += len(chunk.text)

    def _reasoning_delta(self, chunk: ReasoningDelta) -> None:
        self._reasoning.append(chunk.text)
        self.streamed += len(chunk.text)
        if chunk.signature is not None:
            self._signature = chunk.signature

    def _tool_call_delta(self, chunk: ToolCallDelta) -> None:
        call = self._calls.setdefault(chunk.index, _PartialCall())
        if chunk.call_id:
            call.call_id = chunk.call_id
        if chunk.name and call.name is None:
            call.name = chunk.name
        call.arguments.append(chunk.arguments_delta)
        self.streamed += len(chunk.arguments_delta)

    def _usage(self, chunk: UsageChunk) -> None:
        self.usage = chunk.usage

    def _finish(self, chunk: FinishChunk) -> None:
        self.finish = chunk.reason

    def _take(self, chunk: StreamChunk) -> None:
        """:meth:`add` for a subclass of a chunk type: the table's entry of its base."""
        for chunk_type, take in _TAKERS.items():
            if isinstance(chunk, chunk_type):
                take(self, chunk)
                return

    def visible(self) -> list[AssistantPart]:
        """Reasoning and text streamed so far (what a cancel keeps)."""
        parts: list[AssistantPart] = []
        if self._reasoning:
            parts.append(ReasoningBlock(text="".join(self._reasoning), signature=self._signature))
        if self._text:
            parts.append(TextBlock(text="".join(self._text)))
        return parts

    def calls(self) -> list[ToolCallBlock]:
        """Complete tool calls in model order, each with an id unique in the step.

        A missing id is derived from the position (``call_<turn>_<step>_<index>``); an id
        the model already gave an earlier call becomes ``<id>_<index>``. A derived id
        never takes an id the model gave (or an earlier derived one): ``_2``, ``_3``…
        are appended until it is free. The same chunks always give the same ids.
        """
        calls: list[ToolCallBlock] = []
        if not self._calls:
            return calls
        given = {c.call_id for c in self._calls.values() if c.call_id}
        taken: set[str] = set()
        for index in sorted(self._calls):
            call = self._calls[index]
            call_id = call.call_id
            if not call_id or call_id in taken:
                base = f"{call_id}_{index}" if call_id else self._derived_id(index)
                call_id, n = base, 1
                while call_id in taken or call_id in given:
                    n += 1
                    call_id = f"{base}_{n}"
            taken.add(call_id)
            calls.append(
                ToolCallBlock(
                    call_id=call_id, name=call.name or "", arguments="".join(call.arguments)
                )
            )
        return calls

    def _derived_id(self, index: int) -> str:
        return f"call_{self._turn}_{self._step}_{index}"

    def message(
        self, *, with_calls: bool = False, calls: list[ToolCallBlock] | None = None
    ) -> AssistantMessage:
        """The visible parts, then the complete calls if ``with_calls`` (or ``calls``,
        when the caller already has them)."""
        parts = self.visible()
        if calls is not None:
            parts += calls
        elif with_calls:
            parts += self.calls()
        return AssistantMessage(content=tuple(parts))

    def failure(self) -> LlmFailure | None:
        """What is wrong with a finished stream, if anything."""
        if self.finish is None:
            return LlmFailure(message="the model stream ended without a finish", code="TRANSPORT")
        if self.finish == "error":
            return LlmFailure(message="the model finished with an error", code="UNKNOWN")
        if self.finish == "max-tokens":
            return None  # ends the turn ``max-tokens``, even with nothing visible (CONTRACT 4)
        if not self._text and not self._reasoning and not self._calls:
            return LlmFailure(message="the model returned an empty response", code="EMPTY_RESPONSE")
        return None


# How :meth:`Assembler.take` takes each chunk type: one dict lookup, not an isinstance chain.
_TAKERS: dict[type, Callable[[Assembler, Any], None]] = {
    TextDelta: Assembler._text_delta,
    ReasoningDelta: Assembler._reasoning_delta,
    ToolCallDelta: Assembler._tool_call_delta,
    UsageChunk: Assembler._usage,
    FinishChunk: Assembler._finish,
}


class HeldChunks:
    """Deltas taken from the stream but not logged yet, gathered into few chunks.

    A reply streamed in very many small deltas would have its ``assistant/message`` cite
    one chunk event per delta (a seq of several digits for each one-character delta), and
    outgrow the event limit although its content fits. Past a share of the limit (see the
    turn), deltas are held here and logged together: one chunk per run, a run being the
    text, the reasoning, the pieces of one tool call (by index), or the latest usage or
    finish. Released runs keep the order in which each began; a run gathers deltas that
    arrived between those of other runs, which is safe because the assembled message
    keeps text, reasoning and each call apart (see :class:`Assembler`): the gathered
    chunks assemble to the same message as the deltas they hold.
    """

    __slots__ = ("_runs", "chars")

    def __init__(self) -> None:
        self._runs: dict[object, list[StreamChunk]] = {}
        # Invariant: the characters of text, reasoning and call arguments held.
        self.chars = 0

    def __bool__(self) -> bool:
        return bool(self._runs)

    def hold(self, chunk: StreamChunk) -> None:
        if isinstance(chunk, TextDelta):
            key: object = TextDelta
            self.chars += len(chunk.text)
        elif isinstance(chunk, ReasoningDelta):
            key = ReasoningDelta
            self.chars += len(chunk.text)
        elif isinstance(chunk, ToolCallDelta):
            key = (ToolCallDelta, chunk.index)
            self.chars += len(chunk.arguments_delta)
        else:  # usage, finish: the latest one counts
            key = type(chunk)
        run = self._runs.get(key)
        if run is None:
            self._runs[key] = [chunk]
        else:
            run.append(chunk)

    def release(self) -> list[StreamChunk]:
        """One chunk per run, in the order the runs began; nothing is held after."""
        chunks = [_gathered(run) for run in self._runs.values()]
        self._runs.clear()
        self.chars = 0
        return chunks


def _gathered(run: list[StreamChunk]) -> StreamChunk:
    """The deltas of one run as one chunk that :class:`Assembler` takes alike."""
    first = run[0]
    if len(run) == 1:
        return first
    if isinstance(first, TextDelta):
        return TextDelta(text="".join(c.text for c in run))  # type: ignore[union-attr]
    if isinstance(first, ReasoningDelta):
        signature = None
        for chunk in run:  # the assembler keeps the last signature given
            if chunk.signature is not None:  # type: ignore[union-attr]
                signature = chunk.signature  # type: ignore[union-attr]
        text = "".join(c.text for c in run)  # type: ignore[union-attr]
        return ReasoningDelta(text=text, signature=signature)
    if isinstance(first, ToolCallDelta):
        calls: list[ToolCallDelta] = run  # type: ignore[assignment]
        call_id = next((c.call_id for c in reversed(calls) if c.call_id), first.call_id)
        name = next((c.name for c in calls if c.name), first.name)  # the first name given
        arguments = "".join(c.arguments_delta for c in calls)
        return ToolCallDelta(
            index=first.index, call_id=call_id, name=name, arguments_delta=arguments
        )
    return run[-1]  # usage, finish: the assembler keeps the latest
