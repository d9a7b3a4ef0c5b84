"""``corral acp``: an Agent Client Protocol server over stdio (JSON-RPC 2.0, the
``agent-client-protocol`` SDK), each ACP session one corral agent. See docs/acp.md.

:func:`serve` runs it over any runtime (``corral acp`` opens one from its options);
:func:`needs_permission` marks a tool whose calls the client must approve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import acp
from acp.agent.connection import AgentSideConnection
from acp.stdio import stdio_streams

from actors import Model, Tool

from .config import AcpConfigError, load_object, load_tools, model_factory
from .permission import PERMISSION, PermissionDecision, PermissionGate, needs_permission
from .server import CorralAcpAgent

if TYPE_CHECKING:
    from runtime.hooks import HookBridge
    from runtime.runtime import Runtime

__all__ = [
    "PERMISSION",
    "AcpConfigError",
    "CorralAcpAgent",
    "PermissionDecision",
    "PermissionGate",
    "load_object",
    "load_tools",
    "model_factory",
    "needs_permission",
    "serve",
]

_STDIO_LIMIT = 50 * 1024 * 1024  # the SDK's own default for stdio (multimodal prompts)


async def serve(
    rt: Runtime,
    *,
    model: Callable[[], Model],
    tools: Sequence[Tool] = (),
    system: str | None = None,
    asked: Sequence[str] = (),
    hooks: HookBridge | None = None,
    streams: tuple[Any, Any] | None = None,
) -> None:
    """Serve ACP until the client closes the connection (stdin's end, by default).
    ``streams`` is ``(writer, reader)`` to the client (default: this process's stdio)."""
    agent = CorralAcpAgent(rt, model=model, tools=tools, system=system, asked=asked, hooks=hooks)
    if streams is None:
        reader, writer = await stdio_streams(limit=_STDIO_LIMIT)
        streams = (writer, reader)
    conn = AgentSideConnection(
        cast("acp.Agent", agent), streams[0], streams[1], listening=False
    )  # (the SDK routes only the methods it has; the Protocol names every one)
    agent.attach(asyncio.get_running_loop())
    try:
        await conn.listen()
    finally:
        agent.detach()
        await conn.close()
