"""``corral top`` against a store another process is writing, then after that process
is SIGKILLed: a real writer subprocess (``corral run``), a real reader subprocess."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from .conftest import assert_one_error_line, corral, spawn_corral, write_script

WRITER = '''
import asyncio
import threading

from runtime import ScriptedModel


class Stuck:
    """A model whose every request waits for ever: its turn stays open."""

    provider = "test"
    name = "stuck"

    def __init__(self):
        self.reached = threading.Event()

    async def stream(self, request):
        self.reached.set()
        await asyncio.Event().wait()
        yield  # never reached: makes this an async generator


def main(rt, argv):
    agents = [rt.spawn(model=ScriptedModel.echo(), session_id=f"busy-{i}") for i in range(20)]
    for agent in agents:
        agent.followup("one")
        agent.followup("two")
    for agent in agents:
        assert agent.wait_idle(30)
    stuck = Stuck()
    rt.spawn(model=stuck, session_id="stuck-agent").followup("wait")
    assert stuck.reached.wait(30)
    print("ready", flush=True)
    threading.Event().wait()  # until killed
'''


def test_top_shows_a_store_while_another_process_writes_it_and_says_when_it_was_killed(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    script = write_script(tmp_path, "writer.py", WRITER)
    with spawn_corral("run", "--store", store, script) as writer:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        live = corral("top", "--store", store, "--frames", "2", "--interval", "0.1")
        assert live.returncode == 0, live.stderr
        frame = live.stdout.split("corral top")[-1]  # the last frame
        assert f"writer: process {writer.pid} running" in frame
        lines = {line.split()[0]: line.split()[1:] for line in frame.splitlines() if line.split()}
        assert lines["sessions"] == ["21"]
        assert lines["open"] == ["1"] and lines["idle"] == ["20"]
        assert lines["completed"] == ["40"]
        assert lines["stuck-agent"][0] == "1"  # the slowest open turn: turn 1
        assert lines["scripted:scripted"][0] != "0"  # tokens in by model
        os.kill(writer.pid, signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL
        after = corral("top", "--store", store, "--frames", "1")
    assert after.returncode == 0, after.stderr
    assert f"writer: process {writer.pid} is not running" in after.stdout
    lines = {line.split()[0]: line.split()[1:] for line in after.stdout.splitlines() if line}
    assert lines["sessions"] == ["21"] and lines["open"] == ["1"]


def test_top_on_a_missing_store_is_one_clear_error(tmp_path: Path) -> None:
    assert_one_error_line(
        corral("top", "--store", tmp_path / "none", "--frames", "1"), "no corral store"
    )
