"""The durable ``hook/run`` fact: one per hook command run, in the agent's session log.

A plugin type (``storage.codec.EventTypes``), registered as ignorable: a reader that does
not know it (``corral log show`` without this plugin) shows it as an ignored plugin
record, with its JSON, instead of failing. It holds what the run did, never its
environment or its whole output: the event, the command line, the exit code, the
decision and its reason (cut at :data:`MAX_REASON_CHARS`), what went wrong, the time.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["HOOK_RUN", "MAX_REASON_CHARS", "HookRun", "clipped"]

HOOK_RUN: Final = "hook/run"
MAX_REASON_CHARS: Final = 4_000


class HookRun(msgspec.Struct, rename="camel", omit_defaults=True, frozen=True, kw_only=True):
    """``hook/run``: one command run for one hook event."""

    event: str
    command: str
    duration_ms: float
    exit_code: int | None = None
    decision: str | None = None
    """``allow``, ``deny``, ``ask``, ``block`` (or absent: no decision)."""
    reason: str | None = None
    context: bool = False
    """The run added context (logged as a user message of source ``plugin``)."""
    updated: bool = False
    """The run rewrote the tool's input (PreToolUse) or output (PostToolUse)."""
    stop: str | None = None
    timed_out: bool = False
    problem: str | None = None
    fail_closed: bool = False
    turn: int | None = None
    call_id: str | None = None


def clipped(text: str | None) -> str | None:
    """``text`` cut to :data:`MAX_REASON_CHARS` characters (None stays None)."""
    if text is None or len(text) <= MAX_REASON_CHARS:
        return text
    return f"{text[:MAX_REASON_CHARS]}... ({len(text) - MAX_REASON_CHARS} more characters)"
