"""Models and tools ``corral acp`` loads in the tests (``--model tests.acp.factories:...``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from runtime import ModelRequest, ScriptedModel, ToolCall, tool
from runtime.acp import needs_permission
from runtime.scripted import last_user_text
from storage import FinishChunk, LlmFailure, TextDelta

NOTES = Path("notes.txt")  # relative: the test runs corral acp in its tmp_path


class SlowModel:
    """Streams a long answer, one word every 20 ms (a cancel lands mid-stream); a
    prompt saying "quick" is echoed at once."""

    chunks_checked = True

    @property
    def provider(self) -> str:
        return "test"

    @property
    def name(self) -> str:
        return "slow"

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | FinishChunk]:
        text = last_user_text(request.messages)
        if "quick" in text:
            yield TextDelta(text=f"echo: {text}")
        else:
            for i in range(500):
                await asyncio.sleep(0.02)
                yield TextDelta(text=f"word{i} ")
        yield FinishChunk(reason="stop")


def slow() -> SlowModel:
    return SlowModel()


def echo_or_fail() -> ScriptedModel:
    """Echoes, but a prompt saying "fail" gets an AUTH failure (never retried)."""

    def reply(request: ModelRequest) -> object:
        text = last_user_text(request.messages)
        return LlmFailure(message="the key was refused", code="AUTH") if "fail" in text else text

    return ScriptedModel(reply, chunks=3)


def note_taker() -> ScriptedModel:
    """Every prompt: a write_note call with the prompt's text, then "noted"."""

    def reply(request: ModelRequest) -> object:
        last = request.messages[-1]
        if getattr(last, "role", None) == "tool":
            return "noted"
        return [ToolCall(name="write_note", arguments={"text": last_user_text(request.messages)})]

    return ScriptedModel(reply, chunks=2)


@tool
def write_note(text: str) -> str:
    """Append a note to notes.txt."""
    with NOTES.open("a", encoding="utf-8") as out:
        out.write(text + "\n")
    return f"wrote {text!r}"


TOOLS = [needs_permission(write_note)]


PLAIN_TOOLS = [write_note]  # gated by name: --ask write_note
