"""Frame builders for the two vendor streaming formats the wire server replays.

OpenAI Chat Completions: ``data: {chunk}`` frames then ``data: [DONE]``.
Anthropic Messages: ``event: {type}`` + ``data: {event}`` frames.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = [
    "anthropic_frames",
    "anthropic_reply",
    "openai_chunk",
    "openai_frames",
    "openai_text_reply",
    "openai_tool_reply",
    "openai_usage",
]


# --------------------------------------------------------------------------- OpenAI


def openai_frames(chunks: Sequence[dict[str, Any]], *, done: bool = True) -> list[bytes]:
    frames = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    if done:
        frames.append(b"data: [DONE]\n\n")
    return frames


def openai_chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "test-model",
        "choices": []
        if delta is None and finish is None
        else [{"index": index, "delta": delta or {}, "finish_reason": finish}],
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def openai_usage(
    prompt: int = 11, completion: int = 7, *, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def openai_text_reply(
    *pieces: str,
    reasoning: Sequence[str] = (),
    reasoning_field: str = "reasoning_content",
    finish: str = "stop",
    usage: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    chunks = [openai_chunk({"role": "assistant", "content": ""})]
    chunks += [openai_chunk({reasoning_field: r}) for r in reasoning]
    chunks += [openai_chunk({"content": p}) for p in pieces]
    chunks.append(openai_chunk({}, finish=finish))
    chunks.append(openai_chunk(usage=usage or openai_usage()))
    return chunks


def openai_tool_reply(
    calls: Sequence[tuple[str, str, Sequence[str]]],
    *,
    text: str | None = None,
    finish: str = "tool_calls",
    interleave: bool = True,
) -> list[dict[str, Any]]:
    """Tool calls ``(id, name, argument pieces)``; ``interleave`` alternates their pieces."""
    chunks = [openai_chunk({"role": "assistant", "content": text})]
    for i, (call_id, name, _) in enumerate(calls):
        first = {"index": i, "id": call_id, "type": "function"}
        first["function"] = {"name": name, "arguments": ""}
        chunks.append(openai_chunk({"tool_calls": [first]}))
    longest = max((len(p) for _, _, p in calls), default=0)
    order = (
        [(i, j) for j in range(longest) for i in range(len(calls))]
        if interleave
        else [(i, j) for i in range(len(calls)) for j in range(longest)]
    )
    for i, j in order:
        pieces = calls[i][2]
        if j < len(pieces):
            piece = {"index": i, "function": {"arguments": pieces[j]}}
            chunks.append(openai_chunk({"tool_calls": [piece]}))
    chunks.append(openai_chunk({}, finish=finish))
    chunks.append(openai_chunk(usage=openai_usage()))
    return chunks


# --------------------------------------------------------------------------- Anthropic


def anthropic_frames(events: Sequence[dict[str, Any]]) -> list[bytes]:
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]


def anthropic_reply(
    blocks: Sequence[dict[str, Any]],
    *,
    stop_reason: str = "end_turn",
    input_tokens: int = 20,
    output_tokens: int = 9,
    cache_read: int = 0,
    cache_write: int = 0,
    thinking_tokens: int | None = None,
    complete: bool = True,
) -> list[dict[str, Any]]:
    """Events for content ``blocks``: ``{"text": [...]}``, ``{"thinking": [...],
    "signature": s}``, ``{"tool": (id, name, [json pieces])}``, ``{"redacted": data}``."""
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_test",
                "type": "message",
                "role": "assistant",
                "model": "claude-test",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": input_tokens,
                    "output_tokens": 1,
                    "cache_read_input_tokens": cache_read,
                    "cache_creation_input_tokens": cache_write,
                },
            },
        },
        {"type": "ping"},
    ]
    for index, block in enumerate(blocks):
        events += _anthropic_block(index, block)
    if not complete:
        return events
    usage: dict[str, Any] = {"output_tokens": output_tokens}
    if thinking_tokens is not None:
        usage["output_tokens_details"] = {"thinking_tokens": thinking_tokens}
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": usage,
        }
    )
    events.append({"type": "message_stop"})
    return events


def _anthropic_block(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    def delta(body: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": index, "delta": body}

    events: list[dict[str, Any]] = []
    if "text" in block:
        start = {"type": "text", "text": ""}
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [delta({"type": "text_delta", "text": t}) for t in block["text"]]
    elif "thinking" in block:
        start = {"type": "thinking", "thinking": "", "signature": ""}
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [delta({"type": "thinking_delta", "thinking": t}) for t in block["thinking"]]
        if block.get("signature"):
            events.append(delta({"type": "signature_delta", "signature": block["signature"]}))
    elif "redacted" in block:
        start = {"type": "redacted_thinking", "data": block["redacted"]}
        events.append({"type": "content_block_start", "index": index, "content_block": start})
    else:
        call_id, name, pieces = block["tool"]
        start = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [delta({"type": "input_json_delta", "partial_json": p}) for p in pieces]
    events.append({"type": "content_block_stop", "index": index})
    return events
