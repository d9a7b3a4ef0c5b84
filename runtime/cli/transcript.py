"""Readable renderings of session events for ``corral log show`` and ``corral log tail``.

:func:`summary` is one event as one line of text (styles via rich ``Text``, never
markup, so logged text is printed as it is); :func:`transcript` indents a whole log by
turn and step and leaves out the bookkeeping facts unless ``verbose``.

Logged text (model and tool output) is untrusted: :func:`shown` makes it safe for a
terminal (every control character but tab visible as ``\\xNN``, a bidirectional control
as ``\\u202e``, a newline as ``⏎``) and :func:`safe_json` does the same for JSON lines
with ``\\uNNNN`` escapes.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator
from typing import Any, Final

import msgspec
from rich.text import Text

from storage import (
    BIDI_CONTROLS,
    AgentInboxSpliced,
    AssistantChunk,
    AssistantMessageData,
    Event,
    IgnoredRecord,
    ImageBlock,
    LlmRetry,
    ReasoningBlock,
    ReasoningDelta,
    RequestContext,
    RequestHeader,
    SessionEndSeed,
    StepEnd,
    StepStart,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallData,
    ToolCallDelta,
    ToolResultBlock,
    ToolResultData,
    TurnEnd,
    TurnStart,
    UsageChunk,
    UserMessageData,
)

__all__ = ["clock", "plural", "safe_json", "shown", "summary", "transcript"]

_QUIET: Final = frozenset({"assistant/chunk", "request/context", "agent/inbox/spliced"})
_encode: Final = msgspec.json.Encoder()


class _Stored(msgspec.Struct):
    """The data of a stored record, undecoded (for a placeholder of an unknown type)."""

    data: msgspec.Raw = msgspec.Raw(b"null")


_stored: Final = msgspec.json.Decoder(_Stored)


def clock(ms: int) -> str:
    """Epoch ms as local ``HH:MM:SS.mmm``."""
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%H:%M:%S.%f")[:-3]


# C0 controls but tab, DEL and the C1 controls (U+0080-U+009F): ESC would let a logged
# text clear the screen, set the window title (OSC 0) or show a fake link (OSC 8).
_CONTROLS: Final = {
    code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if code != 0x09
} | {ord(char): f"\\u{ord(char):04x}" for char in BIDI_CONTROLS}
# ... and the bidirectional controls (U+202E, U+2066-2069, ...), which would reorder what
# the terminal shows around them: a transcript could show another text than was logged.
_JSON_CONTROLS: Final = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f" + "".join(sorted(BIDI_CONTROLS)) + "]"
)


def shown(text: str) -> str:
    r"""``text`` safe for a terminal: a newline as `` ⏎ ``, every other control character
    but tab (C0, DEL, C1) as ``\xNN`` (ESC as ``\x1b``), a bidirectional control as
    ``\u202e``."""
    return text.replace("\n", " ⏎ ").translate(_CONTROLS)


def safe_json(lines: str) -> str:
    r"""JSON ``lines`` safe for a terminal, meaning the same: DEL and the C1 controls,
    which JSON may hold as they are (msgspec writes them so), as ``\u007f``...; C0
    (but tab, newline, return) too, which valid JSON holds only as escapes already."""
    return _JSON_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", lines)


def plural(count: int, word: str) -> str:
    """``1 agent``, ``1,000 agents``."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _clip(text: str, limit: int | None) -> str:
    text = shown(text)
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def _blocks(content: Iterable[Any]) -> str:
    parts: list[str] = []
    for block in content:
        match block:
            case TextBlock(text=text):
                parts.append(text)
            case ReasoningBlock(text=text):
                parts.append(f"(thinking: {text})")
            case ImageBlock():
                parts.append("[image]")
            case ToolCallBlock(name=name, arguments=arguments):
                parts.append(f"→ {name}({arguments})")
            case ToolResultBlock(name=name, content=inner):
                parts.append(f"[{name} result: {_blocks(inner)}]")
            case _:
                parts.append(f"[{type(block).__name__}]")
    return " ".join(parts)


def _reason(end: TurnEnd) -> tuple[str, str]:
    reason: Any = end.reason
    kind = reason.kind
    match kind:
        case "completed":
            return "completed", "green"
        case "error":
            return f"error {reason.error.code}: {reason.error.message}", "red"
        case "aborted":
            return f"aborted ({reason.reason.kind})", "yellow"
        case "limit":
            return f"limit {reason.limit}: {reason.message}", "yellow"
        case _:
            return str(kind), "yellow"


def _splice(data: AgentInboxSpliced, limit: int | None) -> str:
    if data.inserted:
        texts = ", ".join(repr(_clip(_blocks(m.content), 60)) for m in data.inserted)
        return f"inbox + {data.target}: {_clip(texts, limit)}"
    if data.outcome == "canceled":
        return f"inbox - {data.target}: {data.removed_count} canceled"
    return f"inbox claimed {data.removed_count} from {data.target}"


def _chunk(data: AssistantChunk) -> str:
    chunk: Any = data.chunk
    match chunk:
        case TextDelta(text=text) | ReasoningDelta(text=text):
            return f"chunk {chunk.kind}: {text!r}"
        case ToolCallDelta(name=name, arguments_delta=delta):
            return f"chunk tool-call {name or ''} {delta!r}".replace("  ", " ")
        case UsageChunk(usage=usage):
            return f"chunk usage: {usage.input_tokens} in, {usage.output_tokens} out"
        case _:
            return f"chunk {chunk.kind}: {getattr(chunk, 'reason', '')}"


def _parts(event: Event, limit: int | None) -> tuple[str, str]:
    """(text, style) of one event."""
    data: Any = event.data
    match data:
        case TurnStart(turn=turn, trigger=trigger):
            previous = getattr(trigger, "previous_turn", None)
            extra = f" of turn {previous}" if previous else ""
            return f"turn {turn} starts ({trigger.kind}{extra})", "bold"
        case TurnEnd(turn=turn):
            text, style = _reason(data)
            return f"turn {turn} ends: {_clip(text, limit)}", f"bold {style}"
        case UserMessageData(message=message):
            return f"user: {_clip(_blocks(message.content), limit)}", "cyan"
        case AssistantMessageData(message=message, interrupted=interrupted):
            text = _blocks(b for b in message.content if not isinstance(b, ToolCallBlock))
            calls = sum(1 for b in message.content if isinstance(b, ToolCallBlock))
            if calls:
                text = f"{text} [{calls} tool call{'s' if calls > 1 else ''}]".strip()
            suffix = " [interrupted]" if interrupted else ""
            return f"assistant: {_clip(text, limit)}{suffix}", "magenta"
        case ToolCallData(name=name, arguments=arguments, call_id=call_id):
            return f"tool call {name}({_clip(arguments, limit)}) [{call_id}]", "blue"
        case ToolResultData(message=message, error=error):
            if error is not None:
                return (
                    f"tool error {message.name} {error.code}: {_clip(error.message, limit)}",
                    "red",
                )
            return f"tool result {message.name}: {_clip(_blocks(message.content), limit)}", "blue"
        case RequestHeader(config=config, tools=tools):
            return f"request: {config.provider}:{config.model}, {len(tools)} tool(s)", "dim"
        case RequestContext(message_count=count, through_seq=through):
            return f"request context: {count} message(s) through seq {through}", "dim"
        case LlmRetry(attempt=attempt, delay_s=delay, failure=failure):
            why = f"{failure.code}: {_clip(failure.message, limit)}"
            return f"retry #{attempt} in {delay:.2f} s after {why}", "yellow"
        case AgentInboxSpliced():
            return _splice(data, limit), "dim"
        case AssistantChunk():
            return _chunk(data), "dim"
        case SessionEndSeed(source_session=source, source_seq=seq):
            origin = f" (from {source} at seq {seq})" if source else ""
            return f"seeded prefix ends{origin}", "dim"
        case StepStart(step=step):
            return f"step {step}", "bold"
        case StepEnd(step=step):
            return f"step {step} ends", "dim"
        case IgnoredRecord(raw=record):  # a plugin's record of a type this reader does not know
            shown = bytes(_stored.decode(record).data).decode()
            return (
                f"ignored plugin event {event.type} (type not known here): {_clip(shown, limit)}",
                "dim",
            )
        case _:
            raw = _encode.encode(data).decode() if data is not None else "null"
            return f"{event.type}: {_clip(raw, limit)}", ""


def summary(event: Event, *, limit: int | None = 200) -> Text:
    """``seq  time  text`` for one event."""
    text, style = _parts(event, limit)
    line = Text(f"{event.seq:>6}  {clock(event.time)}  ", style="dim")
    line.append(shown(text), style=style)  # names, ids and codes too, not only clipped text
    return line


def transcript(events: Iterable[Event], *, verbose: bool = False) -> Iterator[Text]:
    """The readable transcript: turns, steps, messages, tool calls and results, failures."""
    depth = 0
    for event in events:
        if event.type in _QUIET and not verbose:
            continue
        text, style = _parts(event, None)
        if event.type in ("turn/end", "step/end"):
            depth = max(0, depth - 1)
            if event.type == "step/end" and not verbose:
                continue
        line = Text("  " * depth)
        if verbose:
            line.append(f"{event.seq:>5} ", style="dim")
        line.append(shown(text), style=style)
        yield line
        if event.type in ("turn/start", "step/start"):
            depth += 1
