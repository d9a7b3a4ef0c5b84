"""Every way a vendor call fails, normalized to one :class:`~storage.events.LlmFailure`.

The codes are CONTRACT section 5's:

========================  ==========================================================
``RATE_LIMIT``            HTTP 429 (``retry_after_s`` from ``retry-after-ms`` /
                          ``retry-after``), or a rate-limit error event mid-stream
                          (``rate_limit_error``, ``code: 429``)
``SERVER``                HTTP 5xx, Anthropic ``overloaded_error`` (529) (both with
                          ``retry_after_s`` as a 429), a server error event mid-stream
                          (``server_error``, ``code: 502``, "model is overloaded"), a
                          reply the server ended with ``finish_reason: "error"``
``TIMEOUT``               connect/read/pool timeout (a stalled stream), HTTP 408
``TRANSPORT``             connection refused, reset or dropped mid-stream
``CONTEXT_WINDOW_EXCEEDED``  a 4xx whose code or message says the prompt is too long
``AUTH``                  HTTP 401 / 403
``INVALID_REQUEST``       any other 4xx
``EMPTY_RESPONSE``        a completion with no text and no tool calls (a max-tokens finish
                          with nothing visible is no failure: the turn ends ``max-tokens``)
``UNKNOWN``               anything else (a bug, an unparseable reply, a finish reason
                          corral does not know, a 200 that is not an event stream)
========================  ==========================================================

An error body that comes with a 200 (an error event mid-stream, a gateway answering
``{"error": …}`` as JSON) is classified by its ``type``/``code`` as the same error with
that HTTP status would be, its ``status`` left empty.

Every text that comes from the server (the message, the request id) is scrubbed of the
provider's key (:func:`~.secrets.scrub`); the vendor's request id (``x-request-id`` /
``request-id``) is kept in ``request_id``. A :class:`ModelError` carries no exception
chain: the HTTP library's exception may hold the request, and so the key.
"""

from __future__ import annotations

import email.utils
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from actors import ModelError
from storage import FailureCode, LlmFailure

from ..errors import (
    JsonReplyTooLargeError,
    NotAStreamError,
    SseEventTooLargeError,
    StreamReportedError,
)
from .secrets import Secret, scrub

__all__ = [
    "REQUEST_ID_HEADERS",
    "JsonReplyTooLargeError",
    "NotAStreamError",
    "StreamReportedError",
    "classify",
    "empty_response",
    "finished_with_error",
    "request_id_from",
    "retry_after_seconds",
    "to_model_error",
]

REQUEST_ID_HEADERS: Final = ("x-request-id", "request-id")
_MAX_MESSAGE: Final = 600
_MAX_REQUEST_ID: Final = 200
_MAX_BODY_START: Final = 200  # of a 200 body that is not a stream, quoted in its failure

_CONTEXT_CODES: Final = frozenset({"context_length_exceeded", "context_window_exceeded"})
_CONTEXT_TEXT: Final = re.compile(
    r"context[_ ]length|context window|maximum context|prompt is too long|input is too long"
    r"|too many (input |prompt )?tokens|reduce the length of the (messages|prompt)"
    r"|exceeds? (the )?(model'?s? )?(maximum )?(context|token limit)",
    re.IGNORECASE,
)
# Error ``type``/``code`` values seen in vendor bodies and mid-stream error events.
_TYPE_CODES: Final[Mapping[str, FailureCode]] = {
    "overloaded_error": "SERVER",
    "api_error": "SERVER",
    "server_error": "SERVER",
    "internal_server_error": "SERVER",
    "service_unavailable": "SERVER",
    "rate_limit_error": "RATE_LIMIT",
    "rate_limit_exceeded": "RATE_LIMIT",
    "authentication_error": "AUTH",
    "permission_error": "AUTH",
    "invalid_api_key": "AUTH",
    "timeout_error": "TIMEOUT",
    "invalid_request_error": "INVALID_REQUEST",
    "not_found_error": "INVALID_REQUEST",
    "request_too_large": "INVALID_REQUEST",
}
# A mid-stream error with neither a known type nor an HTTP-style code, only a text
# (Ollama's ``{"error": "model is overloaded, please retry"}``): classified by its words.
_RATE_LIMIT_TEXT: Final = re.compile(r"rate[ _-]?limit|too many requests", re.IGNORECASE)
_SERVER_TEXT: Final = re.compile(
    r"overloaded|server error|internal error|temporarily unavailable|service unavailable"
    r"|please retry|try again later",
    re.IGNORECASE,
)
# Finish reasons that say the server gave up mid-reply: OpenRouter/Mistral ``error``,
# vLLM ``abort``, DeepSeek ``insufficient_system_resource``.
FAILED_FINISHES: Final = frozenset({"error", "abort", "insufficient_system_resource"})


class _Kinds:
    """The exception classes of the HTTP library, once it is imported.

    Only modules in ``sys.modules`` are consulted: classifying a failure never pays for
    an import.
    """

    def __init__(self) -> None:
        timeouts: list[type[BaseException]] = [TimeoutError]
        transports: list[type[BaseException]] = [OSError, EOFError]
        aiohttp = sys.modules.get("aiohttp")
        if aiohttp is not None:
            # ``ClientPayloadError``: a body cut short (a chunked stream that ended without
            # its last chunk); its timeouts are ``TimeoutError`` subclasses already.
            transports.extend([aiohttp.ClientConnectionError, aiohttp.ClientPayloadError])
        self.timeouts = tuple(timeouts)
        self.transports = tuple(transports)


def _kinds() -> _Kinds:
    return _Kinds()


def retry_after_seconds(
    headers: Mapping[str, str] | None, *, now: Callable[[], float] = time.time
) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or HTTP date).

    A value that is not a finite number (``inf``, ``nan``, ``1e400``) is ignored as a
    malformed one is; a huge finite one is returned as it is (bounding the wait is the
    retry policy's business)."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        millis = _finite(raw_ms)
        if millis is not None:
            return max(0.0, millis / 1000.0)
    raw = headers.get("retry-after")
    if not raw:
        return None
    seconds = _finite(raw)
    if seconds is not None:
        return max(0.0, seconds)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())


def _finite(raw: str) -> float | None:
    """``raw`` as a finite float, or None."""
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def request_id_from(headers: Mapping[str, str] | None) -> str | None:
    """The vendor's request id, as the server sent it: :func:`clean_request_id` it before
    it goes into a failure."""
    if not headers:
        return None
    for name in REQUEST_ID_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


def clean_request_id(request_id: object, secrets: Iterable[Secret | str | None] = ()) -> str | None:
    """A request id fit for the durable log: a string, scrubbed of the key (a server may
    echo it), at most 200 characters."""
    if not isinstance(request_id, str) or not request_id:
        return None
    return _bounded(scrub(request_id, secrets), _MAX_REQUEST_ID)


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """``(type, code, message)`` from an OpenAI- or Anthropic-shaped error body."""
    message: str | None = None
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping):
            body = inner
        elif isinstance(inner, str):  # Ollama-style {"error": "text"}
            message = inner
    if isinstance(body, str):
        return None, None, body or None
    if not isinstance(body, Mapping):
        return None, None, message
    type_ = body.get("type")
    code = body.get("code")
    text = body.get("message")
    return (
        type_ if isinstance(type_, str) else None,
        str(code) if code is not None else None,
        text if isinstance(text, str) and text else message,
    )


def _is_context_error(code: str | None, type_: str | None, text: str) -> bool:
    return code in _CONTEXT_CODES or type_ in _CONTEXT_CODES or bool(_CONTEXT_TEXT.search(text))


def _code_for_status(status: int, type_: str | None, code: str | None, text: str) -> FailureCode:
    if status == 429:
        return "RATE_LIMIT"
    if status in (401, 403):
        return "AUTH"
    if status == 408:
        return "TIMEOUT"
    if status >= 500:
        return "SERVER"
    if 400 <= status < 500:
        if _is_context_error(code, type_, text):
            return "CONTEXT_WINDOW_EXCEEDED"
        return "INVALID_REQUEST"
    # A 2xx carrying an error (Anthropic's mid-stream ``error`` event): go by its type.
    return _code_for_type(type_, code, text)


def _code_for_type(type_: str | None, code: str | None, text: str) -> FailureCode:
    """The code of an error body that came without an HTTP error status (mid-stream, or
    with a 200): by its type or code name, an HTTP-style numeric code (OpenRouter's
    ``{"code": 429}``), else by its words."""
    if _is_context_error(code, type_, text):
        return "CONTEXT_WINDOW_EXCEEDED"
    for key in (type_, code):
        if key is not None and key in _TYPE_CODES:
            return _TYPE_CODES[key]
    if code is not None and code.isdecimal() and len(code) == 3 and code[0] in "45":
        return _code_for_status(int(code), type_, None, text)
    if _RATE_LIMIT_TEXT.search(text):
        return "RATE_LIMIT"
    if _SERVER_TEXT.search(text):
        return "SERVER"
    return "UNKNOWN"


def _headers_of(err: BaseException) -> Mapping[str, str] | None:
    response = getattr(err, "response", None)
    headers = getattr(response, "headers", None)
    return headers if isinstance(headers, Mapping) else None


def _describe_cause(err: BaseException) -> str:
    cause = err.__cause__ or err.__context__
    if cause is None or cause is err:
        return str(err) or type(err).__name__
    detail = str(cause) or type(cause).__name__
    return f"{err} ({type(cause).__name__}: {detail})"


# What each timeout of :mod:`.http` means.
_TIMEOUT_KINDS: Final[Mapping[str, str]] = {
    "ConnectTimeout": "could not connect to the server within {connect}",
    "ReadTimeout": "no data from the server for {read}",
}


def _describe_timeout(err: BaseException, timeout: float | None, streaming: bool) -> str:
    """What timed out, and after how long (``timeout`` is the provider's; connecting is
    bounded by at most 10 s of it, see :class:`.http.WireClient`)."""
    chain: BaseException | None = err
    kind: str | None = None
    while chain is not None and kind is None:
        kind = type(chain).__name__ if type(chain).__name__ in _TIMEOUT_KINDS else None
        chain = chain.__cause__ or chain.__context__
    read = f"{timeout:g} s" if timeout is not None else "the provider's timeout"
    connect = f"{min(timeout, 10.0):g} s" if timeout is not None else "the connect timeout"
    if kind is None:
        return f"no reply within {read}"
    text = _TIMEOUT_KINDS[kind].format(connect=connect, read=read)
    if kind == "ReadTimeout":
        text += " (the stream stalled)" if streaming else " (no response to the request)"
    return text


def classify(
    err: BaseException,
    *,
    vendor: str,
    secrets: Iterable[Secret | str | None] = (),
    request_id: str | None = None,
    timeout: float | None = None,
    responded: bool = False,
) -> LlmFailure:
    """The :class:`LlmFailure` for ``err``, raised by a request or its stream.

    ``request_id`` is the id of the response already streaming, used when ``err`` has
    none of its own (a failure mid-stream); ``timeout`` the provider's and ``responded``
    (the response had begun), for the message of a timeout.
    """
    kinds = _kinds()
    headers = _headers_of(err)
    rid = request_id_from(headers) or getattr(err, "request_id", None) or request_id
    body = getattr(err, "body", None)
    type_, code, api_message = _error_fields(body)
    status = getattr(err, "status_code", None)
    status = status if isinstance(status, int) else None
    failure_code: FailureCode
    retry_after: float | None = None

    if isinstance(err, SseEventTooLargeError | JsonReplyTooLargeError):
        failure_code, status = "UNKNOWN", None
        text = f"the model's reply cannot be logged: {vendor} sent {err}; stopped reading"
    elif isinstance(err, kinds.timeouts):
        failure_code, status = "TIMEOUT", None
        detail = _describe_timeout(err, timeout, streaming=responded)
        text = f"{vendor} request timed out: {detail}"
    elif isinstance(err, kinds.transports):
        failure_code, status = "TRANSPORT", None
        text = f"{vendor} connection failed: {_describe_cause(err)}"
    elif isinstance(err, NotAStreamError):
        failure_code, status = "UNKNOWN", None
        kind = err.content_type
        hint = (
            "a JSON body that is neither an error nor a reply of this API"
            if kind == "application/json" or kind.endswith("+json")
            else "not an event stream (a proxy or a login page?)"
        )
        start = _bounded(scrub(err.body, secrets), _MAX_BODY_START)
        text = (
            f"{vendor} answered 200 with content-type {kind or '(none)'!r}, {hint}; "
            f"check base_url. The body starts: {start!r}"
        )
    elif status is not None and status >= 300:
        detail = api_message or str(err)
        failure_code = _code_for_status(status, type_, code, detail)
        text = f"{vendor} returned HTTP {status}: {detail}"
        if failure_code in ("RATE_LIMIT", "SERVER"):  # 429, 503, Anthropic's 529, ...
            retry_after = retry_after_seconds(headers)
    elif body is not None or status is not None:
        # An error event inside a 200 stream (OpenAI ``{"error": …}`` chunk, Anthropic
        # ``event: error``), or a 200 whose whole body is an error: no HTTP status.
        detail = api_message or str(err)
        failure_code, status = _code_for_type(type_, code, detail), None
        what = err if isinstance(err, StreamReportedError) else "stream reported an error"
        text = f"{vendor} {what} ({type_ or code or 'unknown'}): {detail}"
    else:
        failure_code, status = "UNKNOWN", None
        text = f"{vendor} request failed: {type(err).__name__}: {err}"

    return LlmFailure(
        message=_bounded(scrub(text, secrets), _MAX_MESSAGE),
        code=failure_code,
        status=status,
        retry_after_s=retry_after,
        request_id=clean_request_id(rid, secrets),
    )


def to_model_error(
    err: BaseException,
    *,
    vendor: str,
    secrets: Iterable[Secret | str | None] = (),
    request_id: str | None = None,
    timeout: float | None = None,
    responded: bool = False,
) -> ModelError:
    """A :class:`ModelError` for ``err``, to raise outside the ``except`` that caught
    ``err`` (so the HTTP library's exception, which may hold the request and its key, is
    not kept as its ``__context__``)."""
    failure = classify(
        err,
        vendor=vendor,
        secrets=secrets,
        request_id=request_id,
        timeout=timeout,
        responded=responded,
    )
    return ModelError(failure)


def empty_response(
    vendor: str, request_id: str | None, secrets: Iterable[Secret | str | None] = ()
) -> ModelError:
    return ModelError(
        LlmFailure(
            message=f"{vendor} finished without text or tool calls",
            code="EMPTY_RESPONSE",
            request_id=clean_request_id(request_id, secrets),
        )
    )


def finished_with_error(
    vendor: str,
    reason: str | None,
    request_id: str | None,
    secrets: Iterable[Secret | str | None] = (),
) -> ModelError:
    """The failure of a stream that ended with a finish reason saying the server failed
    (``error``, ``abort``, ...: ``SERVER``) or with one corral does not know (``UNKNOWN``:
    the reply may be cut short, so it is not taken as complete)."""
    shown = _bounded(scrub(repr(reason), secrets), 100)
    if reason in FAILED_FINISHES:
        code: FailureCode = "SERVER"
        text = f"{vendor} ended the reply with finish reason {shown}: the server failed mid-reply"
    else:
        code = "UNKNOWN"
        text = (
            f"{vendor} ended the reply with finish reason {shown}, which corral does not "
            f"know: the reply is not taken as complete"
        )
    return ModelError(
        LlmFailure(message=text, code=code, request_id=clean_request_id(request_id, secrets))
    )
