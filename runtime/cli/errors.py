"""One-line error rendering for the ``corral`` command line.

Every failure a person can meet ends as one line on stderr, ``corral: error: ...``, and a
non-zero exit code; the traceback is printed only with the global ``--debug`` flag (or
``CORRAL_DEBUG=1``). A usage error (click's, exit 2) is one such line too, ending with
``(see corral COMMAND --help)``. Exit codes: 0 success, 1 error, 2 usage, 3 a session
log breaks its invariants, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import click

from actors import AgentStateError
from storage import (
    DuplicateSessionError,
    InvalidEventError,
    LogCorruptError,
    SchemaVersionError,
    StorageError,
    UnknownSessionError,
)

from .transcript import shown

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_VIOLATIONS",
    "CliError",
    "CorralGroup",
    "InvariantsError",
    "ScriptError",
    "describe",
]

EXIT_ERROR: Final = 1
EXIT_VIOLATIONS: Final = 3
EXIT_INTERRUPTED: Final = 130
_PREFIX: Final = "corral: error: "


class CliError(click.ClickException):
    """A failure the command line itself detected, shown as ``corral: error: <message>``."""

    exit_code = EXIT_ERROR

    def show(self, file: Any = None) -> None:
        click.echo(_PREFIX + _one_line(self.format_message()), err=True)


class UsageLineError(click.UsageError):
    """A usage error (exit 2) shown as one line, ``corral: error: <message> (see corral
    COMMAND --help)``, in place of click's usage, hint and ``Error:`` lines."""

    def show(self, file: Any = None) -> None:
        hint = f" (see {self.ctx.command_path} --help)" if self.ctx is not None else ""
        click.echo(_PREFIX + _one_line(self.format_message()) + hint, err=True)


def _one_line_usage(err: click.UsageError) -> click.UsageError:
    """``err`` as a :class:`UsageLineError`; a group called without a command keeps
    printing its help (click's ``NoArgsIsHelpError``)."""
    if isinstance(err, (UsageLineError, click.exceptions.NoArgsIsHelpError)):
        return err
    return UsageLineError(err.format_message(), ctx=err.ctx)


class InvariantsError(CliError):
    """A session log breaks the session invariants (exit code 3)."""

    exit_code = EXIT_VIOLATIONS


class ScriptError(Exception):
    """A supervisor script run by ``corral run`` raised ``__cause__``."""

    def __init__(self, script: Path, error: BaseException) -> None:
        super().__init__(f"{script} raised {type(error).__name__}")
        self.script = script
        self.error = error

    def _in_script(self, tb: TracebackType) -> bool:
        return Path(tb.tb_frame.f_code.co_filename).resolve() == self.script.resolve()

    def where(self) -> str:
        """``script.py:LINE``: the deepest frame of the traceback inside the script."""
        error = self.error
        if isinstance(error, SyntaxError) and error.lineno is not None:
            return f"{self.script}:{error.lineno}"
        line: int | None = None
        tb = error.__traceback__
        while tb is not None:
            if self._in_script(tb):
                line = tb.tb_lineno
            tb = tb.tb_next
        return f"{self.script}:{line}" if line is not None else str(self.script)

    def script_traceback(self) -> TracebackType | None:
        """The traceback from the script's first frame on (corral's own frames dropped)."""
        tb = self.error.__traceback__
        while tb is not None and not self._in_script(tb):
            tb = tb.tb_next
        return tb or self.error.__traceback__


def _one_line(text: str) -> str:
    r"""``text`` as one line, safe for a terminal: an error's text may quote a logged
    value, or a script's error what a provider sent (control characters as ``\xNN``)."""
    lines = [part.strip() for part in str(text).strip().splitlines() if part.strip()]
    return shown("; ".join(lines)) if lines else "(no message)"


def _is_lmdb_error(err: BaseException) -> bool:
    return type(err).__module__.split(".")[0] == "lmdb"


def describe(err: BaseException) -> str:
    """The one line (without the ``corral: error:`` prefix) that explains ``err``."""
    match err:
        case ScriptError():
            inner = err.error
            text = inner.msg if isinstance(inner, SyntaxError) else str(inner)
            return f"{err.where()}: {type(inner).__name__}: {_one_line(text)}"
        case SchemaVersionError():
            return _one_line(str(err))
        case LogCorruptError():
            return f"corrupt session log: {_one_line(str(err))}"
        case UnknownSessionError() | DuplicateSessionError():
            return _one_line(str(err))
        case InvalidEventError():
            return f"invalid session log: {_one_line(str(err))}"
        case StorageError():
            return _one_line(str(err))
        case AgentStateError():
            return _one_line(str(err))
        case FileNotFoundError() | IsADirectoryError() | PermissionError() if err.filename:
            return f"{err.strerror or type(err).__name__}: {err.filename}"
        case ImportError() if "pip install" in str(err):
            return _one_line(str(err))
        case _ if _is_lmdb_error(err):
            detail = f"{type(err).__name__}: {_one_line(str(err))}"
            return f"the store is unreadable or corrupt ({detail})"
        case _ if type(err).__name__ in ("UnknownModelError", "MissingCredentialsError"):
            return _one_line(str(err))
        case _:
            hint = "(run with --debug for the traceback)"
            return f"{type(err).__name__}: {_one_line(str(err))} {hint}"


def debug_enabled(ctx: click.Context | None) -> bool:
    if os.environ.get("CORRAL_DEBUG", "") not in ("", "0"):
        return True
    root = ctx.find_root() if ctx is not None else None
    return bool(root is not None and root.params.get("debug"))


def print_traceback(err: BaseException) -> None:
    """The traceback of ``err`` on stderr (of a script's error, from the script's frames on)."""
    if isinstance(err, ScriptError):
        inner = err.error
        traceback.print_exception(type(inner), inner, err.script_traceback(), file=sys.stderr)
    else:
        traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)


def report(err: BaseException, ctx: click.Context | None) -> None:
    """Print ``err`` as one line (and its traceback first, with ``--debug``)."""
    if debug_enabled(ctx):
        print_traceback(err)
    click.echo(_PREFIX + shown(describe(err)), err=True)  # (each case's own text too)


class CorralGroup(click.Group):
    """A click group that turns every uncaught exception into one ``corral: error:`` line."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:  # the root's own options (`corral --bogus`)
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as err:
            raise _one_line_usage(err) from err

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.parent is not None:  # only the root group handles errors
            return super().invoke(ctx)
        try:
            return super().invoke(ctx)
        except click.UsageError as err:  # a command's options, arguments or name
            raise _one_line_usage(err) from err
        except click.exceptions.ClickException as err:
            if debug_enabled(ctx):
                print_traceback(err)
            raise
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("corral: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except (SystemExit, BrokenPipeError):
            raise  # click's main quietly exits 1 when the reader closed the pipe (`| head`)
        except BaseException as err:  # noqa: BLE001 - the last line of defence is one clear line
            report(err, ctx)
            ctx.exit(EXIT_ERROR)
