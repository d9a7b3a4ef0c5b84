"""Live marks of a load run: the moments of a turn that no fact of the log holds.

The session log times what was appended (:mod:`runtime.load.breakdown`); it cannot
say when a durable wait ended or how long a listener ran. A live run adds *marks*,
each ``(seq, epoch ms, kind)``: it happened after the fact ``seq`` of the agent's
session, at that time:

- ``request`` / ``requested``: the ``agent/request`` listeners started and returned
  (an outermost listener of the run's own);
- ``model``: the model was called (the run's model, wrapped), so the wait between the
  listeners' end and this is the write-ahead flush before the request;
- ``hook`` / ``hooked``: a ``tools/pre-execute`` or ``tools/post-execute`` chain started
  and returned; the first ``hook`` after a step's ``tool/call`` facts ends the flush
  before the tools;
- ``checkpoint``: the ``session/flush`` checkpoint of a settled chain (its last fact is
  durable), when the stack listens to it (else the wait ends at ``agent/settled``);
  ``settled``: ``agent/settled`` (the first listener, so the stack's own come after).

Listeners are outermost only when registered before the stack's own: :meth:`install`
runs before the factory, :meth:`trim` after it drops the listener probes that have
nothing to time (an event the stack does not listen to), so that a bare stack pays
for the marks it needs only (model and settled; the tool gate under write-ahead).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from actors import AgentLike, AgentSettled, Model, ModelRequest, SessionFlush
from storage import StreamChunk, UserMessage

if TYPE_CHECKING:
    from ..agent import Agent
    from ..runtime import Runtime

__all__ = ["KINDS", "Mark", "Probes"]

Mark = tuple[int, int, str]  # (after this seq of the session, epoch ms, kind)
KINDS: Final = ("request", "requested", "model", "hook", "hooked", "checkpoint", "settled")
_HOOKED: Final = ("tools/pre-execute", "tools/post-execute")


_time_ns: Final = time.time_ns  # epoch ns // 1e6: as the log's facts are stamped


class Probes:
    """The marks of one run's agents (``marks[agent_id]``, in the order taken)."""

    def __init__(self, rt: Runtime, *, durability: str) -> None:
        self.rt = rt
        self.durability = durability
        self.marks: dict[str, list[Mark]] = {}
        self.tool_gate = durability == "write-ahead"
        """Whether a step's first tool hook marks the end of its write-ahead flush."""
        self.model_marks = True
        """Whether :meth:`wrap` marks the model calls."""
        self._agents: dict[str, Agent] = {}  # first message id -> its agent
        self._disposers: dict[str, Callable[[], None]] = {}

    # ------------------------------------------------------------------ registration

    def install(self) -> None:
        """Register the listener probes, outermost when the stack's listeners come
        after. ``agent/request`` and ``tools/*`` already listened to get none: their
        chains cannot be timed apart (their time stays where the log puts it: the
        request's in the time to first chunk, with no model mark then; the tool hooks'
        in the tools). ``session/flush`` and ``agent/settled`` listeners registered
        before count in the wait they follow."""
        on, bus = self.rt.on, self.rt.bus
        if bus.listener_count("agent/request"):
            self.model_marks = False
        else:
            self._disposers["agent/request"] = on("agent/request", self._on_request)
        for name in _HOOKED:
            if bus.listener_count(name):
                self.tool_gate = self.tool_gate and name != "tools/pre-execute"
            else:
                self._disposers[name] = on(name, self._on_tool_hook)
        if self.durability != "none":
            self._disposers["session/flush"] = on("session/flush", self._on_checkpoint)
        self._disposers["agent/settled"] = on("agent/settled", self._on_settled)

    def trim(self) -> None:
        """Drop the probes of the events only they listen to (after the factory ran),
        but the tool gate under write-ahead. (A checkpoint nobody else listens to is
        not run at all: the wait for the turn's end to be durable then ends at
        ``agent/settled``, and a listener of our own would cost the checkpoint.)"""
        bus = self.rt.bus
        for name in ("agent/request", *_HOOKED, "session/flush"):
            keep = name == "tools/pre-execute" and self.tool_gate
            if name in self._disposers and not keep and bus.listener_count(name) <= 1:
                self._disposers.pop(name)()

    def close(self) -> None:
        disposers, self._disposers = self._disposers, {}
        for dispose in disposers.values():
            dispose()

    # ------------------------------------------------------------------ marks

    def _mark(self, agent: Agent | AgentLike, kind: str) -> None:
        marks = self.marks.get(agent.id)
        if marks is None:
            return  # an agent this run does not drive
        marks.append((cast("Agent", agent).session.last_seq, _time_ns() // 1_000_000, kind))

    def first_id(self, agent: Agent) -> str | None:
        """The id to send ``agent``'s first message with (None after the first): the
        first message of its history names the agent's requests to the model."""
        if agent.id in self.marks:
            return None
        self.marks[agent.id] = []
        message_id = f"load-{agent.id}"
        self._agents[message_id] = agent
        return message_id

    def _on_settled(self, event: AgentSettled) -> None:
        agent = event.agent
        marks = self.marks.get(agent.id)
        if marks is None:
            return  # an agent this run does not drive
        if marks and marks[-1][2] == "checkpoint":  # nothing was appended since
            marks.append((marks[-1][0], _time_ns() // 1_000_000, "settled"))
        else:
            marks.append(
                (cast("Agent", agent).session.last_seq, _time_ns() // 1_000_000, "settled")
            )

    def _on_request(self, event: Any, next_: Callable[[], Any]) -> Any:
        self._mark(event.agent, "request")
        try:
            return next_()
        finally:
            self._mark(event.agent, "requested")

    def _on_tool_hook(self, event: Any, next_: Callable[[], Any]) -> Any:
        self._mark(event.agent, "hook")
        try:
            return next_()
        finally:
            self._mark(event.agent, "hooked")

    def _on_checkpoint(self, event: SessionFlush) -> None:
        marks = self.marks.get(event.agent.id)
        if marks is not None:
            marks.append((event.last_seq, _time_ns() // 1_000_000, "checkpoint"))

    def called(self, request: ModelRequest) -> None:
        """The run's model was called with ``request`` (see :meth:`wrap`)."""
        messages = request.messages
        first = messages[0] if messages else None
        if type(first) is UserMessage:
            agent = self._agents.get(first.id)
            if agent is not None:
                self._mark(agent, "model")

    def wrap(self, model: Model) -> Model:
        """``model``, marking each call (``answer_now`` kept for a model that has it)."""
        if not self.model_marks:
            return model
        if callable(getattr(model, "answer_now", None)):
            return _MarkedImmediate(model, self.called)
        return _Marked(model, self.called)


class _Marked:
    """A model that marks each request, then is ``inner`` (whose other attributes it
    passes on)."""

    def __init__(self, inner: Model, called: Callable[[ModelRequest], None]) -> None:
        self.inner = inner
        self._called = called
        self.chunks_checked = getattr(inner, "chunks_checked", False) is True
        self.provider = inner.provider  # read for every request's default config
        self.name = inner.name

    def __repr__(self) -> str:
        return repr(self.inner)

    def __getattr__(self, name: str) -> Any:
        """What else the model has (``aclose``, which the runtime's close calls;
        ``stream_batches`` and ``stream_into``, marked as :meth:`stream` is)."""
        if name == "inner":  # not set yet (a copy being made)
            raise AttributeError(name)
        value = getattr(self.inner, name)
        if name in ("stream_batches", "stream_into"):  # a provider's streams
            called = self._called

            def marked(request: ModelRequest, *rest: Any) -> Any:
                called(request)
                return value(request, *rest)

            return marked
        return value

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self._called(request)
        return self.inner.stream(request)


class _MarkedImmediate(_Marked):
    def answer_now(self, request: ModelRequest) -> Sequence[StreamChunk] | None:
        self._called(request)  # (a None answer: stream() is called, and marks again)
        answer: Sequence[StreamChunk] | None = self.inner.answer_now(request)  # type: ignore[attr-defined]
        return answer
