"""``corral acp``: serve the Agent Client Protocol over stdio (see docs/acp.md).

stdout carries JSON-RPC only; corral's own messages go to stderr. The command imports
the ACP SDK (``pip install 'corral[acp]'``) only when it runs, so the other commands do
not pay for it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import click

from runtime.runtime import Runtime
from storage.lmdb_store import Durability

from .errors import CliError
from .options import durability_option, hooks_option, store_option, threads_option

__all__ = ["acp"]


@click.command()
@click.option(
    "--model",
    "model_spec",
    required=True,
    help="A model string (scripted:echo, openai:gpt-4.1-mini, ...) or a factory "
    "package.module:function called for each session.",
)
@click.option(
    "--tools",
    "tool_specs",
    multiple=True,
    help="package.module:NAME (or file.py:NAME): a tool, a list of tools or a function "
    "returning them. Repeatable.",
)
@click.option(
    "--ask",
    "asked",
    multiple=True,
    help="A tool whose calls the client must approve (session/request_permission). "
    "Repeatable; tools wrapped with runtime.acp.needs_permission are asked for anyway.",
)
@click.option("--system", default=None, help="The system prompt of new sessions.")
@store_option
@durability_option
@threads_option
@hooks_option
def acp(
    model_spec: str,
    tool_specs: tuple[str, ...],
    asked: tuple[str, ...],
    system: str | None,
    store: Path,
    durability: str,
    threads: int | None,
    hooks: Path | None,
) -> None:
    """Serve the Agent Client Protocol over stdio: each ACP session is one agent."""
    try:
        import runtime.acp as server  # noqa: PLC0415 - the SDK only when serving
    except ImportError as err:
        raise CliError(
            f"corral acp needs the ACP SDK ({err}): pip install 'corral[acp]'"
        ) from err
    from runtime.hooks import install  # noqa: PLC0415

    try:
        model = server.model_factory(model_spec)
        tools = server.load_tools(tool_specs)
    except (server.AcpConfigError, ValueError) as err:
        raise CliError(str(err)) from err
    names = {t.spec.name for t in tools}
    unknown = sorted(set(asked) - names)
    if unknown:
        raise CliError(f"--ask names no tool given with --tools: {', '.join(unknown)}")
    rt = Runtime.open(store, durability=cast(Durability, durability), threads=threads)
    try:
        bridge = None if hooks is None else install(rt, hooks)
        asyncio.run(
            server.serve(rt, model=model, tools=tools, system=system, asked=asked, hooks=bridge)
        )
    finally:
        rt.close()
