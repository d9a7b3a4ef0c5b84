"""``corral run SCRIPT [ARGS]...``: run a supervisor script with a ready ``Runtime``.

The script runs with ``__name__ == "__corral__"`` and the open runtime as the global
``rt``; ``sys.argv`` is ``[SCRIPT, *ARGS]``. If it defines ``main(rt, argv)``, that is
called after the module body (an ``async def main`` runs in its own event loop with
``asyncio.run``), and an ``int`` it returns is the exit code. The runtime is closed on
every way out (running turns cancelled, inboxes kept, logs flushed). A Ctrl-C while
it closes does not stop the close; the one after quits at once, leaving what was still
running for ``rt.resume`` to repair, as a crash would.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import runpy
import signal
import sys
from pathlib import Path
from typing import cast

import click

from runtime.runtime import Runtime
from storage import Durability

from .errors import EXIT_ERROR, EXIT_INTERRUPTED, CliError, ScriptError
from .options import durability_option, hooks_option, store_option, threads_option

__all__ = ["RUN_NAME", "run"]

RUN_NAME = "__corral__"


def _exit_code(code: object) -> int:
    """Python's rules for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    click.echo(str(code), err=True)
    return EXIT_ERROR


def _execute(script: Path, args: tuple[str, ...], rt: Runtime) -> int:
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        namespace = runpy.run_path(str(script), init_globals={"rt": rt}, run_name=RUN_NAME)
        main = namespace.get("main")
        if callable(main):
            result = main(rt, list(args))
            if inspect.iscoroutine(result):  # async def main(rt, argv)
                result = asyncio.run(result)
            return result if isinstance(result, int) and not isinstance(result, bool) else 0
        return 0
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


_INTERRUPTED = "corral: interrupted; closing the runtime (turns cancelled, logs flushed)"


class _Interrupts:
    """Ctrl-C (SIGINT) during ``corral run``, from the script's start to the end of the
    close. The first press interrupts the script (``KeyboardInterrupt``) and the close
    begins; it is marked in the handler itself, so no later press can fall between the
    two and break off the close. During the close the next press says what is going
    on, the one after quits the process at once (committed facts are on disk; turns
    still running are left open, for ``rt.resume`` to repair, as after a crash)."""

    def __init__(self) -> None:
        self.closing = False
        self.announced = False
        self._presses = 0
        self._previous: object = None

    def __enter__(self) -> _Interrupts:
        try:
            self._previous = signal.signal(signal.SIGINT, self._on_interrupt)
        except ValueError:  # not the main thread: Python's own handling stays
            self._previous = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]

    def announce(self) -> None:
        if not self.announced:
            self.announced = True
            click.echo(_INTERRUPTED, err=True)

    def _on_interrupt(self, signum: int, frame: object) -> None:
        if not self.closing:
            self.closing = True
            self.announce()
            raise KeyboardInterrupt
        self._presses += 1
        if self._presses == 1:
            click.echo(
                "corral: still closing the runtime (logs are being flushed); Ctrl-C again "
                "quits at once, leaving running turns for rt.resume to repair",
                err=True,
            )
            return
        click.echo("corral: quit without closing the runtime", err=True)
        sys.stdout.flush()
        os._exit(EXIT_INTERRUPTED)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@store_option
@durability_option
@threads_option
@hooks_option
@click.argument("script", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(
    store: Path,
    durability: str,
    threads: int | None,
    hooks: Path | None,
    script: Path,
    args: tuple[str, ...],
) -> None:
    """Run a supervisor SCRIPT with a ready runtime (the global `rt`, or `main(rt, argv)`)."""
    if not script.is_file():
        raise CliError(f"no script at {script}")
    rt = Runtime.open(
        store, durability=cast(Durability, durability), threads=threads, hooks=hooks
    )
    with _Interrupts() as interrupts:
        try:
            try:
                code = _execute(script, args, rt)
            except SystemExit as stop:
                code = _exit_code(stop.code)
            except KeyboardInterrupt:
                interrupts.announce()
                code = EXIT_INTERRUPTED
            except BaseException as err:  # GeneratorExit or a script's own BaseException too
                raise ScriptError(script, err) from err
        finally:
            interrupts.closing = True
            rt.close()
    if code:
        raise click.exceptions.Exit(code)
