"""Running one hook command: an asyncio subprocess on the I/O side, with a timeout.

The command line runs through the shell (``/bin/sh -c``), as Claude Code and Codex run
theirs, in a session of its own: a timeout kills its whole process group, so a script
that started children (``sleep`` in a shell script) leaves nothing behind. The JSON
input goes to its stdin; stdout and stderr are read whole (each cut at
:data:`MAX_OUTPUT_BYTES`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping
from typing import Final

import msgspec

__all__ = ["MAX_OUTPUT_BYTES", "CommandResult", "run_command"]

MAX_OUTPUT_BYTES: Final = 1 << 20
"""What is kept of a command's stdout and of its stderr (the rest is dropped)."""
_REAP_S: Final = 5.0


class CommandResult(msgspec.Struct, frozen=True, kw_only=True):
    """How one run ended. ``exit_code`` is None when the command did not exit by itself
    (it could not start, or it was killed at its timeout: ``timed_out``)."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_ms: float = 0.0
    error: str | None = None
    """Why there is no exit code: the command could not be started, or timed out."""


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # its own session: pgid == pid


def _text(data: bytes | None) -> str:
    return (data or b"")[:MAX_OUTPUT_BYTES].decode("utf-8", "replace")


async def run_command(
    command: str,
    stdin: bytes,
    *,
    timeout_s: float,
    cwd: str,
    env: Mapping[str, str],
) -> CommandResult:
    """Run ``command`` with ``stdin``; never raises for the command's own failures (a
    cancel of the caller kills it and is raised on)."""
    started = time.perf_counter()

    def elapsed() -> float:
        return round((time.perf_counter() - started) * 1000.0, 3)

    try:
        process = await asyncio.create_subprocess_shell(
            command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as err:
        return CommandResult(exit_code=None, duration_ms=elapsed(), error=f"cannot start: {err}")
    try:
        out, errors = await asyncio.wait_for(process.communicate(stdin), timeout_s)
    except TimeoutError:
        _kill_group(process)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), _REAP_S)
        return CommandResult(
            exit_code=None,
            timed_out=True,
            duration_ms=elapsed(),
            error=f"timed out after {timeout_s:g} s (killed)",
        )
    except BaseException:
        _kill_group(process)
        raise
    code = process.returncode
    if code is not None and code < 0:  # killed by a signal: no exit code of its own
        return CommandResult(
            exit_code=None,
            stdout=_text(out),
            stderr=_text(errors),
            duration_ms=elapsed(),
            error=f"killed by signal {-code}",
        )
    return CommandResult(
        exit_code=code, stdout=_text(out), stderr=_text(errors), duration_ms=elapsed()
    )
