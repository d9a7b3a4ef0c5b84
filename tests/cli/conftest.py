"""Helpers for the command-line tests: every command runs in a subprocess
(``python -m runtime.cli``) against a real store in a temporary directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

WRITER = '''
from runtime import LlmFailure, ScriptedModel, ToolCall, tool


@tool(concurrency_safe=True)
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value-of-{key}"


def main(rt, argv):
    for sid in argv:
        model = ScriptedModel([
            [ToolCall("lookup", {"key": "k1"})],
            LlmFailure(message="overloaded", code="SERVER", status=503),
            "the answer is 42",
        ])
        agent = rt.spawn(model=model, tools=[lookup], session_id=sid, system="be brief")
        agent.followup(f"question for {sid}")
    for sid in argv:
        assert rt.get(sid).wait_idle(30)
    rt.flush()
    print("written", flush=True)
'''

SESSIONS = ("alpha", "beta", "gamma")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT prints every thread's stack (see spawn_corral)
    return env


def corral(
    *args: str | Path,
    cwd: Path | None = None,
    input: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``corral ARGS...`` to completion; returns the completed process (text)."""
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *map(str, args)],
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        check=False,
    )


@contextmanager
def spawn_corral(*args: str | Path, cwd: Path | None = None) -> Iterator[subprocess.Popen[str]]:
    """Start ``corral ARGS...`` with pipes for stdin, stdout and stderr; on exit, kill it
    if it is still running (a failed test never leaves it behind) and close the pipes.
    A process still running then is first sent SIGABRT: its threads' stacks (Python's
    fault handler) and the end of its stderr are printed into the test's report."""
    with subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", *map(str, args)],
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    ) as process:
        try:
            yield process
        finally:
            if process.poll() is None:
                _report_stuck(process)


def _report_stuck(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGABRT)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        return
    stderr = process.stderr.read() if process.stderr is not None else ""
    print(f"corral process {process.pid} was still running; the end of its stderr:")
    print(stderr[-20_000:])


def assert_one_error_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """A failed command printed exactly one ``corral: error:`` line and no traceback."""
    assert result.returncode != 0, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("corral: error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def write_script(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def written_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store written by another process: three sessions (``alpha``, ``beta``,
    ``gamma``), each with a tool call, a failed request and a retry turn."""
    root = tmp_path_factory.mktemp("written")
    script = write_script(root, "writer.py", WRITER)
    store = root / "store"
    result = corral("run", "--store", store, script, *SESSIONS)
    assert result.returncode == 0, result.stderr
    assert "written" in result.stdout
    return store


def run_ok(args: Sequence[str | Path]) -> str:
    result = corral(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout
