"""``agent.ask`` and ``Reply``: one send, one result.

A send returns its ``MessageId``; :class:`ReplyWatch` follows that id through the
agent's live events until the turn chain it started has settled:

- ``agent/inbox/claimed`` with the id names the first turn of the chain (for a
  ``followup``, the turn it opens; for a ``steer``, the running turn it lands in);
- ``agent/settled`` with a turn at or after that one ends the chain (a retry runs as a
  new turn of the same chain: ``agent/settled`` is emitted once, for its last turn);
- ``agent/inbox/discarded`` with the id before any claim (a ``cancel()`` cleared it,
  or a ``remove``) ends the wait with ``status="discarded"``;
- ``agent/disposed`` (a dispose, the runtime's close, or a crash: ``agent.crash`` says
  which) ends a wait that has not settled with ``status="disposed"`` or ``"crashed"``.

The reply's content, usage and retries are read from the agent's log (the turns of the
chain, from the claim on) when the chain settles, on the agent's own thread, before the
waiter wakes. Listeners are registered before the send, so no event can be missed, and
removed once the reply is known.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import msgspec

from actors import AgentDisposed, AgentSettled, InboxClaimed, InboxDiscarded
from storage import (
    AssistantMessageData,
    Completed,
    ContentBlock,
    LlmRetry,
    MessageId,
    TextBlock,
    TurnEndReason,
    Usage,
)

from . import waiting
from .errors import ReplyTimeoutError

if TYPE_CHECKING:
    from storage import Session


class Replier(Protocol):
    """What a reply needs of the agent handle (``runtime.Agent`` is one; this module
    does not import it: the handle imports this one)."""

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> Session: ...

    crash: BaseException | None

    def on(self, name: str, listener: Callable[..., Any]) -> Callable[[], None]: ...

    def notify_idle(self, callback: Callable[[], None]) -> None: ...

__all__ = [
    "PendingReply",
    "Reply",
    "ReplyStatus",
    "ReplyWatch",
    "as_completed",
    "gather",
    "wait_all_idle",
]

ReplyStatus: TypeAlias = Literal["settled", "discarded", "disposed", "crashed"]


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """What one send came to.

    ``status``: ``"settled"`` (the chain ran; ``reason`` is its last turn's
    ``turn/end`` reason), ``"discarded"`` (the message was removed from the inbox
    before any turn claimed it: a ``cancel()``, ``remove`` or ``clear``),
    ``"disposed"`` or ``"crashed"`` (the agent ended before the chain settled).
    ``text`` joins the ``TextBlock``s of the chain's last assistant message
    (``content``); ``turns`` are the chain's turn numbers (the first claimed the
    message, the others are its retries); ``retries`` counts its ``llm/retry`` facts;
    ``usage`` sums the usage of its assistant messages."""

    message_id: MessageId
    agent_id: str
    status: ReplyStatus
    reason: TurnEndReason | None = None
    text: str = ""
    content: tuple[ContentBlock, ...] = ()
    turns: tuple[int, ...] = ()
    retries: int = 0
    usage: Usage = Usage()

    @property
    def ok(self) -> bool:
        """The chain settled ``completed``."""
        return isinstance(self.reason, Completed)


class PendingReply:
    """The reply of one send, still on its way: a future (``result``, ``done``,
    ``add_done_callback``) that is also awaitable from asyncio (``await pending``
    waits without blocking the loop)."""

    def __init__(
        self, agent_id: str, message_id: MessageId, future: concurrent.futures.Future[Reply]
    ) -> None:
        self.agent_id = agent_id
        self.message_id = message_id
        self.future = future
        """The underlying ``concurrent.futures.Future`` (set on the agent's thread)."""

    def __repr__(self) -> str:
        state = "done" if self.future.done() else "pending"
        return f"<PendingReply {self.agent_id}/{self.message_id} {state}>"

    def done(self) -> bool:
        return self.future.done()

    def add_done_callback(self, callback: Callable[[Reply], Any]) -> None:
        """``callback(reply)`` once known (at once if it is), on the thread that set it."""
        self.future.add_done_callback(lambda f: callback(f.result()))

    def result(self, timeout: float | None = None) -> Reply:
        """Block until the reply is known; :class:`ReplyTimeoutError` after ``timeout``
        seconds (the chain goes on; call ``result`` again, or ``cancel()`` the agent).
        On the main thread a Ctrl-C ends the wait (see :mod:`runtime.waiting`)."""
        timeout = waiting.check_timeout(timeout)
        if not self.future.done():
            event = threading.Event()
            self.future.add_done_callback(lambda _f: event.set())
            if not waiting.wait(event, timeout):
                raise ReplyTimeoutError(self.agent_id, self.message_id, timeout)
        return self.future.result()

    def __await__(self) -> Any:
        return asyncio.wrap_future(self.future).__await__()


class ReplyWatch:
    """Follows one message id through one agent's live events (see the module doc)."""

    def __init__(self, agent: Replier) -> None:
        self._agent = agent
        self._lock = threading.Lock()
        self._message_id: MessageId | None = None
        self._first_turn: int | None = None
        self._claim_seq = 0
        self._early: list[tuple[str, Any]] = []  # events before the id was known
        self.future: concurrent.futures.Future[Reply] = concurrent.futures.Future()
        self._disposers = [
            agent.on("agent/inbox/claimed", self._claimed),
            agent.on("agent/inbox/discarded", self._discarded),
            agent.on("agent/settled", self._settled),
            agent.on("agent/disposed", self._disposed),
        ]

    def start(self, message_id: MessageId) -> PendingReply:
        """The id the send returned: replay what arrived before it was known."""
        with self._lock:
            self._message_id = message_id
            early, self._early = self._early, []
        for name, event in early:
            self._handle(name, event)
        return PendingReply(self._agent.id, message_id, self.future)

    def abandon(self) -> None:
        """The send raised: stop listening."""
        self._stop()

    # (listeners: on the agent's thread, or the disposer's)

    def _claimed(self, event: InboxClaimed) -> None:
        self._handle("claimed", event)

    def _discarded(self, event: InboxDiscarded) -> None:
        self._handle("discarded", event)

    def _settled(self, event: AgentSettled) -> None:
        self._handle("settled", event)

    def _disposed(self, event: AgentDisposed) -> None:
        self._handle("disposed", event)

    def _handle(self, name: str, event: Any) -> None:
        with self._lock:
            if self.future.done():
                return
            if self._message_id is None:
                self._early.append((name, event))
                return
            message_id = self._message_id
        if name == "claimed":
            if event.message.id == message_id and self._first_turn is None:
                self._first_turn = event.turn
                self._claim_seq = self._agent.session.last_seq
        elif name == "discarded":
            if event.message.id == message_id and self._first_turn is None:
                self._finish(
                    Reply(message_id=message_id, agent_id=self._agent.id, status="discarded")
                )
        elif name == "settled":
            first = self._first_turn
            if first is not None and event.turn >= first:
                self._finish(self._read(message_id, first, event.turn, event.reason))
        else:
            status: ReplyStatus = "crashed" if self._agent.crash is not None else "disposed"
            self._finish(Reply(message_id=message_id, agent_id=self._agent.id, status=status))

    def _read(self, message_id: MessageId, first: int, last: int, reason: TurnEndReason) -> Reply:
        """The chain's reply, from its facts in the log (from the claim on)."""
        text_of: tuple[ContentBlock, ...] = ()
        retries = 0
        totals = [0, 0, 0, 0, 0]
        for fact in self._agent.session.events(lower=self._claim_seq):
            data = fact.data
            turn = getattr(data, "turn", None)
            if not isinstance(turn, int) or not first <= turn <= last:
                continue
            if isinstance(data, AssistantMessageData):
                text_of = data.message.content
                if data.usage is not None:
                    u = data.usage
                    for i, v in enumerate(
                        (
                            u.input_tokens,
                            u.output_tokens,
                            u.cache_read_tokens,
                            u.cache_write_tokens,
                            u.reasoning_tokens,
                        )
                    ):
                        totals[i] += v
            elif isinstance(data, LlmRetry):
                retries += 1
        return Reply(
            message_id=message_id,
            agent_id=self._agent.id,
            status="settled",
            reason=reason,
            text="".join(b.text for b in text_of if isinstance(b, TextBlock)),
            content=text_of,
            turns=tuple(range(first, last + 1)),
            retries=retries,
            usage=Usage(*totals),
        )

    def _finish(self, reply: Reply) -> None:
        with self._lock:
            if self.future.done():
                return
            self.future.set_result(reply)
        self._stop()

    def _stop(self) -> None:
        disposers, self._disposers = self._disposers, []
        for dispose in disposers:
            dispose()


# ---------------------------------------------------------------------- fan-in


def as_completed(pending: Iterable[PendingReply], timeout: float | None = None) -> Iterator[Reply]:
    """Yield the replies of many sends as they complete (any agents); raises
    :class:`ReplyTimeoutError` (naming the first that did not complete) if they are not
    all in within ``timeout`` seconds of the call."""
    timeout = waiting.check_timeout(timeout)
    by_future = {p.future: p for p in pending}
    try:
        for future in concurrent.futures.as_completed(by_future, timeout=timeout):
            yield future.result()
    except TimeoutError as err:
        late = next(p for f, p in by_future.items() if not f.done())
        raise ReplyTimeoutError(late.agent_id, late.message_id, timeout) from err


def gather(pending: Sequence[PendingReply], timeout: float | None = None) -> list[Reply]:
    """The replies of many sends, in the order given, once all are in (see
    :func:`as_completed` for the timeout)."""
    pending = list(pending)
    for _ in as_completed(pending, timeout):
        pass
    return [p.future.result() for p in pending]


def wait_all_idle(agents: Iterable[Replier], timeout: float | None = None) -> bool:
    """Block until every one of ``agents`` handled every send before the call and is
    idle (or disposed); False on timeout. One wait for all, not one per agent."""
    timeout = waiting.check_timeout(timeout)
    agents = list(agents)
    done = threading.Event()
    left = [len(agents)]
    lock = threading.Lock()

    def one_idle() -> None:
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    if not agents:
        return True
    for agent in agents:
        agent.notify_idle(one_idle)
    return waiting.wait(done, timeout)
