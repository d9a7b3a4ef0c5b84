"""``corral acp``: serve the Agent Client Protocol over stdio (see docs/acp.md).

stdout carries JSON-RPC only; corral's own messages go to stderr. The command imports
the ACP SDK (``pip install 'corral[acp]'``) only when it runs, so the other commands do
not pay for it.
"""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any, Final, cast

import click

from runtime.runtime import Runtime
from storage import Durability

from .errors import CliError
from .options import durability_option, hooks_option, store_option, threads_option

__all__ = ["acp"]

_CONFIG_KEYS: Final = {
    "model": "model_spec",
    "tools": "tool_specs",
    "ask": "asked",
    "system": "system",
    "store": "store",
    "durability": "durability",
    "threads": "threads",
    "hooks": "hooks",
}
_CONFIG_PATHS: Final = ("store", "hooks")


def _config(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    """``--config FILE``: a TOML file of the other options' defaults (its ``store`` and
    ``hooks`` relative to the file); the command line wins over it."""
    if value is None:
        return
    try:
        data: dict[str, Any] = tomllib.loads(value.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, tomllib.TOMLDecodeError) as err:
        raise click.BadParameter(f"cannot read {value}: {err}", ctx, param) from err
    unknown = sorted(set(data) - set(_CONFIG_KEYS))
    if unknown:
        known = ", ".join(_CONFIG_KEYS)
        raise click.BadParameter(
            f"{value}: unknown key(s) {', '.join(unknown)} (known: {known})", ctx, param
        )
    for key in _CONFIG_PATHS:
        if isinstance(data.get(key), str):
            data[key] = str(value.parent / Path(data[key]).expanduser())
    ctx.default_map = {**(ctx.default_map or {}), **{_CONFIG_KEYS[k]: v for k, v in data.items()}}


@click.command()
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    is_eager=True,
    expose_value=False,
    callback=_config,
    help="A TOML file of these options (model, tools, ask, system, store, durability, "
    "threads, hooks); the command line wins.",
)
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
