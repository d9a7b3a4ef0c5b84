"""What the telemetry tap keeps of a turn while it runs: a few timestamps and references
to the facts it saw, nothing the OpenTelemetry SDK is asked for yet.

A turn's spans and measurements are all made in one go once the turn is over (see
:mod:`runtime.telemetry.export`): the tap's work at each boundary is a clock read and an
attribute set, and none of it runs per chunk but the time-to-first-chunk check.
"""

from __future__ import annotations

from typing import Any

import msgspec

from storage import AssistantMessageData, RequestHeader, ToolCallData, ToolResultData

__all__ = ["AgentRecord", "StepRecord", "ToolRecord", "TurnRecord"]


class StepRecord(msgspec.Struct, gc=False):
    """One model request: from its ``step/start`` to its ``assistant/message``, or to
    its ``step/end`` when no reply came (a failed request, ``error`` its type)."""

    step: int
    start_ns: int
    header: RequestHeader | None = None  # the request's configuration, once known
    first_ns: int = 0  # when its first chunk was appended (0: none)
    end_ns: int = 0
    reply: AssistantMessageData | None = None
    error: str | None = None


class ToolRecord(msgspec.Struct, gc=False):
    """One tool call: from its ``tool/call`` to its ``tool/result``."""

    start_ns: int
    call: ToolCallData | None = None
    end_ns: int = 0
    result: ToolResultData | None = None


class TurnRecord(msgspec.Struct, gc=False):
    """One turn (a retry turn is a turn of its own)."""

    turn: int
    trigger: str
    start_ns: int
    retry_of: int | None = None
    no_checkpoint: bool = False  # durability "none": exported at its turn/end
    steps: list[StepRecord] = msgspec.field(default_factory=list)
    tools: dict[str, ToolRecord] = msgspec.field(default_factory=dict)
    inputs: list[Any] = msgspec.field(default_factory=list)  # (capture_content only)
    end_seq: int = -1  # the seq of its turn/end, once logged
    outcome: str = ""  # its TurnEndReason's kind, once ended
    error: str | None = None  # error.type: a failure's code, "aborted", ...
    error_message: str | None = None  # set: the turn's span has status ERROR


class AgentRecord(msgspec.Struct, gc=False):
    """The tap's state of one agent (touched in its session's order, on the thread
    appending to it, and at its ``session/flush`` checkpoint)."""

    base: dict[str, Any]  # its invoke_agent spans' fixed attributes, built once
    turn: TurnRecord | None = None
    step: StepRecord | None = None  # the open step
    awaiting: StepRecord | None = None  # the open step, until its first chunk
    header: RequestHeader | None = None
    # Whether the session's last request/header was read (once: a resumed agent whose
    # configuration did not change logs none before its first request here).
    read_header: bool = False
    waiting: list[TurnRecord] = msgspec.field(default_factory=list)  # ended, not durable
