"""OpenTelemetry spans and metrics from corral's facts (GenAI semantic conventions).

:func:`instrument` taps the runtime's sessions (:meth:`runtime.Runtime.tap_sessions`:
each append is handed over as it is, with no live event built) and listens to
``session/flush`` for when a turn's facts are durable, and to ``agent/status`` and the
inbox events for two gauges. While a turn runs the tap only notes, at each boundary
(``turn/start``, ``step/start``, ``assistant/message``, ``step/end``, ``tool/call``,
``tool/result``, ``llm/retry``, ``turn/end``), the time and the fact; a chunk costs it
one call that returns at once unless it is its step's first (the time to first chunk).
Once the turn's ``turn/end`` is durable (its ``session/flush`` checkpoint; at
``turn/end`` itself under ``durability="none"``) the whole turn is exported in one go:

- a span ``invoke_agent`` per turn (a retry turn is a turn of its own, with
  ``corral.turn.retry_of``), from its ``turn/start`` to the checkpoint, so an exported
  turn is one the log keeps;
- a span ``chat {model}`` per model request (a step: from ``step/start`` to its
  ``assistant/message``; a step with no reply is a failed request, with ``error.type``);
- a span ``execute_tool {name}`` per tool call (``tool/call`` to ``tool/result``);
- the metrics of :mod:`runtime.telemetry.semconv`.

Message contents are recorded only with ``capture_content=True``. Only
``opentelemetry-api`` is needed: without an SDK every call is a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import msgspec
from opentelemetry import metrics, trace

from actors import AgentDisposed, SessionFlush
from storage import (
    Aborted,
    AssistantMessageData,
    Errored,
    Event,
    LlmRetry,
    StepStart,
    ToolCallData,
    ToolResultData,
    TurnEnd,
    TurnStart,
    UserMessageData,
)

from . import semconv as sc
from .export import TurnExporter
from .gauges import Gauges
from .records import AgentRecord, StepRecord, ToolRecord, TurnRecord

if TYPE_CHECKING:
    from runtime.agent import Agent
    from runtime.runtime import Runtime

__all__ = ["Instrumentation", "instrument"]

_CHUNK = "assistant/chunk"
_now = time.time_ns


class Instrumentation:
    """What :func:`instrument` installed; :meth:`close` takes it off again."""

    def __init__(
        self,
        rt: Runtime,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        capture_content: bool,
    ) -> None:
        self._exporter = TurnExporter(tracer_provider, meter_provider, capture_content)
        self._gauges = Gauges(rt, self._exporter.meter)
        self._capture = capture_content
        self._agents: dict[str, AgentRecord] = {}
        self._disposers: list[Callable[[], None]] = [
            *self._gauges.disposers,
            rt.on("session/flush", self._on_flush),
            rt.on("agent/disposed", self._on_disposed),
            rt.tap_sessions(self._observe),
        ]

    def close(self) -> None:
        """Stop listening (idempotent). Turns not exported yet stay unexported."""
        disposers, self._disposers = self._disposers, []
        for dispose in disposers:
            dispose()

    # ------------------------------------------------------------------ the tap

    def _observe(self, handle: Agent, event: Event) -> None:
        kind = event.type
        if kind == _CHUNK:  # the hot path: one attribute read, on a step's first a clock
            agent = self._agents.get(handle.id)
            if agent is not None and agent.awaiting is not None:
                agent.awaiting.first_ns = _now()
                agent.awaiting = None
            return
        handler = _HANDLERS.get(kind)
        if handler is None:
            return
        agent_id = handle.id
        agent = self._agents.get(agent_id)
        if agent is None:
            agent = self._agents[agent_id] = AgentRecord(base=_invoke_attributes(agent_id))
        handler(self, handle, agent, event)

    def _turn_start(self, handle: Agent, agent: AgentRecord, event: Event) -> None:
        data: TurnStart = event.data
        if agent.turn is not None:  # never ended (cannot happen in a checked log)
            self._abandon(agent, "unknown")
        agent.turn = TurnRecord(
            turn=data.turn,
            trigger=data.trigger.kind,
            start_ns=_now(),
            retry_of=getattr(data.trigger, "previous_turn", None),
            no_checkpoint=data.durability == "none",
        )

    def _header(self, handle: Agent, agent: AgentRecord, event: Event) -> None:
        agent.header = event.data
        agent.read_header = True
        step = agent.step
        if step is not None:  # the header of the open step's request
            step.header = agent.header

    def _user_message(self, handle: Agent, agent: AgentRecord, event: Event) -> None:
        if self._capture and agent.turn is not None:
            data: UserMessageData = event.data
            agent.turn.inputs.append(msgspec.to_builtins(data.message))

    def _step_start(self, handle: Agent, agent: AgentRecord, event: Event) -> None:
        turn = agent.turn
        if turn is None:
            return
        if not agent.read_header:
            agent.read_header = True
            if agent.header is None:  # a resumed agent's, from its log
                agent.header = handle.session.state.last_header
        data: StepStart = event.data
        step = agent.step = agent.awaiting = StepRecord(
            step=data.step, start_ns=_now(), header=agent.header
        )
        turn.steps.append(step)

    def _reply(self, handle: Agent, agent: AgentRecord, event: Event) -> None:
        step = agent.step
        if step is None or step.reply is not None:
            return
        step.end_ns = _now()
        step.reply = cast(AssistantMessageData, event.data)
        agent.awaiting = None

    def _step_end(self, handle: Agent, agent: AgentRecord, event: Event) -> None:
        step = agent.step
        if step is None:
            return
        agent.step = agent.awaiting = None
        if step.reply is None:  # no reply: a failed request; its type comes later
            step.end_ns = _now()

    def _tool_call(self, handle: Agent, agent: AgentRecord, event: Event) -> None:
        if agent.turn is not None:
            data: ToolCallData = event.data
            agent.turn.tools[data.call_id] = ToolRecord(start_ns=_now(), call=data)

    def _tool_result(self, handle: Agent, agent: AgentRecord, event: Event) -> None:
        turn = agent.turn
        if turn is None:
            return
        now = _now()
        data: ToolResultData = event.data
        call_id = data.message.call_id
        call = turn.tools.get(call_id)
        if call is None:  # (a result with no call seen here: a zero-length span)
            call = turn.tools[call_id] = ToolRecord(start_ns=now)
        call.end_ns = now
        call.result = data

    def _retry(self, handle: Agent, agent: AgentRecord, event: Event) -> None:
        data: LlmRetry = event.data
        _fail_requests(agent, data.failure.code)

    def _turn_end(self, handle: Agent, agent: AgentRecord, event: Event) -> None:
        turn = agent.turn
        if turn is None:
            return
        data: TurnEnd = event.data
        reason = data.reason
        if isinstance(reason, Errored):
            turn.error = reason.error.code
            turn.error_message = reason.error.message
        elif isinstance(reason, Aborted):
            turn.error = "aborted"
        _fail_requests(agent, turn.error or reason.kind)
        agent.turn = None
        turn.outcome = reason.kind
        self._exporter.count(reason.kind)
        if turn.no_checkpoint:  # durability "none": no checkpoint to wait for
            self._exporter.export(agent.base, turn, _now())
        else:
            turn.end_seq = event.seq
            agent.waiting.append(turn)

    # ------------------------------------------------------------------ the rest

    def _on_flush(self, flushed: SessionFlush) -> None:
        agent = self._agents.get(flushed.agent.id)
        if agent is None or not agent.waiting:
            return
        now = _now()
        last = flushed.last_seq
        waiting = agent.waiting
        agent.waiting = [t for t in waiting if t.end_seq > last]
        for turn in waiting:
            if turn.end_seq <= last:
                self._exporter.export(agent.base, turn, now)

    def _on_disposed(self, event: AgentDisposed) -> None:
        self._gauges.disposed(event)
        agent = self._agents.pop(event.agent.id, None)
        if agent is not None:
            if agent.turn is not None:
                self._abandon(agent, "agent_disposed")
            now = _now()
            for turn in agent.waiting:  # its last flush already ran
                self._exporter.export(agent.base, turn, now)

    def _abandon(self, agent: AgentRecord, error_type: str) -> None:
        """Export the open turn of ``agent`` as it stands (it never logged its turn/end)."""
        turn = agent.turn
        assert turn is not None
        _fail_requests(agent, error_type)
        agent.turn = agent.step = agent.awaiting = None
        turn.error = error_type
        turn.error_message = ""
        self._exporter.export(agent.base, turn, _now())


def _fail_requests(agent: AgentRecord, error_type: str) -> None:
    """Give ``error_type`` to the open turn's failed requests that have none yet."""
    turn = agent.turn
    if turn is None:
        return
    now = _now()
    for step in turn.steps:
        if step.reply is None and step.error is None:
            step.error = error_type
            if not step.end_ns:  # (still open: the turn ends under it)
                step.end_ns = now


def _invoke_attributes(agent_id: str) -> dict[str, Any]:
    return {
        sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
        sc.GEN_AI_AGENT_ID: agent_id,
        sc.GEN_AI_CONVERSATION_ID: agent_id,
    }


_HANDLERS: dict[str, Callable[[Instrumentation, Agent, AgentRecord, Event], None]] = {
    "turn/start": Instrumentation._turn_start,
    "request/header": Instrumentation._header,
    "user/message": Instrumentation._user_message,
    "step/start": Instrumentation._step_start,
    "assistant/message": Instrumentation._reply,
    "step/end": Instrumentation._step_end,
    "tool/call": Instrumentation._tool_call,
    "tool/result": Instrumentation._tool_result,
    "llm/retry": Instrumentation._retry,
    "turn/end": Instrumentation._turn_end,
}


def instrument(
    rt: Runtime,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    capture_content: bool = False,
) -> Instrumentation:
    """Turn ``rt``'s turns, model requests and tool calls into OpenTelemetry spans and
    metrics (the global providers unless given). ``capture_content=True`` also records
    message contents, system instructions and tool arguments and results (off by
    default: they may hold personal data). Returns the :class:`Instrumentation`, whose
    ``close()`` stops it."""
    return Instrumentation(rt, tracer_provider, meter_provider, capture_content)
