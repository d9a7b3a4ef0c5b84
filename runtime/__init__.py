"""What users touch: the Runtime facade, Agent handle, models, tools, policies, CLI."""

from actors import (
    AgentDisposedError,
    AgentStateError,
    Allow,
    Deny,
    DuplicateMessageError,
    EditTimeoutError,
    Enter,
    InboxFullError,
    InvalidMessageError,
    Model,
    ModelError,
    ModelRequest,
    Reject,
    Retry,
    Tool,
    ToolReturn,
    TurnSignal,
    UnknownMessageError,
    UsageLimits,
    WaitCycleError,
)
from storage.errors import CorralError, ReentrantAppendError, StoreClosedError
from storage.events import (
    DisposedCause,
    HookCause,
    LlmFailure,
    ParentCause,
    RequestConfig,
    TextBlock,
    UserCause,
    UserMessage,
)

from .agent import Agent
from .errors import RuntimeClosedError
from .policy import RetryPolicy
from .runtime import Runtime
from .scripted import ScriptedModel, ToolCall
from .tool import FunctionTool, conclude, tool

__all__ = [
    "Agent",
    "AgentDisposedError",
    "AgentStateError",
    "Allow",
    "CorralError",
    "Deny",
    "DisposedCause",
    "DuplicateMessageError",
    "EditTimeoutError",
    "Enter",
    "FunctionTool",
    "HookCause",
    "InboxFullError",
    "InvalidMessageError",
    "LlmFailure",
    "Model",
    "ModelError",
    "ModelRequest",
    "ParentCause",
    "ReentrantAppendError",
    "Reject",
    "RequestConfig",
    "Retry",
    "RetryPolicy",
    "Runtime",
    "RuntimeClosedError",
    "ScriptedModel",
    "StoreClosedError",
    "TextBlock",
    "Tool",
    "ToolCall",
    "ToolReturn",
    "TurnSignal",
    "UnknownMessageError",
    "UsageLimits",
    "UserCause",
    "UserMessage",
    "WaitCycleError",
    "conclude",
    "tool",
]
