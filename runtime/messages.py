"""Turning what a user sends (a ``str``, a list of content blocks, a ``UserMessage``)
into a checked ``UserMessage``: its id, its source, its field types and its size against
the records that will carry it, all refused here, in the sender's thread, with an
``InvalidMessageError`` that says what was wrong."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from actors import InvalidMessageError
from storage import (
    CARRIED_BYTES,
    EMPTY_TEXT_BYTES,
    JSON_BYTES_PER_CHAR,
    SPLICE_BYTES,
    ContentBlock,
    ImageBlock,
    MessageId,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    UserMessage,
    message_bytes,
)

__all__ = ["MessageChecker", "MessageLike", "check_id"]

MessageLike = str | UserMessage | Sequence[ContentBlock]
"""What a send takes: a text, a ``UserMessage``, or a non-empty list of content blocks."""

_BLOCKS = (TextBlock, ReasoningBlock, ImageBlock, ToolCallBlock, ToolResultBlock)
_message_decoder = msgspec.json.Decoder(UserMessage)


def check_id(message_id: object) -> None:
    """Refuse a message id that is not a non-empty str."""
    if not isinstance(message_id, str) or not message_id:
        raise InvalidMessageError(f"a message id is a non-empty str, got {message_id!r}")


class MessageChecker:
    """Checks the messages sent to one agent: new ids come from ``new_id``; a message,
    with what its records add, must fit in ``max_event_bytes``."""

    __slots__ = ("_max_bytes", "_max_message_bytes", "_new_id")

    def __init__(self, new_id: Callable[[], str], max_event_bytes: int) -> None:
        self._new_id = new_id
        self._max_bytes = max_event_bytes
        # A message's own JSON may take this much: see storage.budget.
        self._max_message_bytes = message_bytes(max_event_bytes)

    def check(self, value: object, message_id: MessageId | None, source: str) -> UserMessage:
        """``value`` as a checked ``UserMessage`` (``message_id``: its id, or a new one;
        ``source``: who sent it), or ``InvalidMessageError``."""
        if (
            type(value) is str
            and message_id is None
            and type(source) is str
            and value.isascii()
            and source.isascii()
        ):
            # The common send: its fields are right by construction and ASCII always
            # encodes; only the size is left to check, by a bound when it is far below.
            message_id = self._new_id()
            size = len(value) + len(source) + len(message_id)
            if EMPTY_TEXT_BYTES + JSON_BYTES_PER_CHAR * size <= self._max_message_bytes:
                return UserMessage(id=message_id, content=(TextBlock(text=value),), source=source)
        if message_id is not None:
            check_id(message_id)  # an empty id is refused, not replaced by a new one
        if isinstance(value, UserMessage):
            if message_id is not None and message_id != value.id:
                raise InvalidMessageError("give the id inside the UserMessage, or pass a str")
            if source not in ("user", value.source):
                raise InvalidMessageError("give the source inside the UserMessage, or pass a str")
            message = value
        elif isinstance(value, str):
            message = UserMessage(
                id=self._new_id() if message_id is None else message_id,
                content=(TextBlock(text=value),),
                source=source,
            )
        elif (
            isinstance(value, list | tuple) and value and all(isinstance(b, _BLOCKS) for b in value)
        ):
            message = UserMessage(
                id=self._new_id() if message_id is None else message_id,
                content=tuple(value),
                source=source,
            )
        else:
            raise InvalidMessageError(
                f"a message is a str, a UserMessage or a non-empty list of content blocks; "
                f"got {type(value).__name__}"
            )
        if not message.id or not isinstance(message.id, str):
            raise InvalidMessageError(f"a message id is a non-empty str, got {message.id!r}")
        if isinstance(message.content, list | tuple) and not message.content:
            raise InvalidMessageError("a message holds at least one content block, got none")
        try:
            encoded = msgspec.json.encode(message)
            # Field types: msgspec does not check them at construction. A message built
            # here from a str (and a str source) has them right by construction. The
            # decoded message is the one kept: content blocks given as plain dicts
            # become the block structs the log reads back (and providers send).
            if not (isinstance(value, str) and isinstance(source, str)):
                message = _message_decoder.decode(encoded)
        except (TypeError, ValueError, msgspec.MsgspecError) as err:
            raise InvalidMessageError(f"the message is not a valid UserMessage: {err}") from err
        size = len(encoded)
        if size > self._max_message_bytes:
            raise InvalidMessageError(
                f"the message encodes to {size} bytes; with the {CARRIED_BYTES} bytes the "
                "records that carry it (agent/inbox/spliced, user/message) may add, that is "
                f"over the {self._max_bytes}-byte event limit"
            )
        return message

    def check_splice(self, messages: Sequence[UserMessage]) -> None:
        """Refuse checked ``messages`` that one splice record could not carry together."""
        if len(messages) > 1:  # one splice record carries them all
            size = SPLICE_BYTES + sum(len(msgspec.json.encode(m)) + 1 for m in messages) - 1
            if size > self._max_bytes:
                raise InvalidMessageError(
                    f"the splice's record would be {size} bytes, over the {self._max_bytes}-byte "
                    "event limit; splice fewer messages at a time"
                )
