"""The record budget: every size and character cap of a durable record, in one place.

A record is at most ``max_event_bytes`` of JSON (:data:`DEFAULT_MAX_EVENT_BYTES` unless a
store is opened with another limit). The layers above check what they are given against
what is left of that limit once the record's other fields are counted: a message against
what its carrying records add (:func:`message_bytes`), a cancel cause against the rest of
its ``turn/end`` (:func:`cause_reason_bytes`), a tool call's id and name against what its
last-resort ``tool/result`` needs (:func:`tool_id_bytes`), a streamed reply against the
limit its request carries (:func:`reply_bytes`). Character caps keep a text that is
logged (a cancel reason, a model failure, a session id) far below any limit.
"""

from __future__ import annotations

from typing import Final

import msgspec

from storage.events import AgentInboxSpliced, Event, TextBlock, UserMessage, UserMessageData

__all__ = [
    "CARRIED_BYTES",
    "CITATION_BYTES",
    "CITED_SHARE",
    "DEFAULT_MAX_EVENT_BYTES",
    "DIRECT_SHARE",
    "EMPTY_TEXT_BYTES",
    "JSON_BYTES_PER_CHAR",
    "MAX_CAUSE_REASON_CHARS",
    "MAX_FAILURE_CHARS",
    "MAX_SESSION_ID_CHARS",
    "RESULT_ROOM",
    "SPLICE_BYTES",
    "TURN_END_BYTES",
    "cause_reason_bytes",
    "message_bytes",
    "reply_bytes",
    "tool_id_bytes",
]

DEFAULT_MAX_EVENT_BYTES: Final = 4 * 1024 * 1024
"""The largest record (its JSON) a store takes unless opened with ``max_event_bytes``."""

JSON_BYTES_PER_CHAR: Final = 6
"""The most bytes one character of a string takes in JSON (a ``\\u00XX`` escape): a text
of ``n`` characters is known to fit ``6 * n`` bytes without encoding it."""

MAX_SESSION_ID_CHARS: Final = 200
"""The longest session id (agent id) a store takes."""

MAX_CAUSE_REASON_CHARS: Final = 16_384
"""The longest ``HookCause.reason`` a cancel or an abort takes (a longer one is refused):
the cause is logged in the turn's ``turn/end``, which must fit ``max_event_bytes``."""

MAX_FAILURE_CHARS: Final = 16_384
"""The most characters of a model failure's message that are logged (the rest is cut)."""

TURN_END_BYTES: Final = 256
"""What an aborted ``turn/end`` takes besides its cause's reason."""

RESULT_ROOM: Final = 1024
"""Bytes of an event that a call's id and name must leave free, so that its last-resort
``tool/result`` (some 420 bytes besides them) can always be logged."""

# A reply's ``assistant/message`` cites each of its chunk events (CONTRACT 4). Its chunks
# are logged one per delta while their citations take less than 1/DIRECT_SHARE of the
# event limit; past that, deltas are gathered so that the citations stay within about
# 1/CITED_SHARE of it, however many deltas the reply came in.
DIRECT_SHARE: Final = 64
CITED_SHARE: Final = 32
CITATION_BYTES: Final = 12
"""What one citation takes at most: a seq's digits and a comma."""

EMPTY_TEXT_BYTES: Final = len(
    msgspec.json.encode(UserMessage(id="", content=(TextBlock(text=""),), source=""))
)
"""The encoded size of a text message with empty strings: with
:data:`JSON_BYTES_PER_CHAR`, a short text message is known to fit without encoding it."""


def _carried_bytes() -> tuple[int, int]:
    """What the durable records that carry a message add to its own JSON: (the most any
    of them adds to one message, what an ``agent/inbox/spliced`` adds to the messages it
    inserts, which are separated by commas). The records: its insert (or replace) splice,
    later its ``user/message``. Measured on their widest: every int field (seq, time,
    start, removedCount, turn, step) 20 characters (2**64: no log comes near it), the
    longer lane name, a removal with its outcome. A message that fits with this much
    more fits in any record that carries it."""
    probe = UserMessage(id="m", content=(TextBlock(text=""),))
    size = len(msgspec.json.encode(probe))
    wide = 2**64
    splice = AgentInboxSpliced(
        target="next-step", start=wide, removed_count=wide, inserted=(probe,), outcome="canceled"
    )
    records = (
        Event("agent/inbox/spliced", wide, wide, splice),
        Event("user/message", wide, wide, UserMessageData(message=probe, turn=wide, step=wide)),
    )
    spliced, message = (len(msgspec.json.encode(r)) - size for r in records)
    return max(spliced, message), spliced


CARRIED_BYTES, SPLICE_BYTES = _carried_bytes()
"""What the records carrying a message add to it at most; what a splice adds to the
messages it inserts (see :func:`message_bytes`)."""


def message_bytes(max_event_bytes: int) -> int:
    """The most a user message's own JSON may take under the event limit, so that every
    record that carries it (its splice, its ``user/message``) fits."""
    return max_event_bytes - CARRIED_BYTES


def cause_reason_bytes(max_event_bytes: int) -> int:
    """The most a cancel cause's reason may take (JSON) in an aborted ``turn/end``."""
    return max_event_bytes - TURN_END_BYTES


def tool_id_bytes(max_event_bytes: int) -> int:
    """The most a tool call's id and name may take together (JSON), so that a result
    for it can always be logged."""
    return max_event_bytes - RESULT_ROOM


def reply_bytes(max_reply_bytes: int | None) -> int:
    """The limit a model reply streams under: its request's, else the default."""
    return max_reply_bytes or DEFAULT_MAX_EVENT_BYTES
