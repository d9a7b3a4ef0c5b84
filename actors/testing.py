"""Deterministic test mode: step one agent's turn coroutine by hand.

:class:`TurnHarness` builds a :class:`~actors.turn.TurnMachine` over an in-memory session
(no threads, no I/O) and lets a test play the stepper: it sees each effect the turn
awaits and chooses what comes back, and when — including cancels between any two
effects. A test can therefore force any interleaving of completions and control
messages, and two runs with the same choices give the same log.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from functools import partial
from typing import Any, cast

from storage.codec import Codec, EventTypes
from storage.events import CancelCause, InboxLane, RequestConfig, TextBlock, UserMessage
from storage.memory import MemorySink
from storage.session import Session, SessionHeader

from ._ioside import IoSide
from .bus import Bus
from .effects import Effect, TurnAborted
from .inbox import Inbox
from .live import AGENT_EVENTS
from .toolphase import ToolPhase
from .tools import Tool
from .turn import Durability, TurnMachine

__all__ = ["HarnessAgent", "TurnHarness"]

_INTERCEPTIONS = frozenset(
    {
        "agent/pre-step",
        "agent/request",
        "agent/request-error",
        "agent/turn-stopping",
        "tools/pre-execute",
        "tools/execute",
        "tools/post-execute",
    }
)


class HarnessAgent:
    """The agent handle the harness puts in live events."""

    def __init__(self, agent_id: str) -> None:
        self._id = agent_id

    @property
    def id(self) -> str:
        return self._id


class TurnHarness:
    """One agent's machine, stepped by the test."""

    def __init__(
        self,
        *,
        tools: Mapping[str, Tool] | None = None,
        durability: Durability = "write-ahead",
        agent_id: str = "harness",
    ) -> None:
        self.sink = MemorySink()
        header = SessionHeader(id=agent_id, key=1, created=0)
        clock = iter(range(10**9))
        self.session = Session(
            header, sink=self.sink, codec=Codec(EventTypes.default()), clock=lambda: next(clock)
        )
        self.agent = HarnessAgent(agent_id)
        # Only sync listeners run in this mode, so the bus never needs an I/O side.
        self.bus = Bus(cast(IoSide, None))
        self.emitted: list[tuple[str, Any]] = []
        for name in AGENT_EVENTS - _INTERCEPTIONS:
            self.bus.on(name, partial(self._record, name))
        self.inbox = Inbox(
            append_fact=self.session.append_fact,
            emit=lambda name, payload: self.bus.emit(name, payload, scope=agent_id),
            agent=self.agent,
        )
        phase = ToolPhase(
            agent=self.agent,
            tools=tools or {},
            append_fact=self.session.append_fact,
            waterfall=lambda n, e, d: self.bus.waterfall(n, e, d, scope=agent_id),
            emit=lambda name, payload: self.bus.emit(name, payload, scope=agent_id),
        )
        self.machine = TurnMachine(
            agent=self.agent,
            session=self.session,
            inbox=self.inbox,
            bus=self.bus,
            tools=phase,
            default_config=lambda: RequestConfig(provider="test", model="harness"),
            durability=durability,
        )
        self._coro: Coroutine[Any, Any, None] | None = None
        self._inserted = 0
        self.pending: Effect[Any] | None = None

    def _record(self, name: str, event: Any) -> None:
        self.emitted.append((name, event))

    # ------------------------------------------------------------------ driving

    def insert(
        self, text: str, *, lane: InboxLane = "next-turn", message_id: str | None = None
    ) -> UserMessage:
        """Put a message in the inbox as the actor would (reserve, splice, announce)."""
        self._inserted += 1
        mid = message_id or f"m{self._inserted}"
        message = UserMessage(id=mid, content=[TextBlock(text=text)])
        self.inbox.reserve(mid)
        self.inbox.insert(lane, message)
        return message

    def start(self) -> Effect[Any] | None:
        """Start draining the inbox; returns the first effect awaited (None: finished)."""
        self._coro = self.machine.drain()
        return self._step(lambda c: c.send(None))

    def send(self, value: Any = None) -> Effect[Any] | None:
        """Complete the pending effect with ``value``; returns the next effect."""
        return self._step(lambda c: c.send(value))

    def throw(self, error: BaseException) -> Effect[Any] | None:
        """Complete the pending effect with ``error``; returns the next effect."""
        return self._step(lambda c: c.throw(error))

    def cancel(self, cause: CancelCause) -> Effect[Any] | None:
        """Abort the running turn; an abortable pending effect is interrupted at once."""
        signal = self.machine.signal
        if signal is None or not signal.abort(cause):
            return self.pending
        if self.pending is not None and self.pending.abortable:
            return self.throw(TurnAborted())
        return self.pending

    @property
    def done(self) -> bool:
        return self._coro is None

    def _step(self, step: Any) -> Effect[Any] | None:
        assert self._coro is not None, "the turn is not running; call start()"
        try:
            self.pending = step(self._coro)
        except StopIteration:
            self._coro = None
            self.pending = None
        return self.pending

    # ------------------------------------------------------------------ reading

    def types(self) -> list[str]:
        return [e.type for e in self.session.events()]

    def live(self) -> list[str]:
        return [name for name, _ in self.emitted]
