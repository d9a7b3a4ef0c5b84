"""Tool permission through the client: ``session/request_permission`` at the tool gate.

A tool that needs approval (wrapped with :func:`needs_permission`, or named with
``corral acp --ask NAME``) is gated by a ``tools/pre-execute`` listener: once every
inner listener allowed the call, the client is asked, with the four ACP options (allow
once / always, reject once / always). The answer is a durable ``acp/permission`` fact
in the agent's session, flushed before the call runs or is refused; an *always* answer
holds for that tool in that session from then on, across a ``session/load`` too (it is
read back from those facts). A cancelled turn's pending request answers ``cancelled``
(the client's, as ACP requires, or the gate's own once the turn is aborted): the call
is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec
from acp.schema import (
    AllowedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallUpdate,
)

from actors import Allow, Deny, PreExecute, Tool
from storage import Event, ToolSpec

if TYPE_CHECKING:
    from runtime.agent import Agent
    from runtime.runtime import Runtime

__all__ = ["PERMISSION", "PermissionDecision", "PermissionGate", "needs_permission"]

PERMISSION: Final = "acp/permission"
OPTIONS: Final = (
    PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="allow_always", name="Always allow", kind="allow_always"),
    PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"),
    PermissionOption(option_id="reject_always", name="Always reject", kind="reject_always"),
)
_KINDS: Final = {option.option_id: option.kind for option in OPTIONS}

Ask = Callable[
    [str, ToolCallUpdate, list[PermissionOption]], Coroutine[Any, Any, RequestPermissionResponse]
]
"""Sends ``session/request_permission`` (the connection's ``request_permission``)."""


class PermissionDecision(
    msgspec.Struct, rename="camel", omit_defaults=True, frozen=True, kw_only=True
):
    """``acp/permission``: the answer to one tool call's permission request."""

    call_id: str
    tool: str
    outcome: Literal["allow", "reject"]
    always: bool = False
    option: str | None = None
    """The option the user picked (None: the request was cancelled, or ``remembered``)."""
    remembered: bool = False
    """Decided by an earlier *always* answer, without asking."""
    reason: str | None = None
    turn: int | None = None


class _Gated:
    """A tool that needs the user's approval; otherwise the tool itself."""

    needs_permission = True

    def __init__(self, tool: Tool) -> None:
        self._tool = tool

    @property
    def spec(self) -> ToolSpec:
        return self._tool.spec

    @property
    def concurrency_safe(self) -> bool:
        return self._tool.concurrency_safe

    @property
    def timeout_s(self) -> float | None:
        return self._tool.timeout_s

    @property
    def is_async(self) -> bool:
        return self._tool.is_async

    def prepare(self, arguments: Any) -> Any:
        return self._tool.prepare(arguments)

    def run(self, prepared: Any) -> Any:
        return self._tool.run(prepared)

    def __repr__(self) -> str:
        return f"needs_permission({self._tool!r})"


def needs_permission(tool: Tool) -> Tool:
    """``tool``, marked as needing the user's approval before each call (under
    ``corral acp``: the client is asked; elsewhere the mark is only read by the gate)."""
    if not isinstance(tool, Tool):
        raise TypeError(f"needs_permission takes a Tool (see runtime.tool), got {tool!r}")
    return _Gated(tool)


def gated(tool: object, asked: frozenset[str]) -> bool:
    """Whether calls of ``tool`` need approval."""
    return getattr(tool, "needs_permission", False) is True or (
        isinstance(tool, Tool) and tool.spec.name in asked
    )


class PermissionGate:
    """The ``tools/pre-execute`` listener asking the client, and the remembered answers.

    ``ask`` runs on ``loop`` (the ACP connection's); the listener on the runtime's I/O
    loop waits for it there."""

    def __init__(
        self, ask: Ask, loop: asyncio.AbstractEventLoop, *, asked: Iterable[str] = ()
    ) -> None:
        self._ask = ask
        self._loop = loop
        self._asked = frozenset(asked)
        self._always: dict[tuple[str, str], bool] = {}

    def install(self, rt: Runtime) -> Callable[[], None]:
        rt.store.register_event_type(PERMISSION, PermissionDecision, ignorable=True)
        return rt.on("tools/pre-execute", self.pre_execute)

    def restore(self, agent_id: str, events: Iterable[Event]) -> None:
        """Take the *always* answers back from a loaded session's log."""
        for event in events:
            data = event.data
            if isinstance(data, PermissionDecision) and data.always and not data.remembered:
                self._always[(agent_id, data.tool)] = data.outcome == "allow"

    def forget(self, agent_id: str) -> None:
        for key in [k for k in self._always if k[0] == agent_id]:
            del self._always[key]

    async def pre_execute(self, event: PreExecute, next_: Callable[[], Awaitable[Any]]) -> Any:
        decision = await next_()
        agent: Agent = event.agent  # type: ignore[assignment]
        if not isinstance(decision, Allow) or not gated(agent.tools.get(event.name), self._asked):
            return decision
        if await self.ask(event, None):
            return Allow()
        return Deny(reason=f"the user did not allow this call of {event.name}")

    async def ask(self, event: PreExecute, reason: str | None) -> bool:
        """Ask the client whether the call of ``event`` may run; log the answer durably.
        Also the hooks' asker (a ``PreToolUse`` hook that answered ``ask``)."""
        agent: Agent = event.agent  # type: ignore[assignment]
        key = (agent.id, event.name)
        remembered = self._always.get(key)
        if remembered is not None:
            outcome: Literal["allow", "reject"] = "allow" if remembered else "reject"
            fact = PermissionDecision(
                call_id=event.call_id, tool=event.name, outcome=outcome, always=True,
                remembered=True, turn=event.turn,
            )
        else:
            fact = await self._request(event, reason)
            if fact.always:
                self._always[key] = fact.outcome == "allow"
        agent.session.append_fact(fact)
        await agent.session.aflush()  # the decision is durable before the call runs
        return fact.outcome == "allow"

    async def _request(self, event: PreExecute, reason: str | None) -> PermissionDecision:
        agent: Agent = event.agent  # type: ignore[assignment]
        update = ToolCallUpdate(
            tool_call_id=event.call_id,
            title=event.name if reason is None else f"{event.name}: {reason}",
            kind="other",
            status="pending",
            raw_input=msgspec.to_builtins(event.arguments),
        )
        request: concurrent.futures.Future[RequestPermissionResponse]
        request = asyncio.run_coroutine_threadsafe(
            self._ask(agent.id, update, list(OPTIONS)), self._loop
        )
        event.signal.on_abort(lambda _cause: request.cancel())
        try:
            response = await asyncio.wrap_future(request)
        except (concurrent.futures.CancelledError, asyncio.CancelledError):
            if not event.signal.aborted:
                raise
            response = None
        if response is None:
            return _rejected(event, "the turn was cancelled while the user was asked")
        outcome = response.outcome
        if not isinstance(outcome, AllowedOutcome):
            return _rejected(event, "the client cancelled the permission request")
        if outcome.option_id not in _KINDS:
            return _rejected(event, f"the client answered an unknown option {outcome.option_id!r}")
        kind = _KINDS[outcome.option_id]
        return PermissionDecision(
            call_id=event.call_id,
            tool=event.name,
            outcome="allow" if kind.startswith("allow") else "reject",
            always=kind.endswith("always"),
            option=outcome.option_id,
            reason=reason,
            turn=event.turn,
        )


def _rejected(event: PreExecute, reason: str) -> PermissionDecision:
    return PermissionDecision(
        call_id=event.call_id, tool=event.name, outcome="reject", reason=reason, turn=event.turn
    )
