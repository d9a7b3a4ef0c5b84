"""Shared helpers of the reliability harnesses: child processes killed on cue, recorders.

A child prints whole lines to a pipe; :func:`run_until_killed` reads them, calls a
``cue`` for each complete line, and SIGKILLs the child when the cue asks for it (after
a random small delay, on a ``threading.Timer``). A watchdog kills a child that stops
talking, so a hung child fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runtime import RetryPolicy, Runtime
from storage import Event, check_invariants
from storage.lmdb.store import Store

WAIT = 10.0
WATCHDOG_S = 60.0
CHILD = Path(__file__).with_name("load_child.py")
FAST_RETRY = RetryPolicy(max_retries=8, base_s=0.001, cap_s=0.004)

# A cue sees each complete line; it returns None (go on) or a delay in seconds after
# which the child is killed (asked once; later lines are still read until EOF).
Cue = Callable[[str], float | None]


@dataclass
class ChildRun:
    """What one killed child printed (complete lines only) and how it ended."""

    lines: list[str] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""
    watchdog_fired: bool = False
    cued: bool = False


def child_command(*args: str) -> list[str]:
    return [sys.executable, str(CHILD), *args]


def run_until_killed(command: list[str], cue: Cue, *, watchdog_s: float = WATCHDOG_S) -> ChildRun:
    """Run ``command``; SIGKILL it when ``cue`` says so; return what it printed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = ChildRun()
    with tempfile.TemporaryFile() as errors:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, env=env)
        assert child.stdout is not None

        def watchdog_kill() -> None:
            run.watchdog_fired = True
            child.kill()

        watchdog = threading.Timer(watchdog_s, watchdog_kill)
        watchdog.start()
        killer: threading.Timer | None = None
        try:
            for raw in child.stdout:
                if not raw.endswith(b"\n"):
                    break  # a line torn by the kill says nothing
                line = raw.decode().rstrip("\n")
                run.lines.append(line)
                if killer is None:
                    delay = cue(line)
                    if delay is not None:
                        run.cued = True
                        killer = threading.Timer(delay, child.kill)
                        killer.start()
        finally:
            if killer is not None:
                killer.join()
            watchdog.cancel()
            child.kill()
            child.wait()
            child.stdout.close()
            errors.seek(0)
            run.stderr = errors.read().decode(errors="replace")
    run.returncode = child.returncode
    return run


def after_lines(prefix: str, count: int, delay: float) -> Cue:
    """A cue: kill ``delay`` s after the ``count``-th line starting with ``prefix``."""
    seen = [0]

    def cue(line: str) -> float | None:
        if line.startswith(prefix):
            seen[0] += 1
            if seen[0] >= count:
                return delay
        return None

    return cue


def assert_killed(run: ChildRun) -> None:
    assert not run.watchdog_fired, f"the child hung; stderr:\n{run.stderr[-3000:]}"
    assert run.cued, f"the child ended before its cue; stderr:\n{run.stderr[-3000:]}"
    assert run.returncode == -9, (
        f"the child did not die by SIGKILL ({run.returncode}); stderr:\n{run.stderr[-3000:]}"
    )


INBOX_EVENTS = ("inserted", "claimed", "discarded")  # the live agent/inbox/* events


class InboxFates:
    """What a session's splices did to each message (how often it was inserted, claimed,
    discarded) and what is still pending at the end of the log."""

    def __init__(self, events: list[Event]) -> None:
        self.done: dict[str, Counter[str]] = {name: Counter() for name in INBOX_EVENTS}
        lanes: dict[str, list[str]] = {"next-turn": [], "next-step": []}
        for event in events:
            if event.type != "agent/inbox/spliced":
                continue
            data = event.data
            lane = lanes[data.target]
            taken = lane[data.start : data.start + data.removed_count]
            self.done["discarded" if data.outcome else "claimed"].update(taken)
            ids = [message.id for message in data.inserted]
            self.done["inserted"].update(ids)
            lane[data.start : data.start + data.removed_count] = ids
        self.pending = lanes["next-turn"] + lanes["next-step"]


def check_whole_store(path: Path) -> int:
    """Every session of the store passes the invariants; returns the events checked."""
    checked = 0
    with Store.open(path, readonly=True) as store:
        for header in store.sessions():
            events = store.read(header.id, include_ignored=True)
            assert check_invariants(events) == [], f"session {header.id}"
            checked += len(events)
    return checked


def seeded(request: pytest.FixtureRequest) -> random.Random:
    seed = random.randrange(1 << 30)
    print(f"{request.node.name}: seed {seed}")  # shown when the test fails
    return random.Random(seed)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    return seeded(request)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    runtime = Runtime.open(tmp_path / "store", retry_policy=FAST_RETRY)
    try:
        yield runtime
    finally:
        runtime.close(timeout=WAIT)
        check_whole_store(tmp_path / "store")


class Recorder:
    """Records live events of a runtime (or one agent) in order; waits with timeouts."""

    def __init__(self, source: Any, *names: str) -> None:
        self._changed = threading.Condition()
        self.entries: list[tuple[str, Any]] = []
        self.disposers = [source.on(name, self._recorder(name)) for name in names]

    def _recorder(self, name: str) -> Callable[..., None]:
        # (event) for emitted events, (event, next) for waterfalls: it records and, for
        # a waterfall, decides nothing
        def record(event: Any, _next: Any = None) -> None:
            with self._changed:
                self.entries.append((name, event))
                self._changed.notify_all()

        return record

    def of(self, name: str, agent: str | None = None) -> list[Any]:
        with self._changed:
            return [
                e for n, e in self.entries if n == name and (agent is None or e.agent.id == agent)
            ]

    def wait_for(self, name: str, count: int = 1, timeout: float = WAIT) -> list[Any]:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: sum(1 for n, _ in self.entries if n == name) >= count, timeout
            )
        assert ok, f"timed out waiting for {count} x {name}"
        return self.of(name)


def corral(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m runtime.cli ARGS...`` to completion (text output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def python(code: str, *args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a snippet in a fresh interpreter (for what may kill its process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """A failed ``corral`` command printed one ``corral: error:`` line, no traceback."""
    assert result.returncode not in (0, None), result
    assert result.returncode > 0, f"killed by signal {-result.returncode}: {result.stderr}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("corral: error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]
