"""The ACP agent: each ACP session is one corral agent (same id), driven by its prompts.

- ``session/new`` spawns an agent; ``session/load`` resumes one from its log (an open
  turn repaired as after any crash) and replays its history as ``session/update``
  notifications before it answers.
- ``session/prompt`` is a ``followup``. The prompt's message is correlated with its turn
  by ``agent/inbox/claimed`` (message id -> turn); that turn's facts stream as updates
  off ``session/event``; the prompt is answered at ``agent/settled`` of its turn's retry
  chain, with the stop reason of the terminal ``turn/end``. A prompt sent while a turn
  runs is queued (the inbox's next-turn lane) and answered when its own turn settles.
- ``session/cancel`` is ``agent.cancel()``: queued prompts are discarded (answered
  ``cancelled``) and the running turn is aborted (its prompt answered ``cancelled`` once
  the turn ended, after every update it streamed).

Everything a listener learns is handed to the ACP connection's loop in the order it
happened and sent from there by one pump per session, so updates keep the log's order
and a prompt's answer follows every update of its turn.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from acp import PROTOCOL_VERSION, RequestError
from acp.schema import (
    AgentCapabilities,
    ClientCapabilities,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
)

from actors import Model, Tool
from storage import CorralError, Event, TurnEndReason, UnknownSessionError, UserMessage

from .permission import PermissionGate
from .updates import (
    PromptBlock,
    PromptContentError,
    live_updates,
    prompt_content,
    replay_updates,
    stop_reason,
)

if TYPE_CHECKING:
    from acp.interfaces import Client

    from runtime.agent import Agent
    from runtime.hooks import HookBridge
    from runtime.runtime import Runtime

__all__ = ["CorralAcpAgent"]

log = logging.getLogger("corral.acp")


@dataclass
class _Session:
    """One ACP session's state, on the connection's loop."""

    id: str
    queue: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    agent: Agent | None = None
    pending: dict[str, asyncio.Future[PromptResponse]] = field(default_factory=dict)
    """Prompts sent, not claimed yet, by message id."""
    claimed: list[tuple[int, asyncio.Future[PromptResponse]]] = field(default_factory=list)
    """Prompts whose turn runs, with its number, in claim order."""
    replayed_through: int = -1
    pump: asyncio.Task[None] | None = None


def _version() -> str:
    try:
        return version("corral")
    except PackageNotFoundError:
        return "0"


class CorralAcpAgent:
    """The ``acp.Agent`` of ``corral acp`` over one runtime."""

    def __init__(
        self,
        rt: Runtime,
        *,
        model: Callable[[], Model],
        tools: Sequence[Tool] = (),
        system: str | None = None,
        asked: Sequence[str] = (),
        hooks: HookBridge | None = None,
    ) -> None:
        self._rt = rt
        self._model = model
        self._tools = list(tools)
        self._system = system
        self._asked = tuple(asked)
        self._hooks = hooks
        self._sessions: dict[str, _Session] = {}
        self._conn: Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._disposers: list[Callable[[], None]] = []
        self._gate: PermissionGate | None = None

    # ------------------------------------------------------------------ wiring

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen to the runtime; ``loop`` is the connection's (the running one)."""
        self._loop = loop
        assert self._conn is not None, "on_connect first"
        self._gate = PermissionGate(self._conn.request_permission, loop, asked=self._asked)
        self._disposers.append(self._gate.install(self._rt))
        if self._hooks is not None:
            self._hooks.asker = self._gate.ask
        on = self._rt.on
        self._disposers += [
            on("session/event", lambda e: self._hand("event", e.agent.id, e.event)),
            on("agent/inbox/claimed", self._on_claimed),
            on("agent/inbox/discarded", self._on_discarded),
            on("agent/settled", lambda e: self._hand("settled", e.agent.id, e.turn, e.reason)),
            on("agent/disposed", lambda e: self._hand("disposed", e.agent.id, e.agent.crash)),
        ]

    def detach(self) -> None:
        disposers, self._disposers = self._disposers, []
        for dispose in disposers:
            dispose()
        for session in self._sessions.values():
            if session.pump is not None:
                session.pump.cancel()

    def _on_claimed(self, event: Any) -> None:
        self._hand("claimed", event.agent.id, event.message.id, event.turn)

    def _on_discarded(self, event: Any) -> None:
        self._hand("discarded", event.agent.id, event.message.id)

    def _hand(self, kind: str, agent_id: str, *item: Any) -> None:
        """From any runtime thread: queue ``item`` for the session's pump, in order."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, agent_id, (kind, *item))

    def _deliver(self, agent_id: str, item: tuple[Any, ...]) -> None:
        session = self._sessions.get(agent_id)
        if session is not None:
            session.queue.put_nowait(item)

    # ------------------------------------------------------------------ the pump

    async def _pump(self, session: _Session) -> None:
        conn = self._conn
        assert conn is not None
        while True:
            kind, *item = await session.queue.get()
            try:
                if kind == "event":
                    event: Event = item[0]
                    if event.seq <= session.replayed_through:
                        continue
                    for update in live_updates(event):
                        await conn.session_update(session.id, update)
                elif kind == "claimed":
                    future = session.pending.pop(item[0], None)
                    if future is not None:
                        session.claimed.append((item[1], future))
                elif kind == "discarded":
                    future = session.pending.pop(item[0], None)
                    if future is not None and not future.done():
                        future.set_result(PromptResponse(stop_reason="cancelled"))
                elif kind == "settled":
                    self._settle(session, item[0], item[1])
                elif kind == "disposed":
                    self._end(session, item[0])
                    return
            except Exception:  # a client that went away: the pump goes on for the others
                log.exception("session %s: cannot send an update", session.id)

    def _end(self, session: _Session, crash: BaseException | None) -> None:
        """The agent is gone (disposed, or crashed): every open prompt is answered (a
        crash as an error saying to load the session again) and the session closed."""
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
        open_prompts = [*session.pending.values(), *(f for _, f in session.claimed)]
        session.pending.clear()
        session.claimed.clear()
        for future in open_prompts:
            if future.done():
                continue
            if crash is None:
                future.set_result(PromptResponse(stop_reason="cancelled"))
            else:
                future.set_exception(
                    RequestError.internal_error(
                        {
                            "details": f"the agent crashed ({crash!r}); session/load it to "
                            "go on from its log"
                        }
                    )
                )

    def _settle(self, session: _Session, turn: int, reason: TurnEndReason) -> None:
        answered = [(t, f) for t, f in session.claimed if t <= turn]
        session.claimed = [(t, f) for t, f in session.claimed if t > turn]
        stop = stop_reason(reason)
        for _, future in answered:
            if future.done():
                continue
            if stop is not None:
                future.set_result(PromptResponse(stop_reason=stop))
            else:
                failure = getattr(reason, "error", None)
                message = getattr(failure, "message", "the turn failed")
                code = getattr(failure, "code", "UNKNOWN")
                future.set_exception(
                    RequestError.internal_error({"details": message, "code": code, "turn": turn})
                )

    # ------------------------------------------------------------------ ACP methods

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(
                    image=True, audio=False, embedded_context=True
                ),
            ),
            agent_info=Implementation(name="corral", title="corral", version=_version()),
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> None:
        return None

    def _register(self, session_id: str, cwd: str) -> _Session:
        if self._hooks is not None:
            self._hooks.set_cwd(session_id, cwd)
        session = _Session(id=session_id)
        self._sessions[session_id] = session  # before the agent: no fact of it is missed
        return session

    def _start(self, session: _Session, agent: Agent) -> None:
        session.agent = agent
        session.pump = asyncio.get_running_loop().create_task(self._pump(session))

    async def new_session(
        self, cwd: str, mcp_servers: list[Any] | None = None, **kwargs: Any
    ) -> NewSessionResponse:
        session_id = f"acp-{uuid.uuid4().hex}"
        session = self._register(session_id, cwd)
        try:
            agent = await asyncio.to_thread(
                self._rt.spawn,
                model=self._model(),
                tools=self._tools,
                session_id=session_id,
                system=self._system,
            )
        except CorralError as err:
            del self._sessions[session_id]
            raise RequestError.internal_error({"details": str(err)}) from err
        self._start(session, agent)
        return NewSessionResponse(session_id=session_id)

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None, **kwargs: Any
    ) -> LoadSessionResponse:
        if session_id in self._sessions:
            raise RequestError.invalid_request({"details": f"session {session_id} is already open"})
        session = self._register(session_id, cwd)
        try:
            agent = await asyncio.to_thread(
                self._rt.resume,
                session_id,
                model=self._model(),
                tools=self._tools,
                system=self._system,
            )
            events = await asyncio.to_thread(agent.session.events)
        except UnknownSessionError as err:
            del self._sessions[session_id]
            raise RequestError.resource_not_found(session_id) from err
        except CorralError as err:
            del self._sessions[session_id]
            raise RequestError.internal_error({"details": str(err)}) from err
        session.replayed_through = events[-1].seq if events else -1
        assert self._conn is not None
        assert self._gate is not None
        self._gate.restore(session_id, events)
        for event in events:
            for update in replay_updates(event):
                await self._conn.session_update(session_id, update)
        self._start(session, agent)
        return LoadSessionResponse()

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None or session.agent is None:
            raise RequestError.invalid_params({"details": f"no open session {session_id!r}"})
        return session

    async def prompt(
        self, prompt: list[PromptBlock], session_id: str, **kwargs: Any
    ) -> PromptResponse:
        session = self._session(session_id)
        assert session.agent is not None
        try:
            content = prompt_content(prompt)
        except PromptContentError as err:
            raise RequestError.invalid_params({"details": str(err)}) from err
        message_id = f"acp-{uuid.uuid4().hex}"
        future: asyncio.Future[PromptResponse] = asyncio.get_running_loop().create_future()
        session.pending[message_id] = future
        try:
            session.agent.followup(UserMessage(id=message_id, content=tuple(content)))
        except CorralError as err:
            session.pending.pop(message_id, None)
            raise RequestError.invalid_request({"details": str(err)}) from err
        return await future

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self._sessions.get(session_id)
        if session is not None and session.agent is not None:
            session.agent.cancel()

