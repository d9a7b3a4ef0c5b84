"""Every way a vendor call fails, normalized to one :class:`~storage.events.LlmFailure`.

The codes are CONTRACT section 5's:

========================  ==========================================================
``RATE_LIMIT``            HTTP 429 (``retry_after_s`` from ``retry-after-ms`` /
                          ``retry-after``), or a rate-limit error event mid-stream
``SERVER``                HTTP 5xx, Anthropic ``overloaded_error`` (529) (both with
                          ``retry_after_s`` as a 429), a server error event mid-stream
``TIMEOUT``               connect/read/pool timeout (a stalled stream), HTTP 408
``TRANSPORT``             connection refused, reset or dropped mid-stream
``CONTEXT_WINDOW_EXCEEDED``  a 4xx whose code or message says the prompt is too long
``AUTH``                  HTTP 401 / 403
``INVALID_REQUEST``       any other 4xx
``EMPTY_RESPONSE``        a completion with no text and no tool calls
``UNKNOWN``               anything else (a bug, an unparseable reply)
========================  ==========================================================

Every message is scrubbed of the provider's key (:func:`~.secrets.scrub`); the vendor's
request id (``x-request-id`` / ``request-id``) is kept in ``request_id``.
"""

from __future__ import annotations

import email.utils
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from actors.model import ModelError
from storage.events import FailureCode, LlmFailure

from .secrets import Secret, scrub

__all__ = [
    "REQUEST_ID_HEADERS",
    "StreamReportedError",
    "cause_for",
    "classify",
    "empty_response",
    "request_id_from",
    "retry_after_seconds",
    "to_model_error",
]

REQUEST_ID_HEADERS: Final = ("x-request-id", "request-id")
_MAX_MESSAGE: Final = 600

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


class StreamReportedError(Exception):
    """An error event inside a 200 stream; ``body`` is the event's JSON payload."""

    def __init__(self, body: object) -> None:
        super().__init__("the stream reported an error")
        self.body = body


class _Kinds:
    """The exception classes of the SDKs (and ``httpx2``/``anyio``) already imported.

    Only modules in ``sys.modules`` are consulted: a provider in use has imported its SDK,
    and classifying a failure never pays for importing another vendor's.
    """

    def __init__(self) -> None:
        timeouts: list[type[BaseException]] = [TimeoutError]
        transports: list[type[BaseException]] = [OSError, EOFError]
        validation: list[type[BaseException]] = []
        for name in ("openai", "anthropic"):
            sdk = sys.modules.get(name)
            if sdk is not None:
                timeouts.append(sdk.APITimeoutError)
                transports.append(sdk.APIConnectionError)
                validation.append(sdk.APIResponseValidationError)
        httpx2 = sys.modules.get("httpx2")
        if httpx2 is not None:
            timeouts.append(httpx2.TimeoutException)
            transports.append(httpx2.TransportError)
        anyio = sys.modules.get("anyio")
        if anyio is not None:
            transports.extend([anyio.EndOfStream, anyio.BrokenResourceError])
        self.timeouts = tuple(timeouts)
        self.transports = tuple(transports)
        self.validation = tuple(validation)


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
    if not headers:
        return None
    for name in REQUEST_ID_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


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
    if _is_context_error(code, type_, text):
        return "CONTEXT_WINDOW_EXCEEDED"
    for key in (type_, code):
        if key is not None and key in _TYPE_CODES:
            return _TYPE_CODES[key]
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


def classify(
    err: BaseException,
    *,
    vendor: str,
    secrets: Iterable[Secret | str | None] = (),
    request_id: str | None = None,
) -> LlmFailure:
    """The :class:`LlmFailure` for ``err``, raised by an SDK call or its stream.

    ``request_id`` is the id of the response already streaming, used when ``err`` has
    none of its own (a failure mid-stream).
    """
    kinds = _kinds()
    headers = _headers_of(err)
    rid = request_id_from(headers) or getattr(err, "request_id", None) or request_id
    rid = rid if isinstance(rid, str) else None
    body = getattr(err, "body", None)
    type_, code, api_message = _error_fields(body)
    status = getattr(err, "status_code", None)
    status = status if isinstance(status, int) else None
    failure_code: FailureCode
    retry_after: float | None = None

    if isinstance(err, kinds.validation):
        failure_code, status = "UNKNOWN", None
        text = f"{vendor} sent a reply that does not parse: {err}"
    elif isinstance(err, kinds.timeouts):
        failure_code, status = "TIMEOUT", None
        text = f"{vendor} request timed out: {_describe_cause(err)}"
    elif isinstance(err, kinds.transports):
        failure_code, status = "TRANSPORT", None
        text = f"{vendor} connection failed: {_describe_cause(err)}"
    elif status is not None and status >= 300:
        detail = api_message or str(err)
        failure_code = _code_for_status(status, type_, code, detail)
        text = f"{vendor} returned HTTP {status}: {detail}"
        if failure_code in ("RATE_LIMIT", "SERVER"):  # 429, 503, Anthropic's 529, ...
            retry_after = retry_after_seconds(headers)
    elif body is not None or status is not None:
        # An error event inside a 200 stream (OpenAI ``{"error": …}`` chunk, Anthropic
        # ``event: error``): no HTTP status of its own.
        detail = api_message or str(err)
        failure_code, status = _code_for_type(type_, code, detail), None
        text = f"{vendor} stream reported an error ({type_ or code or 'unknown'}): {detail}"
    else:
        failure_code, status = "UNKNOWN", None
        text = f"{vendor} request failed: {type(err).__name__}: {err}"

    message = scrub(text, secrets)
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    return LlmFailure(
        message=message,
        code=failure_code,
        status=status,
        retry_after_s=retry_after,
        request_id=rid,
    )


def to_model_error(
    err: BaseException,
    *,
    vendor: str,
    secrets: Iterable[Secret | str | None] = (),
    request_id: str | None = None,
) -> ModelError:
    """A :class:`ModelError` for ``err``; raise it ``from cause_for(err, secrets)``."""
    return ModelError(classify(err, vendor=vendor, secrets=secrets, request_id=request_id))


def empty_response(vendor: str, request_id: str | None) -> ModelError:
    return ModelError(
        LlmFailure(
            message=f"{vendor} finished without text or tool calls",
            code="EMPTY_RESPONSE",
            request_id=request_id,
        )
    )


def cause_for(err: BaseException, secrets: Iterable[Secret | str | None]) -> BaseException | None:
    """``err`` itself, unless its text (or its cause's) holds a secret: then ``None``.

    Used as ``raise to_model_error(err, …) from cause_for(err, …)`` so a traceback never
    prints a key that a server echoed back.
    """
    secrets = tuple(secrets)
    chain: BaseException | None = err
    while chain is not None:
        text = f"{chain!s} {getattr(chain, 'body', '')!s}"
        if scrub(text, secrets) != text:
            return None
        chain = chain.__cause__ or chain.__context__
    return err
