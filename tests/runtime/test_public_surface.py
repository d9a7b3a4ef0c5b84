"""runtime's public surface: every name a user writes, from one import."""

from __future__ import annotations

import ast
from pathlib import Path

import runtime

ROOT = Path(__file__).resolve().parents[2]

# Pinned: a name added to or dropped from runtime's surface is a decision, made here.
PUBLIC = {
    # the facade, the handle, models, tools, policies
    "Agent", "Runtime", "Session", "InboxView", "MessageLike", "Model", "ModelRequest",
    "ScriptedModel", "ToolCall", "Tool", "ToolReturn", "FunctionTool", "tool", "conclude",
    "RetryPolicy", "UsageLimits", "RequestConfig",
    # live payloads and waterfall decisions
    "AgentCreated", "AgentDisposed", "AgentError", "AgentSessionStart", "AgentSettled",
    "AgentStatus", "AgentStatusChanged", "InboxClaimed", "InboxDiscarded", "InboxInserted",
    "PostExecute", "PreExecute", "PreStep", "PreStepDecision", "RequestError",
    "RequestEvent", "SessionEventLive", "ToolExecute", "ToolResultEvent", "TurnStopping",
    "TurnSignal", "Allow", "Deny", "Enter", "Reject", "Retry", "MAX_CAUSE_REASON_CHARS",
    # durable facts a session/event carries
    "Event", "TurnStart", "TurnEnd", "StepStart", "StepEnd", "UserMessageData",
    "AssistantChunk", "AssistantMessageData", "ToolCallData", "ToolResultData", "ToolError",
    "AgentInboxSpliced", "LlmRetry", "RequestHeader", "RequestContext", "LlmFailure", "Usage",
    # messages, content blocks, causes, turn outcomes
    "Message", "MessageId", "UserMessage", "AssistantMessage", "ToolMessage", "ContentBlock",
    "TextBlock", "ReasoningBlock", "ImageBlock", "ToolCallBlock", "ToolResultBlock",
    "InboxLane", "CancelCause", "UserCause", "ParentCause", "HookCause", "DisposedCause",
    "TurnEndReason", "Completed", "Aborted", "Blocked", "Errored", "MaxTokens",
    "Interrupted", "LimitExceeded",
    # errors (the tree: runtime.errors)
    "CorralError", "StorageError", "StoreClosedError", "ReentrantAppendError", "DiskFullError",
    "UnknownSessionError", "EngineError", "AgentStateError", "AgentDisposedError",
    "DuplicateMessageError", "EditTimeoutError", "InboxFullError", "InvalidMessageError",
    "UnknownMessageError", "WaitCycleError", "ModelError", "RuntimeClosedError",
    "ProviderError", "MissingCredentialsError", "UnknownModelError", "SseEventTooLargeError",
    "StreamReportedError", "NotAStreamError", "JsonReplyTooLargeError",
    "PackageShadowedError", "ReplyTimeoutError",
    # one send, one result; fan-in; asyncio (runtime.replies, runtime.aio)
    "Reply", "ReplyStatus", "PendingReply", "as_completed", "gather", "wait_all_idle", "aio",
    # supervised agents (runtime.supervision)
    "RestartPolicy", "AgentRestart",
    # agents as tools (runtime.delegation)
    "AgentTool", "agent_tool",
    # time: the clock protocol and the test clock (Runtime.open(clock=ManualClock()))
    "Clock", "ManualClock",
}  # fmt: skip


def test_runtime_exports_exactly_the_pinned_names() -> None:
    assert set(runtime.__all__) == PUBLIC
    assert len(runtime.__all__) == len(PUBLIC)  # no name listed twice


def test_every_exported_name_resolves() -> None:
    missing = [name for name in runtime.__all__ if not hasattr(runtime, name)]
    assert missing == []


def test_every_error_exported_derives_from_corral_error_but_the_shadowing_one() -> None:
    errors = {
        name: value
        for name in runtime.__all__
        if isinstance(value := getattr(runtime, name), type) and issubclass(value, Exception)
    }
    assert "ModelError" in errors and "PackageShadowedError" in errors
    outside = sorted(n for n, e in errors.items() if not issubclass(e, runtime.CorralError))
    # The shadowing error is raised before storage, which defines CorralError, can be
    # imported.
    assert outside == ["PackageShadowedError"]


def test_provider_errors_keep_their_builtin_bases() -> None:
    for error in (runtime.MissingCredentialsError, runtime.UnknownModelError):
        assert issubclass(error, ValueError)
        assert issubclass(error, runtime.ProviderError)
    assert issubclass(runtime.SseEventTooLargeError, ValueError)
    assert issubclass(runtime.RuntimeClosedError, RuntimeError)


def test_runtime_is_marked_as_typed() -> None:
    assert (ROOT / "runtime" / "py.typed").is_file()


def test_the_examples_import_corral_names_from_runtime_only() -> None:
    past = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                top = node.module.split(".")[0]
                if top in ("storage", "actors") or node.module.startswith("runtime."):
                    past.append(f"{path.name}: from {node.module}")
            elif isinstance(node, ast.Import):
                past += [
                    f"{path.name}: import {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] in ("storage", "actors") or "." in a.name
                ]
    assert past == []
