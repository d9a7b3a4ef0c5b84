"""The durable session vocabulary: every fact an agent's session records.

One tagged ``msgspec.Struct`` per fact. Durable JSON uses the seeds' field names
(camelCase: ``sourceEventSeqs``, ``surfaceOp``, ``removedCount``, ``concludesTurn``)
while Python attributes are snake_case (``rename="camel"``).

Schema evolution rules (msgspec's): new fields get defaults; fields are never
reordered, retyped or removed. A new fact type gets a new ``type`` string.

Every fact is deeply immutable (CONTRACT 3: a message is immutable): structs are frozen
and their sequences (message content, ``sourceEventSeqs``, inserted messages, request
tools and stop strings) are tuples, JSON arrays on disk as before; decoding yields
tuples. A fact is shared as it is with every listener, the in-memory log and the model
request, so nothing handed out may be changed in place. (msgspec does not check types
at construction: a struct built with a list holds that list. Whatever the runtime takes
from outside it, a sent message or a pre-step batch, is decoded again before it is kept.)

The envelope of every record is ``{type, seq, time, data}`` (:class:`Event`); ``data``
is one of the ``*Data`` structs below, chosen by ``type`` (see :data:`EVENT_TYPES`).

One piece, over 500 lines: it is the one vocabulary of the log (CONTRACT 3), read as a
whole by whoever adds a fact type; its structs refer to each other (content blocks,
causes, messages) and :data:`EVENT_TYPES` closes over all of them.
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypeAlias

import msgspec

__all__ = [
    "EVENT_TYPES",
    "SURFACE_TYPES",
    "Aborted",
    "AgentInboxSpliced",
    "AssistantChunk",
    "AssistantMessage",
    "AssistantMessageData",
    "AssistantPart",
    "Blocked",
    "CancelCause",
    "Completed",
    "ContentBlock",
    "DisposedCause",
    "Errored",
    "Event",
    "EventData",
    "FinishChunk",
    "HookCause",
    "IgnoredRecord",
    "ImageBlock",
    "InboxLane",
    "Interrupted",
    "LimitExceeded",
    "LlmFailure",
    "LlmRetry",
    "MaxTokens",
    "Message",
    "MessageId",
    "MessageSource",
    "MessageTrigger",
    "ParentCause",
    "ReasoningBlock",
    "ReasoningDelta",
    "RequestConfig",
    "RequestContext",
    "RequestHeader",
    "RetryTrigger",
    "SessionEndSeed",
    "StepEnd",
    "StepStart",
    "StreamChunk",
    "SurfaceAppend",
    "SurfaceOp",
    "SurfaceReplace",
    "TextBlock",
    "TextDelta",
    "ToolCallBlock",
    "ToolCallData",
    "ToolCallDelta",
    "ToolError",
    "ToolMessage",
    "ToolResultBlock",
    "ToolResultData",
    "ToolSpec",
    "Trigger",
    "TurnEnd",
    "TurnEndReason",
    "TurnStart",
    "Usage",
    "UsageChunk",
    "UserCause",
    "UserMessage",
    "UserMessageData",
]

MessageId: TypeAlias = str
"""Unique across both inbox lanes while pending; chosen by the caller or generated."""

MessageSource: TypeAlias = str
"""Who produced a message: ``"user"``, ``"plugin"``, ``"model"``, ``"tool"`` (extensible)."""

InboxLane: TypeAlias = Literal["next-turn", "next-step"]


class _Fact(
    msgspec.Struct, rename="camel", omit_defaults=True, frozen=True, kw_only=True, gc=False
):
    """Base of every durable struct: camelCase JSON, defaults omitted, immutable."""


class _Kinded(_Fact, frozen=True):
    """A tagged variant whose JSON tag is ``kind``; readable as ``.kind`` too."""

    @property
    def kind(self) -> str:
        return str(self.__struct_config__.tag)


class _Typed(_Fact, frozen=True):
    """A content block whose JSON tag is ``type``; readable as ``.type`` too."""

    @property
    def type(self) -> str:
        return str(self.__struct_config__.tag)


class _Role(_Fact, frozen=True):
    """A message whose JSON tag is ``role``; readable as ``.role`` too."""

    @property
    def role(self) -> str:
        return str(self.__struct_config__.tag)


# --------------------------------------------------------------------------- content


class TextBlock(_Typed, tag="text", tag_field="type", frozen=True):
    text: str


class ReasoningBlock(_Typed, tag="reasoning", tag_field="type", frozen=True):
    text: str
    signature: str | None = None


class ImageBlock(_Typed, tag="image", tag_field="type", frozen=True):
    """An image given inline (base64 ``data`` with ``media_type``) or by ``url``."""

    data: str | None = None
    url: str | None = None
    media_type: str | None = None


class ToolCallBlock(_Typed, tag="tool-call", tag_field="type", frozen=True):
    """A model's call of a tool. ``arguments`` is the raw JSON text the model produced."""

    call_id: str
    name: str
    arguments: str


class ToolResultBlock(_Typed, tag="tool-result", tag_field="type", frozen=True):
    call_id: str
    name: str
    content: tuple[TextBlock | ImageBlock, ...]
    is_error: bool = False


ContentBlock: TypeAlias = TextBlock | ReasoningBlock | ImageBlock | ToolCallBlock | ToolResultBlock
AssistantPart: TypeAlias = TextBlock | ReasoningBlock | ToolCallBlock


# --------------------------------------------------------------------------- messages


class UserMessage(_Role, tag="user", tag_field="role", frozen=True):
    """An inbox item and, once claimed, a model-visible user message. Immutable."""

    id: MessageId
    content: tuple[ContentBlock, ...]
    source: MessageSource = "user"


class AssistantMessage(_Role, tag="assistant", tag_field="role", frozen=True):
    content: tuple[AssistantPart, ...]


class ToolMessage(_Role, tag="tool", tag_field="role", frozen=True):
    """The result of one tool call, as the model sees it."""

    call_id: str
    name: str
    content: tuple[TextBlock | ImageBlock, ...]
    is_error: bool = False


Message: TypeAlias = UserMessage | AssistantMessage | ToolMessage


# --------------------------------------------------------------------------- model I/O


class Usage(_Fact, frozen=True):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


FailureCode: TypeAlias = Literal[
    "RATE_LIMIT",
    "SERVER",
    "TIMEOUT",
    "TRANSPORT",
    "EMPTY_RESPONSE",
    "CONTEXT_WINDOW_EXCEEDED",
    "AUTH",
    "INVALID_REQUEST",
    "ABORTED",
    "UNKNOWN",
]


class LlmFailure(_Fact, frozen=True):
    """A model-request failure, normalized from the adapter's error."""

    message: str
    code: FailureCode = "UNKNOWN"
    status: int | None = None
    retry_after_s: float | None = None
    request_id: str | None = None


class ToolSpec(_Fact, frozen=True):
    """A tool as the model is told about it: ``parameters`` is a JSON Schema object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


class RequestConfig(_Fact, frozen=True):
    """The frozen call configuration ``agent/request`` produces."""

    provider: str
    model: str
    reasoning_effort: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = None


class TextDelta(_Kinded, tag="text", tag_field="kind", frozen=True):
    text: str


class ReasoningDelta(_Kinded, tag="reasoning", tag_field="kind", frozen=True):
    """A piece of reasoning; ``signature`` (Anthropic thinking) arrives on its last piece."""

    text: str
    signature: str | None = None


class ToolCallDelta(_Kinded, tag="tool-call", tag_field="kind", frozen=True):
    """A piece of the ``index``-th tool call; ``call_id``/``name`` arrive on its first piece."""

    index: int
    call_id: str | None = None
    name: str | None = None
    arguments_delta: str = ""


class UsageChunk(_Kinded, tag="usage", tag_field="kind", frozen=True):
    usage: Usage


FinishReason: TypeAlias = Literal["stop", "tool-calls", "max-tokens", "error"]


class FinishChunk(_Kinded, tag="finish", tag_field="kind", frozen=True):
    reason: FinishReason


StreamChunk: TypeAlias = TextDelta | ReasoningDelta | ToolCallDelta | UsageChunk | FinishChunk


# --------------------------------------------------------------------------- turn vocab


class MessageTrigger(_Kinded, tag="message", tag_field="kind", frozen=True):
    pass


class RetryTrigger(_Kinded, tag="retry", tag_field="kind", frozen=True):
    previous_turn: int | None = None


Trigger: TypeAlias = MessageTrigger | RetryTrigger


class UserCause(_Kinded, tag="user", tag_field="kind", frozen=True):
    pass


class ParentCause(_Kinded, tag="parent", tag_field="kind", frozen=True):
    pass


class HookCause(_Kinded, tag="hook", tag_field="kind", frozen=True):
    reason: str


class DisposedCause(_Kinded, tag="disposed", tag_field="kind", frozen=True):
    pass


CancelCause: TypeAlias = UserCause | ParentCause | HookCause | DisposedCause


class Completed(_Kinded, tag="completed", tag_field="kind", frozen=True):
    pass


class Aborted(_Kinded, tag="aborted", tag_field="kind", frozen=True):
    reason: CancelCause


class Blocked(_Kinded, tag="blocked", tag_field="kind", frozen=True):
    pass


class Errored(_Kinded, tag="error", tag_field="kind", frozen=True):
    error: LlmFailure


class MaxTokens(_Kinded, tag="max-tokens", tag_field="kind", frozen=True):
    pass


class Interrupted(_Kinded, tag="interrupted", tag_field="kind", frozen=True):
    """Written only by crash repair when a session resumes with an open tail turn."""


class LimitExceeded(_Kinded, tag="limit", tag_field="kind", frozen=True):
    """A runtime limit (steps per turn, requests, tokens) ended the turn."""

    limit: str
    message: str


TurnEndReason: TypeAlias = (
    Completed | Aborted | Blocked | Errored | MaxTokens | Interrupted | LimitExceeded
)


class SurfaceAppend(_Kinded, tag="append", tag_field="kind", frozen=True):
    pass


class SurfaceReplace(_Kinded, tag="replace", tag_field="kind", frozen=True):
    """Replaces the model-visible message written by the surface event at ``seq``."""

    seq: int


SurfaceOp: TypeAlias = SurfaceAppend | SurfaceReplace

_APPEND: Final = SurfaceAppend()


class _SurfaceFact(_Fact, omit_defaults=False, frozen=True):
    """Base of the three surface facts: ``surfaceOp`` and ``sourceEventSeqs`` always encode."""


# --------------------------------------------------------------------------- event data


class TurnStart(_Fact, frozen=True):
    turn: int
    trigger: Trigger
    durability: Literal["turn", "none"] | None = None
    """The durability mode the turn runs under when it is not write-ahead (``None``, the
    default, is omitted: a write-ahead ``turn/start`` encodes as it always did, and a
    log written before this field reads as write-ahead). Crash repair reads it: only
    under write-ahead is a ``tool/call`` durable before its body runs, so only there does
    a call with no ``tool/call`` fact prove that it did not run."""


class TurnEnd(_Fact, frozen=True):
    turn: int
    reason: TurnEndReason


class StepStart(_Fact, frozen=True):
    turn: int
    step: int


class StepEnd(_Fact, frozen=True):
    turn: int
    step: int


class UserMessageData(_SurfaceFact, frozen=True):
    """``user/message``: a model-visible user message (claimed, steered or seeded)."""

    message: UserMessage
    turn: int | None = None
    step: int | None = None
    surface_op: SurfaceOp = _APPEND
    source_event_seqs: tuple[int, ...] = ()


class AssistantChunk(_Fact, frozen=True):
    turn: int
    step: int
    chunk: StreamChunk


class AssistantMessageData(_SurfaceFact, frozen=True):
    """``assistant/message``: the assembled reply; ``source_event_seqs`` cites its chunks."""

    turn: int
    step: int
    message: AssistantMessage
    usage: Usage | None = None
    finish_reason: FinishReason | None = None
    interrupted: bool = False
    surface_op: SurfaceOp = _APPEND
    source_event_seqs: tuple[int, ...] = ()


class ToolCallData(_Fact, frozen=True):
    """``tool/call``: appended before anything about the call runs."""

    turn: int
    step: int
    call_id: str
    name: str
    arguments: str


class ToolError(_Fact, frozen=True):
    """Why a tool result is an error: ``code`` such as ``TOOL_FAILED``, ``TOOL_DENIED``,
    ``INVALID_ARGUMENTS``, ``ABORTED_BEFORE_DISPATCH``, ``TOOL_NOT_STARTED``,
    ``TOOL_OUTCOME_UNKNOWN``, ``TOOL_TIMEOUT``, ``UNKNOWN_TOOL``."""

    code: str
    message: str


class ToolResultData(_SurfaceFact, frozen=True):
    """``tool/result``: appended in model order; ``source_event_seqs`` cites its call."""

    turn: int
    step: int
    message: ToolMessage
    error: ToolError | None = None
    concludes_turn: bool = False
    surface_op: SurfaceOp = _APPEND
    source_event_seqs: tuple[int, ...] = ()


class RequestHeader(_Fact, frozen=True):
    """``request/header``: written for the first request and whenever it changed."""

    turn: int
    step: int
    config: RequestConfig
    system: str | None = None
    tools: tuple[ToolSpec, ...] = ()


class RequestContext(_Fact, frozen=True):
    """``request/context``: which logged history a request was built from."""

    turn: int
    step: int
    message_count: int
    through_seq: int


class LlmRetry(_Fact, frozen=True):
    """``llm/retry``: the retry policy accepted a failure and will open a retry turn."""

    turn: int
    attempt: int
    delay_s: float
    failure: LlmFailure


class AgentInboxSpliced(_Fact, frozen=True):
    """``agent/inbox/spliced``: one change of one inbox lane, coordinates like list slicing.

    A claim is a pure deletion (no ``outcome``); an ordinary removal has
    ``outcome="canceled"``.
    """

    target: InboxLane
    start: int
    removed_count: int = 0
    inserted: tuple[UserMessage, ...] = ()
    outcome: Literal["canceled"] | None = None


class SessionEndSeed(_Fact, frozen=True):
    """``session/end-seed``: the seeded prefix (fork or import) ends here."""

    source_session: str | None = None
    source_seq: int | None = None


EventData: TypeAlias = (
    TurnStart
    | TurnEnd
    | StepStart
    | StepEnd
    | UserMessageData
    | AssistantChunk
    | AssistantMessageData
    | ToolCallData
    | ToolResultData
    | RequestHeader
    | RequestContext
    | LlmRetry
    | AgentInboxSpliced
    | SessionEndSeed
)

EVENT_TYPES: Final[dict[str, type[msgspec.Struct]]] = {
    "turn/start": TurnStart,
    "turn/end": TurnEnd,
    "step/start": StepStart,
    "step/end": StepEnd,
    "user/message": UserMessageData,
    "assistant/chunk": AssistantChunk,
    "assistant/message": AssistantMessageData,
    "tool/call": ToolCallData,
    "tool/result": ToolResultData,
    "request/header": RequestHeader,
    "request/context": RequestContext,
    "llm/retry": LlmRetry,
    "agent/inbox/spliced": AgentInboxSpliced,
    "session/end-seed": SessionEndSeed,
}
"""The built-in fact types by their durable ``type`` name."""

SURFACE_TYPES: Final = frozenset({"user/message", "assistant/message", "tool/result"})
"""The only types that carry ``surfaceOp``/``sourceEventSeqs`` and build the history."""


class Event(msgspec.Struct, frozen=True, gc=False):
    """One committed record of a session log.

    Invariant: ``seq`` is contiguous from 0 within a session; ``time`` is epoch ms.
    ``data`` is the type's struct for built-in and registered typed facts, or a plain
    JSON object (``dict``) for plugin types registered without a struct.
    """

    type: str
    seq: int
    time: int
    data: Any


class IgnoredRecord(msgspec.Struct, frozen=True, gc=False):
    """The ``data`` of a *placeholder* :class:`Event`: a record of an ignorable plugin
    type that the reading store's registry does not know.

    A reader that does not know an ignorable type skips its records; asked to account
    for them (``Store.read(..., include_ignored=True)``), it returns one placeholder per
    skipped record instead, with the record's ``type``, ``seq`` and ``time`` and, here,
    its stored bytes verbatim. Nothing else of the record is interpreted: the invariant
    checker takes a placeholder for its seq and time only, and a fork copies ``raw``
    into the child as it is (same seq, ``"ignorable":true`` kept), so that the seqs the
    rest of the log cites stay valid.
    """

    raw: bytes
