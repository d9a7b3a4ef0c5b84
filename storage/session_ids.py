"""Session ids: how a new one is made (sorting by creation time) and what an id given by
a caller must be (a non-empty ``str`` of printable characters, no bidirectional
controls, within :data:`~storage.budget.MAX_SESSION_ID_CHARS` and an LMDB key)."""

from __future__ import annotations

import secrets
import unicodedata
from collections.abc import Callable
from typing import Final

from storage.budget import MAX_SESSION_ID_CHARS
from storage.errors import InvalidEventError
from storage.session import epoch_ms

__all__ = [
    "BIDI_CONTROLS",
    "InvalidSessionIdError",
    "check_session_id",
    "new_session_id",
    "new_session_ids",
]

# The Unicode bidirectional formatting characters (embeddings, overrides, isolates and
# the marks): printed raw they reorder the text around them, so that a transcript or a
# listing shows something other than what was logged (U+202E turns "exe.txt" around).
BIDI_CONTROLS: Final = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


class InvalidSessionIdError(InvalidEventError, ValueError):
    """A session id is empty, too long, or contains control characters (bidirectional
    controls included)."""


def new_session_id(clock: Callable[[], int] = epoch_ms) -> str:
    """A fresh id that sorts by creation time: 11 hex digits of epoch ms + 12 random."""
    return f"{clock():011x}{secrets.token_hex(6)}"


def new_session_ids(count: int, clock: Callable[[], int] = epoch_ms) -> list[str]:
    """``count`` ids as :func:`new_session_id` makes them, from one clock reading and one
    draw of random bytes (a draw is a system call: ~1 us an id in a batch spawn)."""
    stamp = f"{clock():011x}"
    noise = secrets.token_hex(6 * count)
    return [stamp + noise[i : i + 12] for i in range(0, 12 * count, 12)]


def check_session_id(session_id: object, *, max_key_bytes: int = 511) -> str:
    """Return ``session_id`` if usable as a session id, else raise InvalidSessionIdError."""
    if not isinstance(session_id, str):
        raise InvalidSessionIdError(f"a session id must be a str, got {type(session_id).__name__}")
    if not session_id:
        raise InvalidSessionIdError("a session id must not be empty; pass None to generate one")
    if len(session_id) > MAX_SESSION_ID_CHARS:
        raise InvalidSessionIdError(
            f"session id {session_id[:40]!r}... has {len(session_id)} characters; "
            f"the limit is {MAX_SESSION_ID_CHARS}"
        )
    for index, char in enumerate(session_id):
        if char in BIDI_CONTROLS:
            raise InvalidSessionIdError(
                f"session id {session_id!r} contains the bidirectional control U+"
                f"{ord(char):04X} at index {index}, which would make listings show another "
                "id; use printable characters"
            )
        if unicodedata.category(char) in ("Cc", "Cs"):
            raise InvalidSessionIdError(
                f"session id {session_id!r} contains the control character {char!r} at "
                f"index {index}; use printable characters"
            )
    if len(session_id.encode("utf-8")) > max_key_bytes:
        raise InvalidSessionIdError(
            f"session id {session_id[:40]!r}... is over {max_key_bytes} bytes in UTF-8"
        )
    return session_id
