"""Every error of the ``actors`` layer, each named by the state it reports.

Every message says what happened and what to do about it. The tree (all under
``storage.errors.CorralError``, the project's common base)::

    CorralError
    ├── EngineError               the actor engine's own (mailbox, dispatcher, I/O side,
    │   │                         scheduler, registry ids, listeners)
    │   └── AgentKilledError      an agent actor crashed on purpose (``Kill``)
    ├── AgentStateError           an agent's state refuses a verb (inbox, lifetime, waits)
    ├── ModelError                a model request failed (carries its ``LlmFailure``)
    └── ToolArgumentError         a model's tool arguments do not fit the tool (a ValueError)

``TurnAborted`` (``actors.effects``) is not an error: it is how a cancel unwinds the turn
coroutine, and nothing outside the turn machine sees it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage import CorralError

if TYPE_CHECKING:
    from storage import LlmFailure

__all__ = [
    "AgentDisposedError",
    "AgentKilledError",
    "AgentStateError",
    "DispatcherShutdownError",
    "DuplicateIdError",
    "DuplicateMessageError",
    "EditTimeoutError",
    "EngineError",
    "InboxFullError",
    "InvalidMessageError",
    "IoSideClosedError",
    "ListenerError",
    "MailboxFullError",
    "ModelError",
    "SchedulerClosedError",
    "ToolArgumentError",
    "UnknownMessageError",
    "WaitCycleError",
]


class EngineError(CorralError):
    """Base class of the actor engine's own errors."""


class MailboxFullError(EngineError):
    """A bounded mailbox refused a message because it already holds ``limit`` messages."""

    def __init__(self, actor: str, limit: int, *, waited: float | None = None) -> None:
        self.actor = actor
        self.limit = limit
        self.waited = waited
        how = "" if waited is None else f" after waiting {waited:g} s"
        super().__init__(
            f"mailbox of {actor} is full ({limit} messages){how}; "
            "slow down the sender, raise actor_mailbox_limit, or handle this error"
        )


class DispatcherShutdownError(EngineError):
    """An actor was scheduled onto a dispatcher that has been shut down."""

    def __init__(self, dispatcher: str) -> None:
        self.dispatcher = dispatcher
        super().__init__(
            f"dispatcher {dispatcher!r} is shut down and runs no more actors; "
            "stop its actors before calling Dispatcher.shutdown()"
        )


class IoSideClosedError(EngineError):
    """An effect was started on an I/O side that is closed or closing."""

    def __init__(self) -> None:
        super().__init__("the I/O side is closed; start effects before IoSide.close()")


class SchedulerClosedError(EngineError):
    """A timer was requested from a scheduler that has been closed."""

    def __init__(self) -> None:
        super().__init__("the scheduler is closed; schedule timers before Scheduler.close()")


class DuplicateIdError(EngineError):
    """A registry was asked to create an id it already holds."""

    def __init__(self, id_: str) -> None:
        self.id = id_
        super().__init__(f"id {id_!r} is already registered; choose another id or remove it first")


class ListenerError(EngineError):
    """A ``serial`` or ``waterfall`` listener raised; the original error is the ``cause``."""

    def __init__(self, name: str, listener: object, cause: BaseException) -> None:
        self.name = name
        self.listener = listener
        self.cause = cause
        label = getattr(listener, "__qualname__", None) or repr(listener)
        super().__init__(f"listener {label} for {name!r} failed: {cause!r}")


# --------------------------------------------------------------------------- agent layer


class AgentStateError(CorralError):
    """Base class of errors about an agent's state (its inbox, its lifetime)."""


class DuplicateMessageError(AgentStateError, ValueError):
    """A message id is already pending in the agent's inbox."""


class InboxFullError(AgentStateError):
    """The agent's bounded inbox is full."""


class UnknownMessageError(AgentStateError, KeyError):
    """No pending message has that id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown message"


class AgentDisposedError(AgentStateError):
    """The agent is disposed (or being disposed) and accepts no more work."""


class InvalidMessageError(AgentStateError, TypeError):
    """A verb was given an ill-formed argument: something that is not a message (or
    an ill-typed one, an empty or non-``str`` id, a bad lane or splice range), or a
    message that cannot be logged (it does not fit ``max_event_bytes`` with the records
    that carry it), or a cancel cause that is not one of the ``CancelCause``
    structs or cannot be logged (see ``actors.signal.checked_cause``)."""


class EditTimeoutError(AgentStateError, TimeoutError):
    """An inbox edit was queued but not applied within its timeout. It stays queued: the
    agent applies it in order (or refuses it, then its new ids are free again)."""


class WaitCycleError(AgentStateError):
    """A wait for an agent would close a cycle of waits (agent A's listener waits for
    agent B, whose running code waits for agent A) and so never end; raised before
    anything waits (see ``actors._waits``)."""


class AgentKilledError(EngineError, RuntimeError):
    """Raised inside an agent actor by ``Kill``; the actor dies through pykka's
    failure path, as it would on an unexpected error."""


class ModelError(CorralError):
    """A model request failed; ``failure`` says how, in CONTRACT section 5's codes."""

    def __init__(self, failure: LlmFailure) -> None:
        super().__init__(f"{failure.code}: {failure.message}")
        self.failure = failure


class ToolArgumentError(CorralError, ValueError):
    """The model's arguments do not fit the tool's parameters."""
