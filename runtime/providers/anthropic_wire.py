"""The Anthropic Messages wire format: requests out, stream events in.

:func:`message_params` maps a :class:`~actors.model.ModelRequest` to
``messages.create`` arguments: tool calls become ``tool_use`` blocks, tool results
``tool_result`` blocks in a user turn, and consecutive same-role messages are merged as
the API requires. :func:`decode_event` decodes one stream event (``msgspec``) and
:class:`EventMapper` maps those to corral chunks.

``input_tokens`` in the mapped :class:`~storage.events.Usage` counts the whole prompt
(Anthropic's ``input_tokens`` + cache reads + cache writes), as OpenAI's does, so the two
providers' usage adds up the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias

import msgspec

from actors import ModelError, ModelRequest
from storage import (
    FinishChunk,
    FinishReason,
    ImageBlock,
    LlmFailure,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallDelta,
    ToolMessage,
    ToolResultBlock,
    ToolSpec,
    Usage,
    UsageChunk,
    UserMessage,
)

__all__ = [
    "EFFORT_BUDGETS",
    "EventMapper",
    "ThinkingMode",
    "WireEvent",
    "anthropic_messages",
    "anthropic_tools",
    "decode_event",
    "message_params",
    "plain_message_events",
]

ThinkingMode: TypeAlias = Literal["adaptive", "budget"]
Wire: TypeAlias = dict[str, Any]

EFFORT_BUDGETS: Final[Mapping[str, int]] = {
    "minimal": 1024,
    "low": 2048,
    "medium": 8192,
    "high": 24576,
    "xhigh": 32768,
    "max": 65536,
}
"""``thinking.budget_tokens`` per ``reasoning_effort`` in ``budget`` mode."""
_NO_THINKING: Final = frozenset({"none", "off", "disabled"})
_ADAPTIVE_EFFORT: Final[Mapping[str, str]] = {"minimal": "low"}
_MIN_BUDGET: Final = 1024

"""Whether the chunk vocabulary carries thinking signatures (``ReasoningDelta.signature``)."""

_FINISH: Final[Mapping[str, FinishReason]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "refusal": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "max-tokens",
    "model_context_window_exceeded": "max-tokens",
}
"""Anthropic stop reasons; any other is ``error`` (the provider fails the request rather
than take a reply that may be cut short as complete); none at all is ``stop``."""


# --------------------------------------------------------------------------- requests


def _image(block: ImageBlock) -> Wire:
    if block.url:
        return {"type": "image", "source": {"type": "url", "url": block.url}}
    source = {"type": "base64", "media_type": block.media_type or "image/png", "data": block.data}
    return {"type": "image", "source": source}


def _visible(blocks: Sequence[TextBlock | ImageBlock]) -> list[Wire]:
    return [
        {"type": "text", "text": b.text} if isinstance(b, TextBlock) else _image(b)
        for b in blocks
        if not (isinstance(b, TextBlock) and not b.text)  # the API rejects empty text blocks
    ]


def _tool_result(call_id: str, content: Sequence[TextBlock | ImageBlock], is_error: bool) -> Wire:
    block: Wire = {"type": "tool_result", "tool_use_id": call_id}
    parts = _visible(content)
    if parts:
        block["content"] = parts
    if is_error:
        block["is_error"] = True
    return block


def _tool_input(arguments: str) -> Any:
    """The ``input`` object for a logged call; malformed JSON is kept under ``_raw``."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}


def _blocks(message: Message) -> tuple[str, list[Wire]]:
    if isinstance(message, ToolMessage):
        return "user", [_tool_result(message.call_id, message.content, message.is_error)]
    if isinstance(message, UserMessage):
        out: list[Wire] = []
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                out.append(_tool_result(block.call_id, block.content, block.is_error))
            elif isinstance(block, TextBlock | ImageBlock):
                out += _visible([block])
        return "user", out
    assistant: list[Wire] = []
    for part in message.content:
        if isinstance(part, ReasoningBlock):
            if part.signature:  # unsigned thinking cannot be sent back
                assistant.append(
                    {"type": "thinking", "thinking": part.text, "signature": part.signature}
                )
        elif isinstance(part, TextBlock):
            if part.text:
                assistant.append({"type": "text", "text": part.text})
        else:
            assistant.append(
                {
                    "type": "tool_use",
                    "id": part.call_id,
                    "name": part.name,
                    "input": _tool_input(part.arguments),
                }
            )
    return "assistant", assistant


def anthropic_messages(messages: Sequence[Message]) -> list[Wire]:
    """The ``messages`` list: empty messages dropped, consecutive same roles merged,
    tool results first in their user turn."""
    out: list[Wire] = []
    for message in messages:
        role, content = _blocks(message)
        if not content:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(content)
        else:
            out.append({"role": role, "content": content})
    for wire in out:
        if wire["role"] == "user":
            content = wire["content"]
            content.sort(key=lambda b: b["type"] != "tool_result")  # stable: keeps order
    return out


def anthropic_tools(tools: Sequence[ToolSpec]) -> list[Wire]:
    return [
        {
            "name": t.name,
            "description": t.description,
            "input_schema": t.parameters or {"type": "object", "properties": {}},
        }
        for t in tools
    ]


def _thinking(effort: str, max_tokens: int, mode: ThinkingMode) -> Wire:
    if mode == "adaptive":
        level = _ADAPTIVE_EFFORT.get(effort, effort)
        return {"thinking": {"type": "adaptive"}, "output_config": {"effort": level}}
    budget = min(EFFORT_BUDGETS.get(effort, EFFORT_BUDGETS["medium"]), max_tokens - 1)
    if budget < _MIN_BUDGET:
        raise ModelError(
            LlmFailure(
                message=f"reasoning_effort={effort!r} needs max_tokens above {_MIN_BUDGET}, "
                f"got {max_tokens}; raise max_tokens or drop reasoning_effort",
                code="INVALID_REQUEST",
            )
        )
    return {"thinking": {"type": "enabled", "budget_tokens": budget}}


def message_params(
    request: ModelRequest, *, default_max_tokens: int, thinking: ThinkingMode = "adaptive"
) -> dict[str, Any]:
    """The JSON body of a streaming ``POST /v1/messages``."""
    config = request.config
    max_tokens = config.max_tokens or default_max_tokens
    params: dict[str, Any] = {
        "model": config.model,
        "max_tokens": max_tokens,
        "messages": anthropic_messages(request.messages),
        "stream": True,
    }
    if request.system:
        params["system"] = request.system
    if request.tools:
        params["tools"] = anthropic_tools(request.tools)
    if config.temperature is not None:
        params["temperature"] = config.temperature
    if config.stop:
        params["stop_sequences"] = list(config.stop)
    effort = config.reasoning_effort
    if effort and effort not in _NO_THINKING:
        params.update(_thinking(effort, max_tokens, thinking))
    return params


# --------------------------------------------------------------------------- stream


# gc=False: decoded from JSON, so never in a reference cycle; untracked by the collector,
# the structs of every streamed event do not count toward (and trigger) its collections.
class _Block(msgspec.Struct, gc=False):
    type: str = ""
    text: str | None = None
    thinking: str | None = None
    id: str | None = None
    name: str | None = None


class _Delta(msgspec.Struct, gc=False):
    """A content block's delta, or (``message_delta``) the message's stop reason."""

    type: str | None = None
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    partial_json: str | None = None
    stop_reason: str | None = None


class _OutputDetails(msgspec.Struct, gc=False):
    thinking_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    output_tokens_details: _OutputDetails | None = None


class _Message(msgspec.Struct, gc=False):
    usage: _Usage | None = None


class WireEvent(msgspec.Struct, gc=False):
    """One Messages stream event (unknown fields and event types are ignored)."""

    type: str = ""
    index: int | None = None
    message: _Message | None = None
    content_block: _Block | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    error: Any = None


_decoder: Final = msgspec.json.Decoder(WireEvent)


def decode_event(data: bytes) -> WireEvent:
    return _decoder.decode(data)


def plain_message_events(message: Mapping[str, Any]) -> list[WireEvent]:
    """The stream events of a whole non-streamed ``message`` (a server that ignored
    ``stream: true``); ``msgspec.ValidationError`` if a field has a wrong type."""
    events: list[Wire] = [{"type": "message_start", "message": {"usage": message.get("usage")}}]
    content = message.get("content")
    for index, block in enumerate(content if isinstance(content, list) else ()):
        kind = block.get("type") if isinstance(block, Mapping) else None
        start = {"type": kind, "text": block.get("text"), "thinking": block.get("thinking")}
        deltas: list[Wire] = []
        if kind == "tool_use":
            start.update(id=block.get("id"), name=block.get("name"))
            deltas.append(
                {"type": "input_json_delta", "partial_json": json.dumps(block.get("input", {}))}
            )
        elif kind == "thinking" and block.get("signature"):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    stop = {"stop_reason": message.get("stop_reason")}
    events += [{"type": "message_delta", "delta": stop}, {"type": "message_stop"}]
    return [msgspec.convert(event, WireEvent) for event in events]


def _count(tokens: int | None, earlier: int) -> int:
    """``tokens`` if the event gave a count, else ``earlier`` (a negative is none)."""
    return tokens if tokens is not None and tokens >= 0 else earlier


class EventMapper:
    """Maps Messages stream events to corral chunks.

    Tool calls are numbered 0, 1, ... in stream order (Anthropic numbers all content
    blocks); a call streamed without input gets ``{}`` as its arguments.
    """

    def __init__(self) -> None:
        self._tool_of_block: dict[int, int] = {}
        self._tool_has_input: dict[int, bool] = {}
        self.saw_text = False
        self.stopped = False
        self.stop_reason: str | None = None
        self._input = self._cache_read = self._cache_write = 0
        self._output = self._thinking = 0

    @property
    def saw_tool_calls(self) -> bool:
        return bool(self._tool_of_block)

    def _take_usage(self, usage: _Usage | None) -> None:
        """The counts an event gives replace the earlier ones; a missing count, or a
        negative one (malformed: it would lower the usage meters), keeps the earlier."""
        if usage is None:
            return
        self._input = _count(usage.input_tokens, self._input)
        self._output = _count(usage.output_tokens, self._output)
        self._cache_read = _count(usage.cache_read_input_tokens, self._cache_read)
        self._cache_write = _count(usage.cache_creation_input_tokens, self._cache_write)
        details = usage.output_tokens_details
        if details is not None:
            self._thinking = _count(details.thinking_tokens, self._thinking)

    def feed(self, event: WireEvent) -> list[StreamChunk]:
        kind = event.type
        index = event.index if event.index is not None else -1
        if kind == "content_block_delta" and event.delta is not None:
            return self._delta(index, event.delta)
        if kind == "content_block_start" and event.content_block is not None:
            return self._start(index, event.content_block)
        if kind == "content_block_stop":
            tool = self._tool_of_block.get(index)
            if tool is not None and not self._tool_has_input[index]:
                return [ToolCallDelta(index=tool, arguments_delta="{}")]
        elif kind == "message_start" and event.message is not None:
            self._take_usage(event.message.usage)
        elif kind == "message_delta":
            if event.delta is not None and event.delta.stop_reason:
                self.stop_reason = event.delta.stop_reason
            self._take_usage(event.usage)
        elif kind == "message_stop":
            self.stopped = True
        return []

    def _start(self, index: int, block: _Block) -> list[StreamChunk]:
        if block.type == "text" and block.text:
            self.saw_text = True
            return [TextDelta(text=block.text)]
        if block.type == "thinking" and block.thinking:
            return [ReasoningDelta(text=block.thinking)]
        if block.type == "tool_use":
            tool = len(self._tool_of_block)
            self._tool_of_block[index] = tool
            self._tool_has_input[index] = False
            return [ToolCallDelta(index=tool, call_id=block.id, name=block.name)]
        return []  # redacted thinking and server-side tool blocks have no chunk form

    def _delta(self, index: int, delta: _Delta) -> list[StreamChunk]:
        kind = delta.type
        if kind == "text_delta" and delta.text:
            self.saw_text = True
            return [TextDelta(text=delta.text)]
        if kind == "thinking_delta" and delta.thinking:
            return [ReasoningDelta(text=delta.thinking)]
        if kind == "signature_delta" and delta.signature:
            return [ReasoningDelta(text="", signature=delta.signature)]
        if kind == "input_json_delta" and index in self._tool_of_block and delta.partial_json:
            self._tool_has_input[index] = True
            tool = self._tool_of_block[index]
            return [ToolCallDelta(index=tool, arguments_delta=delta.partial_json)]
        return []

    def usage(self) -> Usage:
        return Usage(
            input_tokens=self._input + self._cache_read + self._cache_write,
            output_tokens=self._output,
            cache_read_tokens=self._cache_read,
            cache_write_tokens=self._cache_write,
            reasoning_tokens=self._thinking,
        )

    @property
    def vendor_finish(self) -> str | None:
        return self.stop_reason

    def final_reason(self) -> FinishReason:
        if not self.stop_reason:
            return "tool-calls" if self.saw_tool_calls else "stop"
        return _FINISH.get(self.stop_reason, "error")

    def finish(self) -> list[StreamChunk]:
        return [UsageChunk(usage=self.usage()), FinishChunk(reason=self.final_reason())]
