"""``agent_tool``: a tool that delegates its task to a child agent and returns its reply.

``agent_tool(rt, name="research", model=..., tools=[...])`` is a tool the model calls
with ``{"task": "..."}``. Each call spawns a child agent (or, with ``keep=True``, reuses
the one child kept for that parent), asks it the task and returns, as the call's
result, a JSON object: ``{"reply": <the child's final text>, "session": <the child's
session id>, "reason": <how its chain ended>}``. The child's session id is thus in the
parent's ``tool/result`` (and its ``tool/call`` holds the task): the tree of sessions
is readable from the logs (``corral log show <parent>``, then the child's id).

Cancelling the parent's turn cancels the child's (``ParentCause()``, logged in the
child's ``turn/end``), and so on down the tree; the call's result then says
``"reason": "aborted"``. The tree's depth is bounded when the tools are built: an
agent tool whose child tools hold agent tools nested deeper than ``max_depth`` is
refused (a tree is built bottom-up, so it cannot hold a cycle).

How: the call runs in an async ``tools/execute`` listener that ``agent_tool`` adds to
the runtime (it handles the calls named ``name``, so give each agent tool of a
runtime its own name); a ``tools/pre-execute`` listener keeps each call's turn signal
for it. A child is spawned per call and disposed after it (``keep=False``), or kept
per parent and disposed with it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from actors import (
    Model,
    PreExecute,
    Tool,
    ToolArgumentError,
    ToolExecute,
    TurnSignal,
    UsageLimits,
)
from storage import ParentCause, ToolSpec

from . import aio
from .tool import check_tool_name

if TYPE_CHECKING:
    from .agent import Agent
    from .runtime import Runtime

__all__ = ["DEFAULT_MAX_DEPTH", "AgentTool", "agent_tool"]

DEFAULT_MAX_DEPTH: Final = 3
"""How many agent tools deep a delegation tree may go by default."""

_ARGUMENTS: Final = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "what the child agent is to do"}},
    "required": ["task"],
    "additionalProperties": False,
}


class _Arguments(msgspec.Struct, forbid_unknown_fields=True):
    task: str


class AgentTool:
    """A tool whose calls a child agent answers (see the module doc)."""

    def __init__(
        self,
        rt: Runtime,
        *,
        name: str,
        description: str,
        model: Model | str,
        tools: Sequence[Tool | Callable[..., Any]] = (),
        system: str | None = None,
        limits: UsageLimits | None = None,
        keep: bool = False,
        max_depth: int = DEFAULT_MAX_DEPTH,
        timeout: float | None = None,
    ) -> None:
        self._rt = rt
        self._spec = ToolSpec(
            name=check_tool_name(name), description=description, parameters=_ARGUMENTS
        )
        self._child = {"model": model, "tools": tuple(tools), "system": system, "limits": limits}
        self._keep = keep
        self._timeout = timeout
        self.depth: int = 1 + max((t.depth for t in tools if isinstance(t, AgentTool)), default=0)
        """How deep the tree under this tool goes (1: its children hold no agent tool)."""
        if self.depth > max_depth:
            raise ValueError(
                f"agent tool {name!r}: its children's agent tools nest {self.depth} levels "
                f"deep, over max_depth={max_depth}; flatten the tree or raise max_depth"
            )
        self._lock = threading.Lock()
        self._signals: dict[tuple[str, str], TurnSignal] = {}
        self._kept: dict[str, Agent] = {}
        self._stop = [
            rt.on("tools/pre-execute", self._pre_execute),
            rt.on("tools/execute", self._execute),
            rt.on("agent/disposed", self._parent_disposed),
        ]

    def __repr__(self) -> str:
        return f"AgentTool({self._spec.name!r}, depth={self.depth})"

    # the Tool protocol

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    @property
    def concurrency_safe(self) -> bool:
        return not self._keep  # a kept child answers one call at a time

    @property
    def timeout_s(self) -> float | None:
        return self._timeout

    @property
    def is_async(self) -> bool:
        return True

    def prepare(self, arguments: Any) -> Any:
        try:
            return msgspec.convert(arguments, type=_Arguments)
        except msgspec.ValidationError as err:
            raise ToolArgumentError(f"tool {self._spec.name!r}: {err}") from err

    def run(self, prepared: Any) -> Awaitable[Any]:
        """Reached only if a ``tools/execute`` listener outside this tool's own one
        replaced the call and then called ``next()`` past it: refused."""

        async def refused() -> Any:
            raise RuntimeError(
                f"agent tool {self._spec.name!r} runs through its tools/execute listener, "
                "which did not see this call"
            )

        return refused()

    def close(self) -> None:
        """Remove this tool's listeners (its kept children are disposed with their parents)."""
        for stop in self._stop:
            stop()

    # listeners

    def _pre_execute(self, event: PreExecute, next: Callable[[], Any]) -> Any:
        if event.name == self._spec.name:
            with self._lock:
                self._signals[(event.agent.id, event.call_id)] = event.signal
        return next()

    async def _execute(self, event: ToolExecute, next: Callable[[], Awaitable[Any]]) -> Any:
        if event.name != self._spec.name:
            return await next()
        with self._lock:
            signal = self._signals.pop((event.agent.id, event.call_id), None)
        task = msgspec.convert(msgspec.to_builtins(event.arguments), type=_Arguments).task
        child = await self._child_for(event.agent.id)
        pending = child.submit(task)
        if signal is not None:
            signal.on_abort(lambda _cause: _cancel(child))
        try:
            reply = await pending
        except asyncio.CancelledError:
            _cancel(child)
            raise
        finally:
            if not self._keep:
                await aio.dispose(child)
        reason = reply.reason.kind if reply.reason is not None else reply.status
        return {"reply": reply.text, "session": child.id, "reason": reason}

    async def _child_for(self, parent_id: str) -> Agent:
        if self._keep:
            with self._lock:
                kept = self._kept.get(parent_id)
            if kept is not None and not kept.disposed:
                return kept
        child = await aio.spawn(self._rt, **self._child)
        if self._keep:
            with self._lock:
                self._kept[parent_id] = child
        return child

    def _parent_disposed(self, event: Any) -> None:
        with self._lock:
            kept = self._kept.pop(event.agent.id, None)
        if kept is not None:
            kept.dispose(timeout=0)  # (starts it; the parent's disposal does not wait)


def _cancel(child: Agent) -> None:
    if not child.disposed:
        try:
            child.cancel(ParentCause())
        except Exception:  # noqa: BLE001 - a child disposed meanwhile has nothing to cancel
            return


def agent_tool(
    rt: Runtime,
    *,
    name: str,
    model: Model | str,
    description: str = "Delegate a task to a helper agent; returns its answer.",
    tools: Sequence[Tool | Callable[..., Any]] = (),
    system: str | None = None,
    limits: UsageLimits | None = None,
    keep: bool = False,
    max_depth: int = DEFAULT_MAX_DEPTH,
    timeout: float | None = None,
) -> AgentTool:
    """A tool (give it to ``rt.spawn(tools=[...])``) whose calls a child agent of
    ``model`` (with ``tools``, ``system``, ``limits``) answers; see :mod:`runtime.delegation`."""
    return AgentTool(
        rt,
        name=name,
        description=description,
        model=model,
        tools=tools,
        system=system,
        limits=limits,
        keep=keep,
        max_depth=max_depth,
        timeout=timeout,
    )
