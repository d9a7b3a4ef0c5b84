"""A finished turn made into OpenTelemetry spans and measurements, in one go.

The spans are created with explicit start and end times from what the tap recorded
(:mod:`runtime.telemetry.records`), each with all its attributes at creation (no later
``set_attribute``: the SDK cleans and locks per call). Attributes that do not change
are built once and reused: an agent's ``invoke_agent`` attributes once per agent, a
model's span and metric attributes once per request configuration. ``corral.turns`` is
an observable counter, read from plain counts when a reader collects: a turn costs it
one dict update, not a measurement.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import msgspec
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode

from storage import RequestConfig, RequestHeader, ToolResultData

from . import semconv as sc
from .records import StepRecord, ToolRecord, TurnRecord

__all__ = ["ModelAttributes", "TurnExporter"]

_JSON = msgspec.json.Encoder()
Attributes = dict[str, Any]
_ERROR = Status(StatusCode.ERROR)


class ModelAttributes:
    """The attributes of one request configuration's ``chat`` spans and measurements."""

    __slots__ = ("chat", "errors", "input", "output", "span", "span_name")

    def __init__(self, header: RequestHeader | None, capture: bool) -> None:
        chat: Attributes = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}
        span: Attributes = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}
        self.span_name = sc.OP_CHAT
        if header is not None:
            config = header.config
            self.span_name = f"{sc.OP_CHAT} {config.model}"
            chat[sc.GEN_AI_PROVIDER_NAME] = span[sc.GEN_AI_PROVIDER_NAME] = config.provider
            chat[sc.GEN_AI_REQUEST_MODEL] = span[sc.GEN_AI_REQUEST_MODEL] = config.model
            if config.temperature is not None:
                span[sc.GEN_AI_REQUEST_TEMPERATURE] = config.temperature
            if config.max_tokens is not None:
                span[sc.GEN_AI_REQUEST_MAX_TOKENS] = config.max_tokens
            if capture and header.system is not None:
                span[sc.GEN_AI_SYSTEM_INSTRUCTIONS] = header.system
        self.span = span
        self.chat = chat  # gen_ai.client.operation.duration, time to first chunk
        self.input = chat | {sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_INPUT}
        self.output = chat | {sc.GEN_AI_TOKEN_TYPE: sc.TOKEN_OUTPUT}
        self.errors: dict[str, Attributes] = {}  # error.type -> chat | {error.type: it}

    def failed(self, error_type: str) -> Attributes:
        """The duration's attributes of a request that failed with ``error_type``."""
        attributes = self.errors.get(error_type)
        if attributes is None:
            attributes = self.errors[error_type] = self.chat | {sc.ERROR_TYPE: error_type}
        return attributes


class TurnExporter:
    """The instruments, and :meth:`export`, which turns a :class:`TurnRecord` into its
    spans and measurements."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        capture_content: bool,
    ) -> None:
        self._tracer = trace.get_tracer(sc.SCOPE, tracer_provider=tracer_provider)
        self.meter = meter = metrics.get_meter(sc.SCOPE, meter_provider=meter_provider)
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
        meter.create_observable_counter(
            sc.METRIC_TURNS, [self._observe_turns], "{turn}", "Turns ended, by outcome"
        )
        self.capture = capture_content
        self._outcomes: dict[str, int] = {}
        self._outcome_attrs: dict[str, Attributes] = {}
        self._counting = threading.Lock()  # turns end on several agents' threads
        self._models: dict[tuple[RequestConfig, str | None] | None, ModelAttributes] = {}

    # ------------------------------------------------------------------ attributes

    def model(self, header: RequestHeader | None) -> ModelAttributes:
        """The (shared) attributes of requests made with ``header``'s configuration."""
        key = None if header is None else (header.config, header.system if self.capture else None)
        attributes = self._models.get(key)
        if attributes is None:
            attributes = self._models[key] = ModelAttributes(header, self.capture)
        return attributes

    def count(self, outcome: str) -> None:
        """One more turn ended with ``outcome`` (``corral.turns``)."""
        with self._counting:
            self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1

    def _observe_turns(self, _: CallbackOptions) -> Iterable[Observation]:
        with self._counting:
            counts = list(self._outcomes.items())
        attrs = self._outcome_attrs
        for outcome, _n in counts:
            if outcome not in attrs:
                attrs[outcome] = {sc.CORRAL_TURN_OUTCOME: outcome}
        return [Observation(n, attrs[outcome]) for outcome, n in counts]

    # ------------------------------------------------------------------ export

    def export(self, base: Attributes, turn: TurnRecord, end_ns: int) -> None:
        """``turn``'s spans (``invoke_agent`` from its start to ``end_ns``, its ``chat``
        and ``execute_tool`` children) and its requests' measurements."""
        attributes = base | {sc.CORRAL_TURN: turn.turn, sc.CORRAL_TURN_TRIGGER: turn.trigger}
        if turn.outcome:  # (a turn that never ended has none)
            attributes[sc.CORRAL_TURN_OUTCOME] = turn.outcome
        if turn.retry_of is not None:
            attributes[sc.CORRAL_RETRY_OF] = turn.retry_of
        if turn.error is not None:
            attributes[sc.ERROR_TYPE] = turn.error
        if self.capture and turn.inputs:
            attributes[sc.GEN_AI_INPUT_MESSAGES] = _JSON.encode(turn.inputs).decode()
        span = self._tracer.start_span(
            sc.OP_INVOKE_AGENT,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=turn.start_ns,
        )
        if turn.error_message is not None:
            span.set_status(
                _ERROR if not turn.error_message else Status(StatusCode.ERROR, turn.error_message)
            )
        context = trace.set_span_in_context(span)
        for step in turn.steps:
            self._chat(step, context)
        for call in turn.tools.values():
            if call.result is not None:  # (a call a turn never answered has no span)
                self._tool(call, call.result, context)
        span.end(end_time=end_ns)

    def _chat(self, step: StepRecord, context: Any) -> None:
        model = self.model(step.header)
        attributes = model.span | {sc.CORRAL_STEP: step.step}
        reply = step.reply
        error = step.error
        seconds = (step.end_ns - step.start_ns) / 1e9
        if reply is not None:
            if reply.finish_reason is not None:
                reason = sc.FINISH_REASONS.get(reply.finish_reason, reply.finish_reason)
                attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (reason,)
            usage = reply.usage
            if usage is not None:
                attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] = usage.input_tokens
                attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = usage.output_tokens
                self._tokens.record(usage.input_tokens, model.input)
                self._tokens.record(usage.output_tokens, model.output)
            if self.capture:
                message = msgspec.to_builtins(reply.message)
                attributes[sc.GEN_AI_OUTPUT_MESSAGES] = _JSON.encode([message]).decode()
            if reply.interrupted:
                error = "interrupted"
        elif error is None:
            error = "unknown"
        if error is not None:
            attributes[sc.ERROR_TYPE] = error
            self._duration.record(seconds, model.failed(error))
        else:
            self._duration.record(seconds, model.chat)
        if step.first_ns:
            self._first_chunk.record((step.first_ns - step.start_ns) / 1e9, model.chat)
        span = self._tracer.start_span(
            model.span_name,
            context=context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=step.start_ns,
        )
        if reply is None:  # a failed request (an interrupted reply is not an error status)
            span.set_status(_ERROR)
        span.end(end_time=step.end_ns)

    def _tool(self, call: ToolRecord, result: ToolResultData, context: Any) -> None:
        name, call_id = result.message.name, result.message.call_id
        attributes: Attributes = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: name,
            sc.GEN_AI_TOOL_CALL_ID: call_id,
        }
        error = result.error
        if error is not None:
            attributes[sc.ERROR_TYPE] = error.code
        if self.capture:
            if call.call is not None:
                attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = call.call.arguments
            content = msgspec.to_builtins(result.message.content)
            attributes[sc.GEN_AI_TOOL_CALL_RESULT] = _JSON.encode(content).decode()
        span = self._tracer.start_span(
            f"{sc.OP_EXECUTE_TOOL} {name}",
            context=context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=call.start_ns,
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error.message))
        span.end(end_time=call.end_ns)
