"""Builders of typical session logs, shared by every test of the project.

A :class:`LogBuilder` writes a well-formed log fact by fact, tracking seq, turn and step
for you. Without a session it makes :class:`Event` values directly (seq from
``start_seq``, a fixed ``time``); given a :class:`Session` it appends through it, so
the session assigns seq and time and runs its validation and observers.

The module-level functions add whole typical turns::

    log = LogBuilder()
    completed_turn(log)                  # turn 1: user -> assistant reply
    tool_turn(log)                       # turn 2: tool call + result, then a reply
    open_turn_with_pending_call(log)     # turn 3 left open mid tool dispatch
    assert_invariants(log.events, allow_open_tail=True)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import msgspec

from storage import Codec, EventTypes, MemorySink, Session, SessionHeader, pending_inbox
from storage.events import (
    AgentInboxSpliced,
    AssistantChunk,
    AssistantMessage,
    AssistantMessageData,
    AssistantPart,
    Completed,
    Event,
    InboxLane,
    MessageTrigger,
    RequestConfig,
    RequestHeader,
    StepEnd,
    StepStart,
    SurfaceAppend,
    SurfaceOp,
    SurfaceReplace,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallData,
    ToolError,
    ToolMessage,
    ToolResultData,
    ToolSpec,
    Trigger,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
    UserMessageData,
)

__all__ = [
    "Call",
    "LogBuilder",
    "completed_turn",
    "followup",
    "new_session",
    "open_turn_with_pending_call",
    "ticking_clock",
    "tool_turn",
    "user_message",
]

Call = tuple[str, str, str]
"""``(call_id, tool name, raw JSON arguments)``."""

START_TIME = 1_700_000_000_000


def ticking_clock(start: int = START_TIME, step: int = 1) -> Callable[[], int]:
    """A deterministic clock: ``start``, ``start + step``, … (epoch ms)."""
    counter = itertools.count(start, step)
    return lambda: next(counter)


def new_session(
    events: Iterable[Event] = (),
    *,
    session_id: str = "s-1",
    key: int = 1,
    seed_length: int = 0,
    sink: MemorySink | None = None,
    codec: Codec | None = None,
    clock: Callable[[], int] | None = None,
    last_seq: int | None = None,
) -> Session:
    """A session over a fresh :class:`MemorySink` with a ticking clock."""
    header = SessionHeader(id=session_id, key=key, created=START_TIME, seed_length=seed_length)
    return Session(
        header,
        sink=sink if sink is not None else MemorySink(),
        codec=codec if codec is not None else Codec(EventTypes.default()),
        clock=clock if clock is not None else ticking_clock(),
        events=events,
        last_seq=last_seq,
    )


def user_message(text: str, message_id: str | None = None, source: str = "user") -> UserMessage:
    return UserMessage(id=message_id or f"m-{text}", content=(TextBlock(text=text),), source=source)


class LogBuilder:
    """Writes a well-formed log; every method returns the committed :class:`Event`."""

    def __init__(
        self,
        session: Session | None = None,
        *,
        start_seq: int = 0,
        last_turn: int = 0,
        time: int = START_TIME,
    ) -> None:
        self.session = session
        self.events: list[Event] = []
        self.time = time
        self._next_seq = start_seq if session is None else session.last_seq + 1
        self.turn = last_turn if session is None else session.state.last_turn
        self.step = 0
        self._message_ids = itertools.count(1)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def add(self, type: str, data: object) -> Event:
        if self.session is not None:
            event = self.session.append(type, data)
        else:
            event = Event(type, self._next_seq, self.time, data)
        self._next_seq = event.seq + 1
        self.events.append(event)
        return event

    def facts(self) -> list[tuple[str, object]]:
        """``(type, data)`` of every event built, to append to a session elsewhere."""
        return [(event.type, event.data) for event in self.events]

    # ------------------------------------------------------------------ boundaries

    def turn_start(
        self, trigger: Trigger | None = None, *, durability: Literal["turn", "none"] | None = None
    ) -> Event:
        self.turn += 1
        self.step = 0
        data = TurnStart(turn=self.turn, trigger=trigger or MessageTrigger(), durability=durability)
        return self.add("turn/start", data)

    def turn_end(self, reason: TurnEndReason | None = None) -> Event:
        return self.add("turn/end", TurnEnd(turn=self.turn, reason=reason or Completed()))

    def step_start(self) -> Event:
        self.step += 1
        return self.add("step/start", StepStart(turn=self.turn, step=self.step))

    def step_end(self) -> Event:
        return self.add("step/end", StepEnd(turn=self.turn, step=self.step))

    # ------------------------------------------------------------------ facts

    def splice(
        self,
        target: InboxLane = "next-turn",
        *,
        start: int = 0,
        removed: int = 0,
        inserted: Sequence[UserMessage] = (),
        canceled: bool = False,
    ) -> Event:
        data = AgentInboxSpliced(
            target=target,
            start=start,
            removed_count=removed,
            inserted=tuple(inserted),
            outcome="canceled" if canceled else None,
        )
        return self.add("agent/inbox/spliced", data)

    def user(
        self, text: str = "hello", *, in_step: bool = True, message_id: str | None = None
    ) -> Event:
        message = user_message(text, message_id or f"m-{next(self._message_ids)}")
        if in_step:
            data = UserMessageData(message=message, turn=self.turn, step=self.step)
        else:
            data = UserMessageData(message=message)
        return self.add("user/message", data)

    def header(self, model: str = "scripted", *, tools: Sequence[ToolSpec] = ()) -> Event:
        config = RequestConfig(provider="test", model=model, temperature=0.5)
        data = RequestHeader(turn=self.turn, step=self.step, config=config, tools=tuple(tools))
        return self.add("request/header", data)

    def chunk(self, text: str) -> Event:
        data = AssistantChunk(turn=self.turn, step=self.step, chunk=TextDelta(text=text))
        return self.add("assistant/chunk", data)

    def assistant(
        self,
        text: str = "",
        *,
        calls: Sequence[Call] = (),
        cites: Sequence[int] = (),
        replaces: int | None = None,
    ) -> Event:
        parts: list[AssistantPart] = [TextBlock(text=text)] if text else []
        parts += [ToolCallBlock(call_id=c, name=n, arguments=a) for c, n, a in calls]
        op: SurfaceOp = SurfaceReplace(seq=replaces) if replaces is not None else SurfaceAppend()
        data = AssistantMessageData(
            turn=self.turn,
            step=self.step,
            message=AssistantMessage(content=tuple(parts)),
            finish_reason="tool-calls" if calls else "stop",
            surface_op=op,
            source_event_seqs=tuple(cites),
        )
        return self.add("assistant/message", data)

    def tool_call(self, call_id: str, name: str = "echo", arguments: str = "{}") -> Event:
        data = ToolCallData(
            turn=self.turn, step=self.step, call_id=call_id, name=name, arguments=arguments
        )
        return self.add("tool/call", data)

    def tool_result(
        self,
        call: Event,
        text: str = "ok",
        *,
        error: ToolError | None = None,
        concludes_turn: bool = False,
    ) -> Event:
        call_data: ToolCallData = call.data
        message = ToolMessage(
            call_id=call_data.call_id,
            name=call_data.name,
            content=(TextBlock(text=text),),
            is_error=error is not None,
        )
        data = ToolResultData(
            turn=self.turn,
            step=self.step,
            message=message,
            error=error,
            concludes_turn=concludes_turn,
            source_event_seqs=(call.seq,),
        )
        return self.add("tool/result", data)

    def plugin(self, type: str, data: dict[str, object] | msgspec.Struct) -> Event:
        return self.add(type, data)


# --------------------------------------------------------------------------- turns


def followup(log: LogBuilder, text: str = "hello") -> UserMessage:
    """Append ``text`` to the next-turn lane (the splice a ``followup`` writes)."""
    message = user_message(text, f"inbox-{log.next_seq}")
    log.splice("next-turn", start=len(_lanes(log)[0]), inserted=(message,))
    return message


def _lanes(log: LogBuilder) -> tuple[list[UserMessage], list[UserMessage]]:
    if log.session:
        return log.session.pending_inbox()
    # a seeded prefix's pending inbox is not inherited (as Store.fork's seed_length)
    ends = [e.seq for e in log.events if e.type == "session/end-seed"]
    return pending_inbox(log.events, seed_length=ends[-1] + 1 if ends else 0)


def completed_turn(log: LogBuilder, text: str = "hello", reply: str = "hi there") -> LogBuilder:
    """A followup of ``text``, then a one-step turn over the claimed head of the lane
    (``text`` unless messages were already queued): user message, header, two chunks,
    the reply, completed."""
    followup(log, text)
    claimed = _lanes(log)[0][0]
    log.turn_start()
    log.splice("next-turn", removed=1)
    log.step_start()
    log.add("user/message", UserMessageData(message=claimed, turn=log.turn, step=log.step))
    log.header()
    half = len(reply) // 2
    chunks = [log.chunk(reply[:half]), log.chunk(reply[half:])]
    log.assistant(reply, cites=[c.seq for c in chunks])
    log.step_end()
    log.turn_end()
    return log


def tool_turn(
    log: LogBuilder,
    text: str = "use the tool",
    *,
    calls: Sequence[Call] = (("call-1", "echo", '{"x": 1}'),),
    reply: str = "done",
) -> LogBuilder:
    """Step 1: the model calls tools, each call answered; step 2: the final reply."""
    log.turn_start()
    log.step_start()
    log.user(text)
    log.assistant(calls=calls)
    for call_id, name, arguments in calls:
        call = log.tool_call(call_id, name, arguments)
        log.tool_result(call, f"{name} ran")
    log.step_end()
    log.step_start()
    log.assistant(reply)
    log.step_end()
    log.turn_end()
    return log


def open_turn_with_pending_call(
    log: LogBuilder,
    text: str = "run three tools",
    *,
    durability: Literal["turn", "none"] | None = None,
) -> LogBuilder:
    """A turn cut off mid tool dispatch: the reply asks for calls a, b and c; ``a`` was
    logged and answered, ``b`` logged but unanswered, ``c`` never logged. ``durability``:
    the mode its ``turn/start`` names (``None``: write-ahead)."""
    log.turn_start(durability=durability)
    log.step_start()
    log.user(text)
    log.assistant(calls=[("a", "echo", "{}"), ("b", "write", "{}"), ("c", "echo", "{}")])
    call_a = log.tool_call("a", "echo")
    log.tool_result(call_a)
    log.tool_call("b", "write")
    return log
