"""Deterministic test mode: step one agent's turn coroutine by hand.

:class:`TurnHarness` builds a :class:`~actors.turn.TurnMachine` over an in-memory session
(no threads, no I/O) and lets a test play the stepper: it sees each effect the turn
awaits and chooses what comes back, and when — including cancels between any two
effects. A test can therefore force any interleaving of completions and control
messages, and two runs with the same choices give the same log: a ``JoinTool`` lists the
calls in flight, and the test answers ``(handle, ToolRun(...))`` for whichever of them it
lets end first.

Nothing runs behind the test's back. Sync listeners on ``h.bus`` run inline, as on the
agent's actor. Async ones run only when the test runs them: a chain of serial or
waterfall listeners with an async one is the pending :class:`~actors.effects.RunAsync`
effect, whose ``work()`` the test runs itself (e.g. ``asyncio.run(effect.work())``) and
whose value it sends back; an async listener of an emitted event (``agent/settled``,
``agent/status``...) is queued in ``h.listener_work`` until the test calls
:meth:`TurnHarness.run_listeners`.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from functools import partial
from typing import Any, cast

from storage import (
    DEFAULT_MAX_EVENT_BYTES,
    CancelCause,
    Codec,
    EventTypes,
    InboxLane,
    MemorySink,
    RequestConfig,
    Session,
    SessionHeader,
    StreamChunk,
    TextBlock,
    UserMessage,
)

from ._ioside import IoSide, Outcome
from .bus import Bus
from .effects import (
    Admit,
    Checkpoint,
    Effect,
    Flush,
    JoinTool,
    NextBatch,
    Sleep,
    StreamEnd,
    TurnAborted,
)
from .events import AGENT_EVENTS
from .inbox import Inbox
from .toolphase import ToolPhase, ToolRun
from .tools import Tool, shown
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


_BATCH_ITEMS = (*typing.get_args(StreamChunk), StreamEnd)


def _is_batch(value: object) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(i, _BATCH_ITEMS) for i in value)


# What the pending effect is completed with (see ``actors.agent``, the production
# stepper); effects not listed take any value (an opaque handle, a listener's result).
_EXPECTED: dict[type, tuple[str, Callable[[object], bool]]] = {
    Admit: ("None", lambda v: v is None),
    Checkpoint: ("None", lambda v: v is None),
    Flush: ("None", lambda v: v is None),
    Sleep: ("None", lambda v: v is None),
    NextBatch: (
        "a list of stream chunks (TextDelta, ReasoningDelta, ToolCallDelta, UsageChunk, "
        "FinishChunk; StreamEnd() last to end the stream)",
        _is_batch,
    ),
    JoinTool: (
        "a (handle, ToolRun) pair",
        lambda v: isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], ToolRun),
    ),
}


class _ListenerWork:
    """The harness's stand-in for the I/O side, which the bus asks to run the async
    listeners of emitted events: it queues each call for the test to run."""

    blocking_pool = None  # a deferred chain's sync listeners: the test loop's executor

    def __init__(self) -> None:
        self.queued: list[tuple[Callable[[], Awaitable[object]], Any]] = []

    def start(self, work: Any, *, on_done: Any, listener: bool = False) -> None:
        self.queued.append((work, on_done))

    def in_loop_thread(self) -> bool:
        return False


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
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        """``max_event_bytes``: the session's event limit (and so the largest reply)."""
        self.sink = MemorySink()
        header = SessionHeader(id=agent_id, key=1, created=0)
        clock = iter(range(10**9))
        codec = Codec(EventTypes.default(), max_event_bytes=max_event_bytes)
        self.session = Session(header, sink=self.sink, codec=codec, clock=lambda: next(clock))
        self.agent = HarnessAgent(agent_id)
        # Async listeners of emitted events are queued for the test (run_listeners).
        self._listener_work = _ListenerWork()
        self.bus = Bus(cast(IoSide, self._listener_work))
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
        message = UserMessage(id=mid, content=(TextBlock(text=text),))
        self.inbox.reserve(mid)
        self.inbox.insert(lane, message)
        return message

    def start(self) -> Effect[Any] | None:
        """Start draining the inbox; returns the first effect awaited (None: finished).
        Raises ``RuntimeError`` while a turn runs (step it until :attr:`done` first)."""
        if self._coro is not None:
            raise RuntimeError(
                f"a turn is running (pending: {type(self.pending).__name__}); step it until "
                "done before start()"
            )
        self._coro = self.machine.drain()
        return self._step(lambda c: c.send(None))

    def send(self, value: Any = None) -> Effect[Any] | None:
        """Complete the pending effect with ``value``; returns the next effect.

        ``value`` is what the effect resumes with: None for ``Checkpoint``, ``Flush``,
        ``Sleep`` and ``Admit``, a list of chunks for ``NextBatch``, ``(handle, ToolRun)``
        for ``JoinTool`` (one of its ``handles``), any handle for ``OpenStream`` and
        ``StartTool``, the value of its ``work()`` for ``RunAsync``. Anything else raises
        ``TypeError`` before the turn is resumed: the turn is unchanged."""
        pending = self._running()
        expected = _EXPECTED.get(type(pending))
        if expected is not None and not expected[1](value):
            raise TypeError(
                f"the pending {type(pending).__name__} takes {expected[0]}, got "
                f"{shown(value)}; the turn was not resumed"
            )
        if isinstance(pending, NextBatch):
            # As the agent steps it: with the turn's consume, the turn resumes only with
            # its answer (else the same NextBatch stays pending).
            answer = pending.answer(value)
            if answer is None:
                return pending
            value, error = answer
            if error is not None:
                return self.throw(error)
        return self._step(lambda c: c.send(value))

    def throw(self, error: BaseException) -> Effect[Any] | None:
        """Complete the pending effect with ``error``; returns the next effect."""
        self._running()
        if not isinstance(error, BaseException):
            raise TypeError(f"throw() takes an exception, got {shown(error)}")
        return self._step(lambda c: c.throw(error))

    @property
    def listener_work(self) -> list[Callable[[], Awaitable[object]]]:
        """The async listener calls of emitted events not run yet, in emit order."""
        return [work for work, _ in self._listener_work.queued]

    def run_listeners(self) -> int:
        """Run the queued async listener calls of emitted events (:attr:`listener_work`),
        in order, each to its end on an event loop of its own; a failure is logged and
        contained, as in production. Returns how many ran."""
        queued = self._listener_work.queued
        ran = 0
        while queued:
            work, on_done = queued.pop(0)
            try:
                asyncio.run(cast(Coroutine[Any, Any, object], work()))
            except Exception as err:  # noqa: BLE001 - the listener's failure, contained
                on_done(Outcome(0, error=err))
            else:
                on_done(Outcome(0))
            ran += 1
        return ran

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

    def _running(self) -> Effect[Any] | None:
        if self._coro is None:
            raise RuntimeError("no turn is running; insert a message and call start()")
        return self.pending

    def _step(self, step: Any) -> Effect[Any] | None:
        assert self._coro is not None, "the turn is not running; call start()"
        try:
            self.pending = step(self._coro)
        except StopIteration:
            self._coro = None
            self.pending = None
        except BaseException:  # the coroutine raised: it is over (the actor would crash)
            self._coro = None
            self.pending = None
            raise
        return self.pending

    # ------------------------------------------------------------------ reading

    def types(self) -> list[str]:
        return [e.type for e in self.session.events()]

    def live(self) -> list[str]:
        return [name for name, _ in self.emitted]
