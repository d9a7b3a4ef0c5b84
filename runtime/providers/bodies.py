"""What a 200 answer to a streaming request carries: an event stream, or something else.

A server asked for a stream may answer 200 with another body: a gateway its error as
JSON, a server that ignores ``stream: true`` its whole reply as JSON, a proxy or login
page HTML. Read as a stream, each looked like a stream that ended early (``TRANSPORT``,
retried, its text lost). :func:`open_body` tells them apart: ``text/event-stream`` is a
stream; otherwise the first bytes decide (SSE fields are a stream whatever the content
type says, a JSON content type or a ``{`` is JSON, anything else is
:class:`~.failures.NotAStreamError`). A JSON body is read whole, up to the bound of a
reply the log could take (``event_bound`` of the event limit, as for one server-sent
event); a larger one is :class:`~.failures.JsonReplyTooLargeError`, reported as a reply
too large to log, as a streamed one is. :func:`plain_reply` then sorts a JSON body into an
error (:class:`~.failures.StreamReportedError`, classified as that error's HTTP body
would be) or the vendor's non-streamed reply, which the provider maps as a stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final, NamedTuple

import msgspec

from storage import DEFAULT_MAX_EVENT_BYTES

from .failures import JsonReplyTooLargeError, NotAStreamError, StreamReportedError
from .sse import event_bound

__all__ = ["JsonBody", "open_body", "plain_reply"]

_START_CHARS: Final = 2000  # kept of a body's start; the failure shows less, once scrubbed
_SSE_FIELDS: Final = (b"data:", b"event:", b"id:", b"retry:", b":")


class JsonBody(NamedTuple):
    """A whole JSON body; ``start`` is the start of its text, for a failure's message."""

    content_type: str
    value: object
    start: str


def _start(data: bytes) -> str:
    return data[: _START_CHARS * 4].decode("utf-8", "replace")[:_START_CHARS]


async def _chain(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for part in rest:
        yield part


async def open_body(
    content_type: str | None, body: AsyncIterator[bytes], max_reply_bytes: int | None = None
) -> AsyncIterator[bytes] | JsonBody:
    """The event stream's bytes, or the whole JSON body; raises
    :class:`NotAStreamError` for anything else (an HTML page, a JSON body that does not
    parse), :class:`JsonReplyTooLargeError` for a JSON body over ``event_bound`` of
    ``max_reply_bytes`` (the log's event limit; None: the default one)."""
    kind = (content_type or "").partition(";")[0].strip().lower()
    if kind == "text/event-stream":
        return body
    bound = event_bound(max_reply_bytes)
    limit = max_reply_bytes or DEFAULT_MAX_EVENT_BYTES
    head = b""
    skipped = 0  # the white space before it, in parts of nothing else (dropped, counted)
    async for part in body:  # up to the first part with a byte that is not white space
        if part.strip():
            head = part
            break
        skipped += len(part)
        if skipped > bound:
            raise JsonReplyTooLargeError(skipped, bound, limit)
    first = head.lstrip()
    if not first or first.startswith(_SSE_FIELDS):
        return _chain(head, body)  # a stream mislabelled (or empty: it ends unfinished)
    if not (kind == "application/json" or kind.endswith("+json") or first[:1] in b"{["):
        raise NotAStreamError(kind, _start(first))
    data = bytearray(first)
    read = skipped + len(head)
    if read > bound:  # a reply the log could not take, however it is escaped
        raise JsonReplyTooLargeError(read, bound, limit)
    async for part in body:
        data += part
        read += len(part)
        if read > bound:
            raise JsonReplyTooLargeError(read, bound, limit)
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError:
        raise NotAStreamError(kind, _start(first)) from None
    return JsonBody(kind, value, _start(first))


def plain_reply(body: JsonBody, is_reply: Callable[[Mapping[str, Any]], bool]) -> Mapping[str, Any]:
    """``body`` as the vendor's non-streamed reply (``is_reply`` says which shape that
    is); an ``{"error": …}`` body raises :class:`StreamReportedError`, any other
    :class:`NotAStreamError`."""
    value = body.value
    if isinstance(value, Mapping):
        if value.get("error"):
            raise StreamReportedError(value, "answered 200 with an error body")
        if is_reply(value):
            return value
    raise NotAStreamError(body.content_type, body.start)
