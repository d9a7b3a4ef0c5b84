"""The OpenAI Chat Completions wire format: requests out, stream chunks in.

Pure functions and a small state machine, no I/O: :func:`chat_params` maps a
:class:`~actors.model.ModelRequest` to ``chat.completions.create`` arguments;
:func:`decode_chunk` decodes one ``chat.completion.chunk`` event (``msgspec``, unknown
fields ignored) and :class:`ChunkMapper` maps those to corral's
:data:`~storage.events.StreamChunk` vocabulary.

Compatible servers differ in small ways, handled here: DeepSeek/vLLM stream reasoning as
``delta.reasoning_content`` and OpenRouter/Ollama as ``delta.reasoning``; some servers
report ``finish_reason: "stop"`` after tool calls; DeepSeek reports cache hits as
``usage.prompt_cache_hit_tokens``. A finish reason saying the server failed mid-reply
(OpenRouter's ``error``, vLLM's ``abort``, ...) or one not known here maps to ``error``:
the provider fails the request instead of taking a reply that may be cut short as
complete (:func:`~.failures.finished_with_error`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias

import msgspec

from actors import ModelRequest
from storage import (
    AssistantMessage,
    FinishChunk,
    FinishReason,
    ImageBlock,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultBlock,
    ToolSpec,
    Usage,
    UsageChunk,
    UserMessage,
)

__all__ = [
    "ChunkMapper",
    "MaxTokensField",
    "WireChunk",
    "chat_messages",
    "chat_params",
    "chat_tools",
    "decode_chunk",
]

MaxTokensField: TypeAlias = Literal["max_tokens", "max_completion_tokens"]
WireMessage: TypeAlias = dict[str, Any]

_FINISH: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "end_turn": "stop",
    "content_filter": "stop",
    "eos": "stop",  # text-generation-inference, older vLLM
    "eos_token": "stop",
    "stop_sequence": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "max-tokens",
    "max_tokens": "max-tokens",
    "model_length": "max-tokens",  # Mistral: the model's context is full
}
"""Vendor finish reasons; any other (``error``, ``abort``, an unknown one) is ``error``."""
ERROR_PREFIX: Final = "Error: "


# --------------------------------------------------------------------------- requests


def image_url(block: ImageBlock) -> str:
    if block.url:
        return block.url
    return f"data:{block.media_type or 'image/png'};base64,{block.data or ''}"


def _image_part(block: ImageBlock) -> WireMessage:
    return {"type": "image_url", "image_url": {"url": image_url(block)}}


def _user_content(blocks: Sequence[TextBlock | ImageBlock]) -> str | list[WireMessage]:
    """A plain string when there are only texts (what every server accepts), else parts."""
    if all(isinstance(b, TextBlock) for b in blocks):
        return "\n".join(b.text for b in blocks if isinstance(b, TextBlock))
    return [
        {"type": "text", "text": b.text} if isinstance(b, TextBlock) else _image_part(b)
        for b in blocks
    ]


def _tool_text(content: Sequence[TextBlock | ImageBlock], is_error: bool) -> str:
    text = "\n".join(b.text for b in content if isinstance(b, TextBlock))
    if any(isinstance(b, ImageBlock) for b in content):
        text = f"{text}\n[image attached below]" if text else "[image attached below]"
    if is_error and not text.lower().startswith("error"):
        text = ERROR_PREFIX + text
    return text


class _Builder:
    """Accumulates wire messages; images from tool results follow the tool messages."""

    def __init__(self, send_reasoning: bool) -> None:
        self.out: list[WireMessage] = []
        self.send_reasoning = send_reasoning
        self._pending_images: list[WireMessage] = []

    def _flush_images(self) -> None:
        if self._pending_images:
            parts = [{"type": "text", "text": "Images returned by the tool calls above:"}]
            self.out.append({"role": "user", "content": parts + self._pending_images})
            self._pending_images = []

    def tool(self, call_id: str, content: Sequence[TextBlock | ImageBlock], is_error: bool) -> None:
        self.out.append(
            {"role": "tool", "tool_call_id": call_id, "content": _tool_text(content, is_error)}
        )
        self._pending_images.extend(_image_part(b) for b in content if isinstance(b, ImageBlock))

    def user(self, message: UserMessage) -> None:
        visible: list[TextBlock | ImageBlock] = []
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                self.tool(block.call_id, block.content, block.is_error)
            elif isinstance(block, TextBlock | ImageBlock):
                visible.append(block)
            # reasoning and tool-call blocks in a user message have no Chat form: skipped
        if visible:
            self._flush_images()
            self.out.append({"role": "user", "content": _user_content(visible)})

    def assistant(self, message: AssistantMessage) -> None:
        self._flush_images()
        text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
        calls = [
            {
                "id": b.call_id,
                "type": "function",
                "function": {"name": b.name, "arguments": b.arguments},
            }
            for b in message.content
            if isinstance(b, ToolCallBlock)
        ]
        wire: WireMessage = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            wire["tool_calls"] = calls
        if self.send_reasoning:
            reasoning = "".join(b.text for b in message.content if isinstance(b, ReasoningBlock))
            if reasoning:
                wire["reasoning_content"] = reasoning
        self.out.append(wire)

    def finish(self) -> list[WireMessage]:
        self._flush_images()
        return self.out


def chat_messages(
    system: str | None, messages: Sequence[Message], *, send_reasoning: bool = False
) -> list[WireMessage]:
    """The Chat Completions ``messages`` list for a corral history."""
    builder = _Builder(send_reasoning)
    if system:
        builder.out.append({"role": "system", "content": system})
    for message in messages:
        if isinstance(message, UserMessage):
            builder.user(message)
        elif isinstance(message, AssistantMessage):
            builder.assistant(message)
        else:
            builder.tool(message.call_id, message.content, message.is_error)
    return builder.finish()


def chat_tools(tools: Sequence[ToolSpec]) -> list[WireMessage]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters or {"type": "object", "properties": {}},
            },
        }
        for t in tools
    ]


def chat_params(
    request: ModelRequest,
    *,
    max_tokens_field: MaxTokensField = "max_tokens",
    send_reasoning: bool = False,
    include_usage: bool = True,
) -> dict[str, Any]:
    """The JSON body of a streaming ``POST /chat/completions``."""
    config = request.config
    params: dict[str, Any] = {
        "model": config.model,
        "messages": chat_messages(request.system, request.messages, send_reasoning=send_reasoning),
        "stream": True,
    }
    if include_usage:
        params["stream_options"] = {"include_usage": True}
    if request.tools:
        params["tools"] = chat_tools(request.tools)
    if config.temperature is not None:
        params["temperature"] = config.temperature
    if config.max_tokens is not None:
        params[max_tokens_field] = config.max_tokens
    if config.stop:
        params["stop"] = list(config.stop)
    if config.reasoning_effort:
        params["reasoning_effort"] = config.reasoning_effort
    return params


# --------------------------------------------------------------------------- stream


class _ToolIndexes:
    """Vendor tool-call indexes to corral's, kept equal unless a server reuses an index.

    Invariant: a corral index names one call id for the whole stream.
    """

    def __init__(self) -> None:
        self._by_vendor: dict[int, int] = {}
        self._ids: dict[int, str | None] = {}
        self._last: int | None = None

    def _new(self, preferred: int | None) -> int:
        index = preferred
        if index is None or index in self._ids:
            index = max(self._ids, default=-1) + 1
        self._ids[index] = None
        return index

    def resolve(self, vendor: int | None, call_id: str | None) -> int:
        index: int | None
        if vendor is None:  # some servers omit the index: a new id starts a new call
            last = self._last
            same = last is not None and (call_id is None or self._ids[last] in (None, call_id))
            index = last if same else None
        else:
            index = self._by_vendor.get(vendor)
            if index is not None and call_id and self._ids[index] not in (None, call_id):
                index = None  # the server reused an index for another call
        if index is None:
            index = self._new(vendor)
            if vendor is not None:
                self._by_vendor[vendor] = index
        if call_id:
            self._ids[index] = call_id
        self._last = index
        return index

    def __bool__(self) -> bool:
        return bool(self._ids)


# gc=False: decoded from JSON, so never in a reference cycle; untracked by the collector,
# the structs of every streamed event do not count toward (and trigger) its collections.
class _Function(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | None = None


class _ToolCallPart(msgspec.Struct, gc=False):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCallPart] | None = None


class _Choice(msgspec.Struct, gc=False):
    index: int | None = 0
    delta: _Delta | None = None
    message: _Delta | None = None  # a non-streamed ``chat.completion``'s whole reply
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None


class _CompletionDetails(msgspec.Struct, gc=False):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None
    prompt_cache_hit_tokens: int | None = None  # DeepSeek


class WireChunk(msgspec.Struct, gc=False):
    """One ``chat.completion.chunk`` (or an ``{"error": …}`` event), or a whole
    non-streamed ``chat.completion`` (its choices carry ``message`` for ``delta``)."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None


_decoder: Final = msgspec.json.Decoder(WireChunk)


def decode_chunk(data: bytes) -> WireChunk:
    """Decode one event's JSON; ``msgspec.ValidationError`` if a field has a wrong type."""
    return _decoder.decode(data)


def _count(tokens: int | None) -> int | None:
    """A token count; a negative one is malformed and taken as missing (``None``)."""
    return tokens if tokens is not None and tokens >= 0 else None


def usage_from(usage: _Usage) -> Usage:
    """Corral's usage; a missing or negative count is 0 (a negative one would lower the
    usage meters, and ``UsageLimits`` would never trigger)."""
    prompt = usage.prompt_tokens_details
    completion = usage.completion_tokens_details
    cached = _count(prompt.cached_tokens) if prompt else None
    cache_read = cached or _count(usage.prompt_cache_hit_tokens) or 0
    return Usage(
        input_tokens=_count(usage.prompt_tokens) or 0,
        output_tokens=_count(usage.completion_tokens) or 0,
        cache_read_tokens=cache_read,
        cache_write_tokens=(_count(prompt.cache_write_tokens) if prompt else None) or 0,
        reasoning_tokens=(_count(completion.reasoning_tokens) if completion else None) or 0,
    )


class ChunkMapper:
    """Maps ``ChatCompletionChunk`` values (first choice only) to corral chunks.

    ``input_tokens`` counts the whole prompt, cached tokens included (OpenAI's
    ``prompt_tokens``).
    """

    def __init__(self) -> None:
        self._tools = _ToolIndexes()
        self.saw_text = False
        self.finish_reason: FinishReason | None = None
        self.vendor_finish: str | None = None
        self.usage: Usage | None = None

    def feed(self, chunk: WireChunk) -> list[StreamChunk]:
        out: list[StreamChunk] = []
        if chunk.usage is not None:
            self.usage = usage_from(chunk.usage)
        for choice in chunk.choices or ():
            if choice.index:  # n > 1: only the first choice is the reply
                continue
            delta = choice.delta if choice.delta is not None else choice.message
            if delta is not None:
                reasoning = delta.reasoning_content or delta.reasoning
                if reasoning:
                    out.append(ReasoningDelta(text=reasoning))
                for text in (delta.content, delta.refusal):
                    if text:
                        self.saw_text = True
                        out.append(TextDelta(text=text))
                for call in delta.tool_calls or ():
                    function = call.function
                    out.append(
                        ToolCallDelta(
                            index=self._tools.resolve(call.index, call.id),
                            call_id=call.id or None,
                            name=(function.name if function else None) or None,
                            arguments_delta=(function.arguments if function else None) or "",
                        )
                    )
            if choice.finish_reason:
                self.vendor_finish = choice.finish_reason
                self.finish_reason = _FINISH.get(choice.finish_reason, "error")
        return out

    @property
    def saw_tool_calls(self) -> bool:
        return bool(self._tools)

    def final_reason(self) -> FinishReason:
        """The finish reason, with ``stop`` after tool calls read as ``tool-calls``."""
        reason = self.finish_reason or "stop"
        if reason == "stop" and self.saw_tool_calls:
            return "tool-calls"
        return reason

    def finish(self) -> list[StreamChunk]:
        out: list[StreamChunk] = []
        if self.usage is not None:
            out.append(UsageChunk(usage=self.usage))
        out.append(FinishChunk(reason=self.final_reason()))
        return out
