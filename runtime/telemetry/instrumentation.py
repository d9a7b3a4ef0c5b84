"""OpenTelemetry spans and metrics from corral's facts (GenAI semantic conventions).

:func:`instrument` listens to a runtime's public events, nothing else: ``session/event``
for the turn, step and tool boundaries and the replies (an ``assistant/chunk`` costs a
type check, and only a step's first one is looked at, for the time to first chunk),
``session/flush`` for when a turn's facts are durable, ``agent/status`` and the inbox
events for two gauges. What it builds:

- a span ``invoke_agent`` per turn (a retry turn is a turn of its own, with
  ``corral.turn.retry_of``); it ends at the ``session/flush`` checkpoint that made the
  turn's ``turn/end`` durable (at ``turn/end`` itself under ``durability="none"``), so
  an exported turn is one the log keeps;
- a span ``chat {model}`` per model request (a step: from ``step/start`` to its
  ``assistant/message``; a step with no reply is a failed request, with ``error.type``);
- a span ``execute_tool {name}`` per tool call (``tool/call`` to ``tool/result``);
- the metrics of :mod:`runtime.telemetry.semconv`.

Message contents are recorded only with ``capture_content=True``. Only
``opentelemetry-api`` is needed: without an SDK every call is a no-op.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import msgspec
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from actors import (
    AgentDisposed,
    AgentStatusChanged,
    InboxClaimed,
    InboxDiscarded,
    InboxInserted,
    SessionEventLive,
    SessionFlush,
)
from storage import (
    Aborted,
    AssistantMessageData,
    Errored,
    Event,
    LlmRetry,
    RequestHeader,
    StepStart,
    ToolCallData,
    ToolResultData,
    TurnEnd,
    TurnStart,
    UserMessageData,
)

from . import semconv as sc

if TYPE_CHECKING:
    from runtime.agent import Agent
    from runtime.runtime import Runtime

__all__ = ["Instrumentation", "instrument"]

_JSON = msgspec.json.Encoder()
Attributes = dict[str, Any]


class _Pending(msgspec.Struct):
    """A step with no reply yet, or a failed one waiting for its error's type."""

    step: int
    start_ns: int
    end_ns: int = 0
    first_chunk: bool = False


class _Turn:
    """The open turn of one agent (touched only under that agent's session order)."""

    __slots__ = ("ctx", "end_seq", "inputs", "outcome", "span", "step", "tools", "turn")

    def __init__(self, turn: int, span: Span) -> None:
        self.turn = turn
        self.span = span
        self.ctx: Context = trace.set_span_in_context(span)
        self.step: _Pending | None = None
        self.tools: dict[str, tuple[int, ToolCallData]] = {}
        self.inputs: list[Any] = []
        self.end_seq = -1  # the seq of its turn/end, once logged
        self.outcome = ""


class _Agent:
    __slots__ = ("failed", "header", "read_header", "turn", "waiting")

    def __init__(self) -> None:
        self.turn: _Turn | None = None
        self.header: RequestHeader | None = None
        # Whether the session's last request/header was read (once: a resumed agent whose
        # configuration did not change logs none before its first request here).
        self.read_header = False
        self.failed: _Pending | None = None  # a step with no reply, in the turn
        self.waiting: list[_Turn] = []  # ended turns whose turn/end is not durable yet


class Instrumentation:
    """What :func:`instrument` installed; :meth:`close` takes it off again."""

    def __init__(
        self,
        rt: Runtime,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        capture_content: bool,
    ) -> None:
        self._tracer = trace.get_tracer(sc.SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(sc.SCOPE, meter_provider=meter_provider)
        self._tokens = meter.create_histogram(
            sc.METRIC_TOKEN_USAGE,
            "{token}",
            "Input and output tokens per model request",
            explicit_bucket_boundaries_advisory=sc.TOKEN_BUCKETS,
        )
        self._duration = meter.create_histogram(
            sc.METRIC_OPERATION_DURATION,
            "s",
            "Duration of a model request",
            explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS,
        )
        self._first_chunk = meter.create_histogram(
            sc.METRIC_TIME_TO_FIRST_CHUNK,
            "s",
            "Time from a request to its first chunk",
            explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS,
        )
        self._turns = meter.create_counter(sc.METRIC_TURNS, "{turn}", "Turns ended, by outcome")
        # The two gauges are observed when a reader collects: the hot path only counts.
        meter.create_observable_gauge(
            sc.METRIC_INBOX_DEPTH,
            [self._observe_depth],
            "{message}",
            "Messages waiting in agents' inboxes",
        )
        meter.create_observable_gauge(
            sc.METRIC_RUNNING_AGENTS,
            [self._observe_running],
            "{agent}",
            "Agents running a turn chain",
        )
        self._capture = capture_content
        self._agents: dict[str, _Agent] = {}
        self._depth: dict[str, int] = {}
        self._waiting = 0  # the sum of _depth
        self._running_ids: set[str] = set()
        self._model_attrs: dict[tuple[str, str], tuple[Attributes, Attributes, Attributes]] = {}
        self._lock = threading.Lock()  # the gauges' bookkeeping (several agents' threads)
        self._disposers: list[Callable[[], None]] = []
        for name, listener in (
            ("session/event", self._on_event),
            ("session/flush", self._on_flush),
            ("agent/status", self._on_status),
            ("agent/inbox/inserted", self._on_inserted),
            ("agent/inbox/claimed", self._on_removed),
            ("agent/inbox/discarded", self._on_removed),
            ("agent/disposed", self._on_disposed),
        ):
            self._disposers.append(rt.on(name, listener))

    def close(self) -> None:
        """Stop listening (idempotent). Spans still open stay unexported."""
        disposers, self._disposers = self._disposers, []
        for dispose in disposers:
            dispose()

    # ------------------------------------------------------------------ session/event

    def _on_event(self, live: SessionEventLive) -> None:
        event: Event = live.event
        kind = event.type
        if kind == "assistant/chunk":  # the hot path: a type check, a flag
            agent = self._agents.get(live.agent.id)
            turn = None if agent is None else agent.turn
            pending = None if turn is None else turn.step
            if pending is not None and not pending.first_chunk:
                pending.first_chunk = True
                elapsed = (time.time_ns() - pending.start_ns) / 1e9
                self._first_chunk.record(elapsed, self._attrs(agent)[0])  # type: ignore[arg-type]
            return
        handler = _HANDLERS.get(kind)
        if handler is not None:
            agent_id = live.agent.id
            agent = self._agents.get(agent_id)
            if agent is None:
                agent = self._agents[agent_id] = _Agent()
            if not agent.read_header and kind == "step/start":
                agent.read_header = True
                if agent.header is None:  # a resumed agent's, from its log
                    handle = cast("Agent", live.agent)
                    agent.header = handle.session.state.last_header
            handler(self, agent_id, agent, event)

    def _turn_start(self, agent_id: str, agent: _Agent, event: Event) -> None:
        data: TurnStart = event.data
        if agent.turn is not None:  # never ended (cannot happen in a checked log)
            self._end_turn(agent, agent.turn, "unknown")
        attributes: Attributes = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
            sc.GEN_AI_AGENT_ID: agent_id,
            sc.GEN_AI_CONVERSATION_ID: agent_id,
            sc.CORRAL_TURN: data.turn,
            sc.CORRAL_TURN_TRIGGER: data.trigger.kind,
        }
        previous = getattr(data.trigger, "previous_turn", None)
        if previous is not None:
            attributes[sc.CORRAL_RETRY_OF] = previous
        span = self._tracer.start_span(
            sc.OP_INVOKE_AGENT,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=time.time_ns(),
        )
        agent.turn = _Turn(data.turn, span)
        if data.durability == "none":
            agent.turn.end_seq = -2  # no checkpoint will come: end at turn/end

    def _header(self, agent_id: str, agent: _Agent, event: Event) -> None:
        agent.header = event.data
        agent.read_header = True

    def _user_message(self, agent_id: str, agent: _Agent, event: Event) -> None:
        if self._capture and agent.turn is not None:
            data: UserMessageData = event.data
            agent.turn.inputs.append(msgspec.to_builtins(data.message))

    def _step_start(self, agent_id: str, agent: _Agent, event: Event) -> None:
        data: StepStart = event.data
        self._close_failed(agent, "unknown")
        if agent.turn is not None:
            agent.turn.step = _Pending(step=data.step, start_ns=time.time_ns())

    def _reply(self, agent_id: str, agent: _Agent, event: Event) -> None:
        data: AssistantMessageData = event.data
        turn = agent.turn
        if turn is None or turn.step is None:
            return
        pending, turn.step = turn.step, None
        now = time.time_ns()
        span = self._chat_span(agent, turn, pending)
        chat_attrs, input_attrs, output_attrs = self._attrs(agent)
        if data.finish_reason is not None:
            reason = sc.FINISH_REASONS.get(data.finish_reason, data.finish_reason)
            span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, (reason,))
        if data.usage is not None:
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, data.usage.input_tokens)
            span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, data.usage.output_tokens)
            self._tokens.record(data.usage.input_tokens, input_attrs)
            self._tokens.record(data.usage.output_tokens, output_attrs)
        if self._capture:
            message = msgspec.to_builtins(data.message)
            span.set_attribute(sc.GEN_AI_OUTPUT_MESSAGES, _JSON.encode([message]).decode())
        if data.interrupted:
            span.set_attribute(sc.ERROR_TYPE, "interrupted")
            self._duration.record((now - pending.start_ns) / 1e9, chat_attrs | _INTERRUPTED)
        else:
            self._duration.record((now - pending.start_ns) / 1e9, chat_attrs)
        span.end(end_time=now)

    def _step_end(self, agent_id: str, agent: _Agent, event: Event) -> None:
        turn = agent.turn
        if turn is not None and turn.step is not None:  # no reply: a failed request
            pending, turn.step = turn.step, None
            pending.end_ns = time.time_ns()
            agent.failed = pending  # its error's type comes with llm/retry or turn/end

    def _tool_call(self, agent_id: str, agent: _Agent, event: Event) -> None:
        if agent.turn is not None:
            data: ToolCallData = event.data
            agent.turn.tools[data.call_id] = (time.time_ns(), data)

    def _tool_result(self, agent_id: str, agent: _Agent, event: Event) -> None:
        turn = agent.turn
        if turn is None:
            return
        data: ToolResultData = event.data
        now = time.time_ns()
        start, call = turn.tools.pop(data.message.call_id, (now, None))
        attributes: Attributes = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: data.message.name,
            sc.GEN_AI_TOOL_CALL_ID: data.message.call_id,
        }
        if self._capture:
            if call is not None:
                attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = call.arguments
            result = msgspec.to_builtins(data.message.content)
            attributes[sc.GEN_AI_TOOL_CALL_RESULT] = _JSON.encode(result).decode()
        span = self._tracer.start_span(
            f"{sc.OP_EXECUTE_TOOL} {data.message.name}",
            context=turn.ctx,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start,
        )
        if data.error is not None:
            span.set_attribute(sc.ERROR_TYPE, data.error.code)
            span.set_status(Status(StatusCode.ERROR, data.error.message))
        span.end(end_time=now)

    def _retry(self, agent_id: str, agent: _Agent, event: Event) -> None:
        data: LlmRetry = event.data
        self._close_failed(agent, data.failure.code)

    def _turn_end(self, agent_id: str, agent: _Agent, event: Event) -> None:
        data: TurnEnd = event.data
        turn = agent.turn
        if turn is None:
            return
        reason = data.reason
        error = (
            reason.error.code
            if isinstance(reason, Errored)
            else "aborted"
            if isinstance(reason, Aborted)
            else None
        )
        self._close_failed(agent, error or reason.kind)
        agent.turn = None
        turn.outcome = reason.kind
        if error is not None:
            turn.span.set_attribute(sc.ERROR_TYPE, error)
        if isinstance(reason, Errored):
            turn.span.set_status(Status(StatusCode.ERROR, reason.error.message))
        if self._capture and turn.inputs:
            turn.span.set_attribute(sc.GEN_AI_INPUT_MESSAGES, _JSON.encode(turn.inputs).decode())
        turn.span.set_attribute(sc.CORRAL_TURN_OUTCOME, reason.kind)
        self._turns.add(1, {sc.CORRAL_TURN_OUTCOME: reason.kind})
        if turn.end_seq == -2:  # durability "none": no checkpoint to wait for
            turn.span.end()
        else:
            turn.end_seq = event.seq
            agent.waiting.append(turn)

    # ------------------------------------------------------------------ the rest

    def _on_flush(self, flushed: SessionFlush) -> None:
        agent = self._agents.get(flushed.agent.id)
        if agent is None or not agent.waiting:
            return
        now = time.time_ns()
        still = [t for t in agent.waiting if t.end_seq > flushed.last_seq]
        for turn in agent.waiting:
            if turn.end_seq <= flushed.last_seq:
                turn.span.end(end_time=now)
        agent.waiting = still

    def _on_status(self, event: AgentStatusChanged) -> None:
        agent_id = event.agent.id
        with self._lock:
            if event.status == "running":
                self._running_ids.add(agent_id)
            else:
                self._running_ids.discard(agent_id)

    def _on_inserted(self, event: InboxInserted) -> None:
        with self._lock:
            self._depth[event.agent.id] = self._depth.get(event.agent.id, 0) + 1
            self._waiting += 1

    def _on_removed(self, event: InboxClaimed | InboxDiscarded) -> None:
        agent_id = event.agent.id
        with self._lock:
            depth = self._depth.get(agent_id, 0)
            if depth == 0:  # inserted before instrument() was called
                return
            if depth == 1:
                del self._depth[agent_id]
            else:
                self._depth[agent_id] = depth - 1
            self._waiting -= 1

    def _observe_depth(self, _: CallbackOptions) -> Iterable[Observation]:
        return (Observation(self._waiting),)

    def _observe_running(self, _: CallbackOptions) -> Iterable[Observation]:
        return (Observation(len(self._running_ids)),)

    def _on_disposed(self, event: AgentDisposed) -> None:
        agent_id = event.agent.id
        with self._lock:
            self._running_ids.discard(agent_id)
            self._waiting -= self._depth.pop(agent_id, 0)
        agent = self._agents.pop(agent_id, None)
        if agent is not None:
            if agent.turn is not None:
                self._end_turn(agent, agent.turn, "agent_disposed")
            for turn in agent.waiting:  # its last flush already ran
                turn.span.end()

    # ------------------------------------------------------------------ helpers

    def _attrs(self, agent: _Agent) -> tuple[Attributes, Attributes, Attributes]:
        """The metric attributes of a request of ``agent``'s model: chat, input, output."""
        header = agent.header
        key = ("", "") if header is None else (header.config.provider, header.config.model)
        cached = self._model_attrs.get(key)
        if cached is None:
            chat: Attributes = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}
            if header is not None:
                chat[sc.GEN_AI_PROVIDER_NAME] = key[0]
                chat[sc.GEN_AI_REQUEST_MODEL] = key[1]
            cached = (
                chat,
                chat | {sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_INPUT},
                chat | {sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_OUTPUT},
            )
            self._model_attrs[key] = cached
        return cached

    def _chat_span(self, agent: _Agent, turn: _Turn, pending: _Pending) -> Span:
        header = agent.header
        attributes: Attributes = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.CORRAL_STEP: pending.step,
        }
        name = sc.OP_CHAT
        if header is not None:
            config = header.config
            name = f"{sc.OP_CHAT} {config.model}"
            attributes[sc.GEN_AI_PROVIDER_NAME] = config.provider
            attributes[sc.GEN_AI_REQUEST_MODEL] = config.model
            if config.temperature is not None:
                attributes[sc.GEN_AI_REQUEST_TEMPERATURE] = config.temperature
            if config.max_tokens is not None:
                attributes[sc.GEN_AI_REQUEST_MAX_TOKENS] = config.max_tokens
            if self._capture and header.system is not None:
                attributes[sc.GEN_AI_SYSTEM_INSTRUCTIONS] = header.system
        return self._tracer.start_span(
            name,
            context=turn.ctx,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=pending.start_ns,
        )

    def _close_failed(self, agent: _Agent, error_type: str) -> None:
        """End the failed request of ``agent``'s turn, if any, with ``error_type``."""
        pending, agent.failed = agent.failed, None
        if pending is None or agent.turn is None:
            return
        span = self._chat_span(agent, agent.turn, pending)
        span.set_attribute(sc.ERROR_TYPE, error_type)
        span.set_status(Status(StatusCode.ERROR))
        chat = self._attrs(agent)[0]
        self._duration.record(
            (pending.end_ns - pending.start_ns) / 1e9, chat | {sc.ERROR_TYPE: error_type}
        )
        span.end(end_time=pending.end_ns)

    def _end_turn(self, agent: _Agent, turn: _Turn, error_type: str) -> None:
        """End ``turn`` as it stands, with ``error_type`` (it never logged its turn/end)."""
        self._close_failed(agent, error_type)
        agent.turn = None
        turn.span.set_attribute(sc.ERROR_TYPE, error_type)
        turn.span.set_status(Status(StatusCode.ERROR))
        turn.span.end()


_INTERRUPTED: Attributes = {sc.ERROR_TYPE: "interrupted"}

_HANDLERS: dict[str, Callable[[Instrumentation, str, _Agent, Event], None]] = {
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
