"""``ClusterAgent``: the driver's handle of an agent that lives in some shard.

The verbs of :class:`~runtime.Agent`, each one round trip on the shard's direct
connection (see :mod:`runtime.cluster.connection`; :class:`~runtime.cluster.Cluster` has
the batched forms, and ``dispose`` goes through Ray). A send's ``MessageId`` is chosen
here, in the driver, so that a send the driver repeats after a shard restart is
recognised by the shard and applied once.

A send returns once the shard has it in the agent's mailbox (``wait=True``, one round
trip), or once it is queued in the shard's outbox (``wait=False``, no round trip: its
refusal, if any, is raised by the cluster's next ``flush()``). Sends and inbox edits to
one shard are applied in the order they were made (see :mod:`runtime.cluster.outbox`).
The edits take a text or a ``UserMessage`` per message (a list of content blocks goes
in a ``UserMessage``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol

from runtime import HookCause, InboxView, ParentCause, UserCause, UserMessage
from storage import Event, Message

from .events import ClusterEvent
from .wire import (
    Cancel,
    Clear,
    Events,
    Inbox,
    Messages,
    Passivate,
    Remove,
    Replace,
    Send,
    Splice,
    Status,
    Verb,
    WaitIdle,
)

__all__ = ["ClusterAgent", "ClusterHost"]


class ClusterHost(Protocol):
    """What a handle needs of its :class:`~runtime.cluster.Cluster` (which implements it;
    a protocol, so that the handle does not import the facade that makes it)."""

    def new_message_id(self) -> str: ...

    def send_batch(self, shard: int, sends: list[Send], wait: bool = True) -> None: ...

    def verb(self, shard: int, verb: Verb, timeout: float | None = None) -> Any: ...

    def dispose(
        self, agents: Iterable[ClusterAgent | str], timeout: float | None = None
    ) -> bool: ...

    def listen(
        self, name: str, listener: Callable[[ClusterEvent], object], scope: str | None
    ) -> Callable[[], None]: ...


class ClusterAgent:
    """An agent of a :class:`~runtime.cluster.Cluster` (cheap: an id and its shard)."""

    __slots__ = ("_cluster", "id", "shard")

    def __init__(self, cluster: ClusterHost, agent_id: str, shard: int) -> None:
        self._cluster = cluster
        self.id = agent_id
        self.shard = shard

    def __repr__(self) -> str:
        return f"<ClusterAgent {self.id} shard={self.shard}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterAgent) and (other.id, other.shard) == (self.id, self.shard)

    def __hash__(self) -> int:
        return hash(self.id)

    # ------------------------------------------------------------------ sends

    def _send(
        self,
        message: str | UserMessage,
        lane: Literal["next-turn", "next-step"],
        wake: bool,
        message_id: str | None,
        source: str,
        wait: bool,
    ) -> str:
        if isinstance(message, UserMessage):
            if message_id is not None and message_id != message.id:
                raise ValueError("give the id inside the UserMessage, or pass a str")
            message_id = message.id
        elif not isinstance(message, str):
            raise TypeError(f"a message is a str or a UserMessage, got {type(message).__name__}")
        mid = message_id if message_id is not None else self._cluster.new_message_id()
        send = Send(agent=self.id, message=message, id=mid, lane=lane, wake=wake, source=source)
        self._cluster.send_batch(self.shard, [send], wait)
        return mid

    def followup(
        self,
        message: str | UserMessage,
        *,
        id: str | None = None,
        source: str = "user",
        wait: bool = True,
    ) -> str:
        """Queue ``message`` as its own next turn and wake the agent; its ``MessageId``."""
        return self._send(message, "next-turn", True, id, source, wait)

    def steer(
        self,
        message: str | UserMessage,
        *,
        id: str | None = None,
        source: str = "user",
        wait: bool = True,
    ) -> str:
        """Add ``message`` to the next step of the running turn (or a new turn) and wake."""
        return self._send(message, "next-step", True, id, source, wait)

    def inject(
        self,
        message: str | UserMessage,
        *,
        id: str | None = None,
        source: str = "user",
        wait: bool = True,
    ) -> str:
        """Add ``message`` to the next step without waking an idle agent."""
        return self._send(message, "next-step", False, id, source, wait)

    # ------------------------------------------------------------------ editing

    def remove(self, message_id: str, *, timeout: float | None = 10.0) -> UserMessage:
        """As :meth:`runtime.Agent.remove`: discard one pending message; returns it."""
        removed: UserMessage = self._cluster.verb(
            self.shard, Remove(self.id, message_id, timeout), timeout
        )
        return removed

    def replace(
        self, message_id: str, message: str | UserMessage, *, timeout: float | None = 10.0
    ) -> str:
        """As :meth:`runtime.Agent.replace`: swap a pending message for ``message`` in
        its place; returns the new ``MessageId``."""
        new_id: str = self._cluster.verb(
            self.shard, Replace(self.id, message_id, message, timeout), timeout
        )
        return new_id

    def splice(
        self,
        lane: Literal["next-turn", "next-step"],
        start: int,
        removed_count: int = 0,
        messages: Sequence[str | UserMessage] = (),
        *,
        timeout: float | None = 10.0,
    ) -> list[UserMessage]:
        """As :meth:`runtime.Agent.splice`: in ``lane``, discard ``removed_count``
        pending messages from ``start`` and insert ``messages`` there; returns the
        discarded ones. Nothing wakes the agent."""
        if isinstance(messages, str | bytes) or not isinstance(messages, Iterable):
            raise TypeError(
                f"messages is a list of messages, got {type(messages).__name__} "
                "(one text is one message: pass [text])"
            )
        verb = Splice(self.id, lane, start, removed_count, list(messages), timeout)
        removed: list[UserMessage] = self._cluster.verb(self.shard, verb, timeout)
        return removed

    def clear(self, *, timeout: float | None = 10.0) -> list[UserMessage]:
        """As :meth:`runtime.Agent.clear`: discard every pending message; returns them."""
        cleared: list[UserMessage] = self._cluster.verb(
            self.shard, Clear(self.id, timeout), timeout
        )
        return cleared

    # ------------------------------------------------------------------ control

    def cancel(
        self, cause: UserCause | ParentCause | HookCause | None = None, *, keep_inbox: bool = False
    ) -> None:
        """As :meth:`runtime.Agent.cancel` (``cause`` a ``UserCause()``, ...)."""
        if type(keep_inbox) is not bool:
            raise TypeError(f"keep_inbox is a bool, got {keep_inbox!r}")
        self._cluster.verb(self.shard, Cancel(self.id, cause, keep_inbox))

    def dispose(self, timeout: float | None = None) -> bool:
        """As :meth:`runtime.Agent.dispose`; idempotent."""
        return self._cluster.dispose([self], timeout=timeout)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Whether every send before this call was handled and the agent went idle."""
        return bool(self._cluster.verb(self.shard, WaitIdle([self.id], timeout), timeout))

    def passivate(self, timeout: float | None = 10.0) -> bool:
        """As :meth:`runtime.Agent.passivate`: evict the idle agent from its shard's
        memory until its next use; False (and nothing done) if it is busy."""
        return bool(self._cluster.verb(self.shard, Passivate(self.id, timeout), timeout))

    def on(self, name: str, listener: Callable[[ClusterEvent], object]) -> Callable[[], None]:
        """Listen to this agent's live events only; returns a disposer."""
        return self._cluster.listen(name, listener, self.id)

    # ------------------------------------------------------------------ reading

    @property
    def status(self) -> Literal["idle", "running"]:
        status: Literal["idle", "running"] = self._cluster.verb(self.shard, Status(self.id))
        return status

    @property
    def inbox(self) -> InboxView:
        """A snapshot of the pending messages of both lanes (as ``agent.inbox``)."""
        inbox: InboxView = self._cluster.verb(self.shard, Inbox(self.id))
        return inbox

    def events(self, lower: int = 0, upper: int | None = None) -> list[Event]:
        """The session's committed events with ``lower <= seq <= upper`` (as
        ``agent.session.events``)."""
        events: list[Event] = self._cluster.verb(self.shard, Events(self.id, lower, upper))
        return events

    def messages(self) -> list[Message]:
        """The model-visible history (``agent.session.messages()``)."""
        messages: list[Message] = self._cluster.verb(self.shard, Messages(self.id))
        return messages
