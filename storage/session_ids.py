"""Session ids: how a new one is made (sorting by creation time) and what an id given by
a caller must be (a non-empty ``str`` of printable characters, within
:data:`~storage.budget.MAX_SESSION_ID_CHARS` and an LMDB key)."""

from __future__ import annotations

import secrets
import unicodedata
from collections.abc import Callable

from storage.budget import MAX_SESSION_ID_CHARS
from storage.errors import InvalidEventError
from storage.session import epoch_ms

__all__ = ["InvalidSessionIdError", "check_session_id", "new_session_id"]


class InvalidSessionIdError(InvalidEventError, ValueError):
    """A session id is empty, too long, or contains control characters."""


def new_session_id(clock: Callable[[], int] = epoch_ms) -> str:
    """A fresh id that sorts by creation time: 11 hex digits of epoch ms + 12 random."""
    return f"{clock():011x}{secrets.token_hex(6)}"


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
