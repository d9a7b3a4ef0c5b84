"""corral's session facts as ACP ``session/update`` notifications, and prompts as messages.

Live (a prompt's turn, read off ``session/event``): every ``assistant/chunk`` of text is an
``agent_message_chunk``, of reasoning an ``agent_thought_chunk``; a ``tool/call`` is a
``tool_call`` (status ``pending``); its ``tool/result`` a ``tool_call_update``
(``completed`` or ``failed``, with the result's text). Replay (``session/load``): the
model-visible messages instead of their chunks: ``user/message`` as
``user_message_chunk``, ``assistant/message`` as one agent message (and thought) chunk,
then the same tool call facts. Turn boundaries are not updates: a prompt's answer is
its turn's ``stopReason`` (:func:`stop_reason`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from acp import (
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AudioContentBlock,
    EmbeddedResourceContentBlock,
    ImageContentBlock,
    ResourceContentBlock,
    StopReason,
    TextContentBlock,
    TextResourceContents,
    ToolCallStatus,
)

from storage import (
    AssistantChunk,
    AssistantMessageData,
    ImageBlock,
    ReasoningBlock,
    ReasoningDelta,
    TextBlock,
    TextDelta,
    ToolCallData,
    ToolResultData,
    TurnEndReason,
    UserMessageData,
)
from storage import Event as Fact

__all__ = ["PromptBlock", "live_updates", "prompt_content", "replay_updates", "stop_reason"]

PromptBlock = (
    TextContentBlock
    | ImageContentBlock
    | AudioContentBlock
    | ResourceContentBlock
    | EmbeddedResourceContentBlock
)
_STOP: Final[dict[str, StopReason]] = {
    "completed": "end_turn",
    "max-tokens": "max_tokens",
    "limit": "max_turn_requests",
    "aborted": "cancelled",
    "interrupted": "cancelled",
    "blocked": "refusal",
}


class PromptContentError(ValueError):
    """A prompt block corral cannot take (the client was told which it may send)."""


def stop_reason(reason: TurnEndReason) -> StopReason | None:
    """The ACP stop reason of a terminal turn's reason; None for ``error`` (answered as a
    JSON-RPC error: ACP has no stop reason for a failure)."""
    return _STOP.get(reason.kind)


def prompt_content(blocks: Sequence[PromptBlock]) -> list[TextBlock | ImageBlock]:
    """A prompt's blocks as a user message's content: text as text, an image as an image,
    an embedded text resource and a resource link as text naming their URI."""
    content: list[TextBlock | ImageBlock] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            content.append(TextBlock(text=block.text))
        elif isinstance(block, ImageContentBlock):
            content.append(ImageBlock(data=block.data, url=block.uri, media_type=block.mime_type))
        elif isinstance(block, EmbeddedResourceContentBlock):
            resource = block.resource
            if not isinstance(resource, TextResourceContents):
                raise PromptContentError(f"a binary resource ({resource.uri}) is not supported")
            text = f"<resource uri={resource.uri!r}>\n{resource.text}\n</resource>"
            content.append(TextBlock(text=text))
        elif isinstance(block, ResourceContentBlock):
            link = f"<resource-link uri={block.uri!r} name={block.name!r}/>"
            content.append(TextBlock(text=link))
        else:
            raise PromptContentError(f"{block.type} prompt content is not supported")
    if not content:
        raise PromptContentError("the prompt is empty")
    return content


def _call_update(data: ToolCallData) -> Any:
    try:
        raw: Any = json.loads(data.arguments or "{}")
    except ValueError:
        raw = data.arguments
    return start_tool_call(data.call_id, data.name, kind="other", status="pending", raw_input=raw)


def _result_update(data: ToolResultData) -> Any:
    text = "".join(b.text for b in data.message.content if isinstance(b, TextBlock))
    status: ToolCallStatus = "failed" if data.error is not None else "completed"

    return update_tool_call(
        data.message.call_id,
        status=status,
        content=[tool_content(text_block(text))],
        raw_output={"text": text, "error": None if data.error is None else data.error.code},
    )


def live_updates(event: Fact) -> list[Any]:
    """The updates one fact of a running turn streams (most facts stream none)."""
    data = event.data
    if isinstance(data, AssistantChunk):
        chunk = data.chunk
        if isinstance(chunk, TextDelta) and chunk.text:
            return [update_agent_message_text(chunk.text)]
        if isinstance(chunk, ReasoningDelta) and chunk.text:
            return [update_agent_thought_text(chunk.text)]
        return []
    if isinstance(data, ToolCallData):
        return [_call_update(data)]
    if isinstance(data, ToolResultData):
        return [_result_update(data)]
    return []


def replay_updates(event: Fact) -> list[Any]:
    """The updates one fact of a loaded session's history replays."""
    data = event.data
    if isinstance(data, UserMessageData):
        texts = [b.text for b in data.message.content if isinstance(b, TextBlock)]
        return [update_user_message_text(text) for text in texts if text]
    if isinstance(data, AssistantMessageData):
        out: list[Any] = []
        for block in data.message.content:
            if isinstance(block, ReasoningBlock) and block.text:
                out.append(update_agent_thought_text(block.text))
            elif isinstance(block, TextBlock) and block.text:
                out.append(update_agent_message_text(block.text))
        return out
    if isinstance(data, ToolCallData | ToolResultData):
        return live_updates(event)
    return []
