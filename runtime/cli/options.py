"""Options, the store's file names and the output-path check shared by several ``corral``
commands."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import click

__all__ = [
    "DEFAULT_STORE",
    "STORE_FILES",
    "FiniteFloatRange",
    "NewFilePath",
    "durability_option",
    "group_store_option",
    "hooks_option",
    "inherited_store_option",
    "refuse_store_file",
    "store_option",
    "threads_option",
]

DEFAULT_STORE: Final = "./.corral/"
# The files of a store directory (what ``bench --fresh`` and a failed import may delete).
STORE_FILES: Final = frozenset({"data.mdb", "lock.mdb", "writer.lock"})
F = TypeVar("F", bound=Callable[..., Any])


def _store_option(help: str) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        return click.option(
            "--store",
            "store",
            type=click.Path(path_type=Path, file_okay=True, dir_okay=True),
            default=DEFAULT_STORE,
            show_default=True,
            envvar="CORRAL_STORE",
            help=help,
        )(fn)

    return decorate


store_option: Final = _store_option("The store directory (also $CORRAL_STORE).")

group_store_option: Final = _store_option(
    "The store directory of every command below (also $CORRAL_STORE)."
)
"""``--store`` of a command group (``corral log --store S ls``): its commands take it
unless they are given their own ``--store``."""


def _inherit_store(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path:
    if value is not None:
        return value
    parent = ctx.parent
    while parent is not None:  # the group's --store (or $CORRAL_STORE, or its default)
        inherited = parent.params.get("store")
        if isinstance(inherited, Path):
            return inherited
        parent = parent.parent
    return Path(DEFAULT_STORE)


def inherited_store_option(fn: F) -> F:
    """``--store`` of a command in a group with :func:`group_store_option`: given here it
    wins; else the group's applies."""
    return click.option(
        "--store",
        "store",
        type=click.Path(path_type=Path, file_okay=True, dir_okay=True),
        default=None,
        callback=_inherit_store,
        help=f"The store directory (default: the group's --store, $CORRAL_STORE, {DEFAULT_STORE}).",
    )(fn)


def durability_option(fn: F) -> F:
    return click.option(
        "--durability",
        type=click.Choice(["write-ahead", "turn", "none"]),
        default="write-ahead",
        show_default=True,
        help="When appended facts are synced to disk.",
    )(fn)


def hooks_option(fn: F) -> F:
    return click.option(
        "--hooks",
        "hooks",
        type=click.Path(path_type=Path, dir_okay=False, exists=True),
        default=None,
        help="A Claude Code / Codex hook settings file whose hooks every agent runs.",
    )(fn)


def threads_option(fn: F) -> F:
    return click.option(
        "--threads",
        type=click.IntRange(min=1),
        default=None,
        help="Dispatcher worker threads (default: the runtime's choice).",
    )(fn)


class FiniteFloatRange(click.FloatRange):
    """A :class:`click.FloatRange` that refuses ``nan`` and ``inf`` as a usage error
    (exit 2): ``nan`` passes every range check, as ``inf`` passes an unbounded one."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class NewFilePath(click.Path):
    """A file a command writes when it is done: refused up front (a usage error) if its
    directory does not exist or is not writable, so a long run does not fail at its end."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        directory = Path(os.fsdecode(path)).parent
        if not directory.is_dir():
            self.fail(f"directory {str(directory)!r} does not exist.", param, ctx)
        if not os.access(directory, os.W_OK | os.X_OK):
            self.fail(f"directory {str(directory)!r} is not writable.", param, ctx)
        return path


def refuse_store_file(output: Path, store: Path, param_name: str) -> None:
    """Refuse, as a bad value of the command's ``param_name`` (a usage error, exit 2),
    an output file that is the store directory or one of the store's own files (or a
    link to one, existing or not yet): writing ``data.mdb`` while it is mapped, or
    before the store is made there, destroys every session in it."""
    ctx = click.get_current_context()
    param = next(p for p in ctx.command.params if p.name == param_name)
    if output.resolve() == store.resolve():
        raise click.BadParameter(f"{output} is the store directory.", ctx, param)
    for name in sorted(STORE_FILES):
        own = store / name
        same = own.exists() and output.exists() and os.path.samefile(output, own)
        if same or output.resolve() == own.resolve():
            raise click.BadParameter(
                f"{output} is the store's own {name}: write to another file.", ctx, param
            )
