"""A step's exchange with its model: stream the reply into the log, chunk by chunk
(gathered once a reply has very many deltas), log its ``assistant/message`` and tool
calls, then run the calls. How the step ended is a :class:`StepResult`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec

from storage import (
    CITATION_BYTES,
    CITED_SHARE,
    DIRECT_SHARE,
    AssistantChunk,
    AssistantMessageData,
    DiskFullError,
    EventTooLargeError,
    InvalidEventError,
    LlmFailure,
    MaxTokens,
    ReasoningDelta,
    TextDelta,
    ToolCallData,
    TurnEndReason,
    reply_bytes,
)

from ..effects import Flush, NextBatch, OpenStream, StreamEnd, TurnAborted
from ..errors import ModelError
from ..limits import UsageMeter
from ..model import ModelRequest
from ..signal import TurnSignal
from ..streams import StreamHandle
from ..toolphase import ToolPhase, unanswerable
from ..tools import described
from .assembly import Assembler, HeldChunks

__all__ = ["DONE", "FLUSH", "MORE", "Exchange", "StepResult"]

log = logging.getLogger("corral.turn")


class StepResult(msgspec.Struct, frozen=True):
    """How one step ended. ``failure`` set: the request failed (``offer``: to request-error)."""

    more: bool = False
    end: TurnEndReason | None = None
    failure: LlmFailure | None = None
    error: BaseException | None = None
    offer: bool = True


DONE: Final = StepResult()  # a step that ended normally, nothing more to do
MORE: Final = StepResult(more=True)  # a step whose tool results the model is owed
FLUSH: Final = Flush()  # stateless: one instance serves every wait


def not_durable(err: DiskFullError) -> LlmFailure:
    """The failure a turn ends with when its write-ahead flush finds the disk full."""
    return LlmFailure(message=f"the session log could not be made durable: {err}")


# A reply's chunks are logged one per delta, then gathered (:class:`HeldChunks`): see
# the citation shares in storage.budget.


def _announced(stream: Any) -> Sequence[Any] | None:
    """What ``await NextBatch(stream)`` would resolve to at once (chunks already
    announced, in mailbox order, or their failure raised), without the round trip
    through the stepper; None when the batch must be awaited (or ``stream`` is not a
    :class:`StreamHandle`, e.g. a test's stand-in)."""
    if stream.__class__ is not StreamHandle:
        return None
    items, error = stream.take()
    if error is not None:
        raise error
    return items or None


def _unloggable(err: InvalidEventError) -> StepResult:
    failure = LlmFailure(message=f"the model's reply cannot be logged: {err}")
    return StepResult(failure=failure, error=err)


def _too_large(assembler: Assembler, limit: int) -> StepResult:
    """A reply that outgrew the event limit while it streamed: its ``assistant/message``
    would hold more characters than the limit has bytes (each takes at least one) once
    the citations of its chunks (``sourceEventSeqs``) are counted."""
    return _unloggable(
        EventTooLargeError(
            f"it is too large: it streamed {assembler.streamed} characters of text, "
            f"reasoning and tool-call arguments, which with the {assembler.cited} bytes "
            f"citing its {len(assembler.chunk_seqs)} chunks are more than its "
            f"'assistant/message' may hold (the limit is {limit} bytes); the model call was "
            "stopped; ask for a shorter reply, or raise max_event_bytes"
        )
    )


def _gather_size(assembler: Assembler, limit: int) -> int:
    """How many characters a gathered chunk should hold before it is logged: enough that
    the chunks still to come, however small the deltas, cite within what is left of the
    citation budget (``limit // CITED_SHARE``) for the largest reply the limit allows."""
    left = limit // CITED_SHARE - assembler.cited
    return max(1, (limit - assembler.streamed) * CITATION_BYTES // max(left, CITATION_BYTES))


def _log_direct(
    session: Any,
    assembler: Assembler,
    batch: Sequence[Any],
    turn: int,
    step: int,
    direct: int,
    limit: int,
) -> int:
    """Log the leading text and reasoning deltas of ``batch`` with one
    ``Session.extend`` when each would be logged one by one anyway (with all of them
    the reply stays under ``direct`` citation bytes and under ``limit``): the same
    events as one ``append_fact`` each, for one hold of the session's lock and one
    hand-over to the writer (a read of a fast stream holds dozens). How many it logged;
    0: none (the caller logs them one by one)."""
    facts = []
    size = 0
    for item in batch:
        cls = item.__class__
        if cls is not TextDelta and cls is not ReasoningDelta:
            break
        size += len(item.text)
        facts.append(("assistant/chunk", AssistantChunk(turn=turn, step=step, chunk=item)))
    count = len(facts)
    if count < 2:
        return 0
    cite = (len(str(session.last_seq + count)) + 1) * count  # at most, for their seqs
    if (
        assembler.cited + cite >= direct
        or assembler.streamed + assembler.cited + size + cite > limit
    ):
        return 0
    try:
        events = session.extend(facts)
    except InvalidEventError:
        return 0  # nothing was appended (all or nothing): one by one, up to the bad one
    add = assembler.add
    for item, event in zip(batch, events, strict=False):  # batch may go on past them
        add(item, event.seq)
    return count


class Exchange:
    """The model exchange of one agent's steps (its turn machine holds one)."""

    def __init__(
        self,
        *,
        session: Any,
        tools: ToolPhase,
        meters: Sequence[UsageMeter],
        durability: Literal["write-ahead", "turn", "none"],
    ) -> None:
        self.session = session
        self.tools = tools
        self.meters = tuple(meters)
        self.durability = durability
        self.max_event_bytes: int = session.codec.max_event_bytes

    def _log_held(self, held: HeldChunks, assembler: Assembler, turn: int, step: int) -> None:
        """Log the held deltas as gathered chunks, each cited by the reply."""
        append = self.session.append_fact
        for chunk in held.release():
            assembler.cite(append(AssistantChunk(turn=turn, step=step, chunk=chunk)).seq)

    def _log_held_quietly(
        self,
        held: HeldChunks | None,
        assembler: Assembler,
        turn: int,
        step: int,
        reply: str = "failed",
    ) -> None:
        """:meth:`_log_held` for a stream that failed or was cancelled: what it streamed
        is logged if it can be (as every chunk taken before was); the failure, or the
        interrupted prefix, is what the turn goes on with."""
        if held:
            try:
                self._log_held(held, assembler, turn, step)
            except InvalidEventError:
                log.exception("the %s reply's last chunks cannot be logged", reply)

    async def run(
        self, turn: int, step: int, request: ModelRequest, signal: TurnSignal
    ) -> StepResult:
        session = self.session
        append = session.append_fact
        assembler = Assembler(turn, step)
        limit = reply_bytes(request.max_reply_bytes)
        direct = limit // DIRECT_SHARE  # citation bytes up to which deltas are logged one by one
        held: HeldChunks | None = None  # made once deltas are gathered
        stream: Any = None
        done = False

        def consume(batch: Sequence[Any]) -> StepResult | bool | None:
            """Log one batch: True at the stream's end, a StepResult if the reply is too
            large to log (the call stops), None for more (see ``NextBatch.consume``: the
            stepper calls this for each batch, and resumes the turn only with an answer)."""
            nonlocal held
            if held is None and len(batch) > 2:
                logged = _log_direct(session, assembler, batch, turn, step, direct, limit)
                if logged:
                    batch = batch[logged:]
            for item in batch:
                if isinstance(item, StreamEnd):
                    return True
                if assembler.cited < direct:
                    event = append(AssistantChunk(turn=turn, step=step, chunk=item))
                    assembler.add(item, event.seq)
                else:  # a reply of very many deltas: they are logged gathered
                    if held is None:
                        held = HeldChunks()
                    assembler.take(item)
                    held.hold(item)
                    if held.chars >= _gather_size(assembler, limit):
                        self._log_held(held, assembler, turn, step)
                if assembler.streamed + assembler.cited > limit:  # could never be logged
                    self._log_held_quietly(held, assembler, turn, step)
                    return _too_large(assembler, limit)  # and the call stops
            return None

        try:
            stream = await OpenStream(request)
            while not done:
                batch = _announced(stream)
                answer = consume(batch) if batch is not None else await NextBatch(stream, consume)
                if answer is True:
                    done = True
                elif answer is not None:
                    return answer  # type: ignore[return-value]  # a StepResult
            if held:
                self._log_held(held, assembler, turn, step)
        except TurnAborted:
            # taken before the cancel: part of the visible prefix
            self._log_held_quietly(held, assembler, turn, step, "interrupted")
            visible = assembler.visible()
            if visible:
                try:
                    append(
                        AssistantMessageData(
                            turn=turn,
                            step=step,
                            message=assembler.message(with_calls=False),
                            usage=assembler.usage,
                            interrupted=True,
                            source_event_seqs=tuple(assembler.chunk_seqs),
                        )
                    )
                except InvalidEventError:
                    log.exception("the interrupted reply's visible prefix cannot be logged")
            return StepResult()
        except ModelError as err:
            self._log_held_quietly(held, assembler, turn, step)
            return StepResult(failure=err.failure, error=err)
        except InvalidEventError as err:  # a chunk the log refuses, e.g. over the size limit
            return _unloggable(err)
        except Exception as err:  # noqa: BLE001 - any adapter fault is a request failure
            self._log_held_quietly(held, assembler, turn, step)
            return StepResult(failure=LlmFailure(message=repr(err), code="UNKNOWN"), error=err)
        finally:
            if not done and stream.__class__ is StreamHandle:
                # Abandoned (a failure, an abort, the actor stopping): the model call must
                # not stream on with no reader, holding its connection and limiter slot.
                stream.cancel()
        if assembler.usage is not None:
            for meter in self.meters:
                meter.count_usage(assembler.usage)
        failure = assembler.failure()
        if failure is not None:
            return StepResult(failure=failure, error=ModelError(failure))
        truncated = assembler.finish == "max-tokens"
        calls = [] if truncated else assembler.calls()
        if calls:
            refused = unanswerable(calls, self.max_event_bytes)
            if refused is not None:  # a call nothing could answer: the reply is malformed
                failure = LlmFailure(message=refused)
                return StepResult(failure=failure, error=ModelError(failure))
        try:
            append(
                AssistantMessageData(
                    turn=turn,
                    step=step,
                    message=assembler.message(calls=calls),
                    usage=assembler.usage,
                    finish_reason=assembler.finish,
                    source_event_seqs=tuple(assembler.chunk_seqs),
                )
            )
            call_seqs = [
                append(
                    ToolCallData(
                        turn=turn, step=step, call_id=c.call_id, name=c.name, arguments=c.arguments
                    )
                ).seq
                for c in calls
            ]
        except InvalidEventError as err:  # e.g. a reply over the event size limit
            return _unloggable(err)
        if truncated:
            return StepResult(end=MaxTokens())
        if not calls:
            return DONE
        if self.durability == "write-ahead":
            try:
                await FLUSH
            except DiskFullError as err:  # no tool runs: each call gets an error result
                failure = not_durable(err)
                self.tools.refuse(turn, step, calls, call_seqs, failure.message)
                return StepResult(failure=failure, offer=False)
        try:
            concluded = await self.tools.run(turn, step, calls, call_seqs, signal)
        except Exception as err:
            if self.session.state.open_calls:  # not every call could be answered
                raise
            # Every call got a result (ToolPhase.run): the step closes, the turn ends error.
            failure = LlmFailure(message=f"the tool phase failed: {described(err)}")
            return StepResult(failure=failure, offer=False)
        return DONE if concluded else MORE
