"""What users touch: the Runtime facade, Agent handle, models, tools, policies, CLI."""

from actors.errors import (
    AgentDisposedError,
    AgentStateError,
    DuplicateMessageError,
    EditTimeoutError,
    InboxFullError,
    InvalidMessageError,
    UnknownMessageError,
    WaitCycleError,
)
from actors.limits import UsageLimits
from actors.live import Allow, Deny, Enter, Reject, Retry, TurnSignal
from actors.model import Model, ModelError, ModelRequest
from actors.tools import Tool, ToolReturn
from storage import (
    CorralError,
    DisposedCause,
    HookCause,
    LlmFailure,
    ParentCause,
    ReentrantAppendError,
    RequestConfig,
    StoreClosedError,
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
