"""The runtime layer's errors, in one place: ``RuntimeClosedError`` and the model
providers' (under ``ProviderError``). ``runtime`` re-exports them with those of the
layers below; the whole tree, every error under ``CorralError`` (storage.errors), is in
``docs/errors.md``. An error that derived from a builtin (``ValueError``,
``RuntimeError``) still does, so code that catches the builtin goes on working.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from actors import AgentDisposedError
from storage import CorralError, StoreClosedError

__all__ = [
    "ConnectTimeout",
    "JsonReplyTooLargeError",
    "MissingCredentialsError",
    "NotAStreamError",
    "ProviderError",
    "ReadTimeout",
    "ReplyTimeoutError",
    "RuntimeClosedError",
    "SseEventTooLargeError",
    "StreamReportedError",
    "UnknownModelError",
]


class RuntimeClosedError(AgentDisposedError, StoreClosedError, RuntimeError):
    """The runtime is closed: every public method of it and of its agents' handles
    raises this (``close()`` and ``dispose()`` are idempotent, ``wait_idle()`` returns
    True: a closed runtime's agents are idle for good).

    It is each of the errors these calls raised before it existed, so code that
    catches them goes on working: a ``RuntimeError`` (``spawn``, ``resume``, ``fork``,
    ``on``), a ``StoreClosedError`` (``flush``, ``aflush``), an ``AgentDisposedError``
    (an agent's verbs: close disposed every agent)."""

    def __init__(self) -> None:
        super().__init__("this runtime is closed; open a new one with Runtime.open()")


class ReplyTimeoutError(CorralError, TimeoutError):
    """A reply (``agent.ask``, ``PendingReply.result``, the fan-in helpers) did not come
    within its timeout. The chain goes on: wait again, or ``cancel()`` the agent."""

    def __init__(self, agent_id: str, message_id: str, timeout: float | None) -> None:
        self.agent_id = agent_id
        self.message_id = message_id
        super().__init__(
            f"no reply to message {message_id} of agent {agent_id} within {timeout} s; "
            "its turn goes on: wait again (PendingReply.result) or cancel the agent"
        )


class ProviderError(CorralError):
    """Base of the errors of ``runtime.providers``: a model that cannot be built, or a
    provider's reply that cannot be read."""


class MissingCredentialsError(ProviderError, ValueError):
    """No API key was given and none of the environment variables that may hold one is set."""

    def __init__(self, provider: str, env_names: Iterable[str]) -> None:
        names = list(env_names)
        self.provider = provider
        self.env_names = names
        where = " or ".join(f"${name}" for name in names) or "api_key_env="
        super().__init__(
            f"no API key for provider {provider!r}: pass api_key=..., name a variable with "
            f"api_key_env=..., or set {where}"
        )


class UnknownModelError(ProviderError, ValueError):
    """A model string names no known scheme, or is malformed."""

    def __init__(self, spec: str, known_schemes: Sequence[str], reason: str) -> None:
        self.spec = spec
        known = ", ".join(f"{s}:" for s in known_schemes)
        super().__init__(
            f"cannot resolve model {spec!r}: {reason}; known schemes are {known} "
            "(for example 'openai:gpt-4.1-mini' or 'openai-compatible:NAME@https://host/v1')"
        )


class SseEventTooLargeError(ProviderError, ValueError):
    """A server-sent event (or one line of it) outgrew the decoder's bound."""

    def __init__(self, size: int, bound: int) -> None:
        super().__init__(
            f"a server-sent event of more than {bound} bytes (four times the log's event "
            f"limit; {size} bytes read)"
        )
        self.size = size
        self.bound = bound


class StreamReportedError(ProviderError):
    """An error inside a 200 answer; ``body`` is its JSON payload: an error event
    mid-stream, or (``what`` says so) a whole body that is an error."""

    def __init__(self, body: object, what: str = "stream reported an error") -> None:
        super().__init__(what)
        self.body = body


class NotAStreamError(ProviderError):
    """A 200 answer to a streaming request whose body is not an event stream (an HTML
    login page, a JSON body that is neither an error nor a reply)."""

    def __init__(self, content_type: str, start: str) -> None:
        super().__init__("the server answered 200 with a body that is not an event stream")
        self.content_type = content_type
        self.body = start  # the start of the body, for the failure's message


class JsonReplyTooLargeError(ProviderError):
    """A 200 answer to a streaming request whose JSON body (a server that ignores
    ``stream: true`` sends its whole reply so) outgrew the bound of a reply the log could
    take: ``bound`` is ``event_bound`` of the event limit ``limit``, as for one
    server-sent event (the body may escape every character of the reply)."""

    def __init__(self, size: int, bound: int, limit: int) -> None:
        super().__init__(
            f"a JSON reply too large to log: more than {bound} bytes (four times the log's "
            f"event limit of {limit} bytes, and room for its fields; {size} bytes read)"
        )
        self.size = size
        self.bound = bound
        self.limit = limit


class ConnectTimeout(ProviderError, TimeoutError):
    """No connection to the server within the connect timeout."""


class ReadTimeout(ProviderError, TimeoutError):
    """No data from the server within the read timeout (a stalled stream)."""
