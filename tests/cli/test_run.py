"""``corral run SCRIPT``: the global ``rt``, ``main(rt, argv)``, exit codes, Ctrl-C, and
the example supervisor scripts."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.cli.conftest import assert_one_error_line, corral, run_ok, spawn_corral, write_script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

GLOBAL_RT = """
from runtime import ScriptedModel
agent = rt.spawn(model=ScriptedModel.echo(), session_id="from-script")
agent.followup("hello from a script")
agent.wait_idle(10)
print("name", __name__)
"""

WITH_MAIN = """
def main(rt, argv):
    print("argv", argv)
    return int(argv[0])

if __name__ == "__main__":
    raise SystemExit("the standalone guard must not run under corral")
"""

RAISES = """
def check(tasks):
    if not tasks:
        raise ValueError("the task list is empty")

check([])
"""

SLOW_TURN = """
from runtime import ScriptedModel
agent = rt.spawn(model=ScriptedModel.echo(latency=60), session_id="slow")
agent.followup("take your time")
print("started", flush=True)
agent.wait_idle()
"""


def test_a_script_gets_a_ready_runtime_as_the_global_rt(tmp_path: Path) -> None:
    store = tmp_path / "store"
    out = run_ok(["run", "--store", store, write_script(tmp_path, "s.py", GLOBAL_RT)])
    assert "name __corral__" in out
    listing = run_ok(["log", "show", "from-script", "--store", store])
    assert "user: hello from a script" in listing  # closed and flushed on exit


def test_main_gets_rt_and_argv_and_its_int_result_is_the_exit_code(tmp_path: Path) -> None:
    script = write_script(tmp_path, "m.py", WITH_MAIN)
    result = corral("run", "--store", tmp_path / "store", script, "7", "--not-an-option")
    assert result.returncode == 7, result.stderr
    assert "argv ['7', '--not-an-option']" in result.stdout


@pytest.mark.parametrize(
    ("body", "code", "stderr"),
    [("raise SystemExit(4)", 4, ""), ("raise SystemExit('bye')", 1, "bye"), ("pass", 0, "")],
)
def test_the_scripts_system_exit_is_the_exit_code(
    tmp_path: Path, body: str, code: int, stderr: str
) -> None:
    result = corral("run", "--store", tmp_path / "store", write_script(tmp_path, "e.py", body))
    assert result.returncode == code
    assert result.stderr.strip() == stderr


def test_a_script_that_raises_exits_1_with_one_line(tmp_path: Path) -> None:
    script = write_script(tmp_path, "bad.py", RAISES)
    result = corral("run", "--store", tmp_path / "store", script)
    assert result.returncode == 1
    line = assert_one_error_line(result, "ValueError: the task list is empty")
    assert line.endswith(f"{script}:4: ValueError: the task list is empty")


def test_debug_prints_the_scripts_traceback(tmp_path: Path) -> None:
    script = write_script(tmp_path, "bad.py", RAISES)
    result = corral("--debug", "run", "--store", tmp_path / "store", script)
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert 'raise ValueError("the task list is empty")' in result.stderr
    assert "runpy" not in result.stderr  # corral's own frames are left out
    assert result.stderr.splitlines()[-1].startswith("corral: error: ")


def test_ctrl_c_cancels_running_turns_flushes_and_exits_130(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with spawn_corral(
        "run", "--store", store, write_script(tmp_path, "slow.py", SLOW_TURN)
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        stderr = proc.stderr.read()
    assert "Traceback" not in stderr
    assert (
        stderr.strip() == "corral: interrupted; closing the runtime (turns cancelled, logs flushed)"
    )
    shown = run_ok(["log", "show", "slow", "--store", store])
    assert "turn 1 ends: aborted (disposed)" in shown
    assert "invariants: 1 session OK" in run_ok(["log", "check", "--store", store])


EXAMPLE_RUNS = [
    ("fan_out_fan_in.py", ["200"], "fan-in: 200 answers, sum of squares = 2,686,700 (correct)"),
    ("restart_crashed.py", ["10", "3"], "10/10 tasks completed, 3 restart(s)"),
    ("steer_and_cancel.py", [], "task two   -> discarded"),
    ("tree_of_agents.py", ["3"], "total letters: 23"),
    ("asyncio_supervisor.py", ["5"], "6 settled events (0 dropped)"),
]


def test_every_example_is_run_by_the_test_below() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(r[0] for r in EXAMPLE_RUNS)


@pytest.mark.parametrize(("example", "args", "expect"), EXAMPLE_RUNS)
def test_the_examples_run_as_they_are(
    tmp_path: Path, example: str, args: list[str], expect: str
) -> None:
    store = tmp_path / "store"
    out = run_ok(["run", "--store", store, EXAMPLES / example, *args])
    assert expect in out
    assert "sessions OK" in run_ok(["log", "check", "--store", store])


TOOL_WAITS_ON_FIFO = """
import sys
from runtime import ScriptedModel, ToolCall, tool

RELEASE = sys.argv[1]  # read now: corral restores sys.argv when the script is left

@tool
def wait_for_release() -> str:
    \"\"\"Block until the test writes to the FIFO.\"\"\"
    print("tool running", flush=True)
    with open(RELEASE) as fifo:
        return fifo.read() or "released"

agent = rt.spawn(
    model=ScriptedModel([[ToolCall("wait_for_release", {})], "done"]),
    tools=[wait_for_release],
    session_id="held",
)
agent.followup("go")
agent.wait_idle()
"""


def _interrupt_while_a_tool_runs(tmp_path: Path, presses: int) -> tuple[int, str, Path]:
    """``corral run`` a script whose tool blocks on a FIFO; Ctrl-C ``presses`` times
    (each after the line the previous one printed), then release the tool.
    Returns the exit code, stderr and the store."""
    store, fifo = tmp_path / "store", tmp_path / "release"
    os.mkfifo(fifo)
    script = write_script(tmp_path, "held.py", TOOL_WAITS_ON_FIFO)
    with spawn_corral("run", "--store", store, script, fifo) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().strip() == "tool running"
        lines = []
        for _ in range(presses):
            proc.send_signal(signal.SIGINT)
            lines.append(proc.stderr.readline().strip())
        if proc.poll() is None and presses < 3:
            with open(fifo, "w") as release:
                release.write("released")
        code = proc.wait(timeout=30)
        rest = proc.stderr.read()
    return code, "\n".join([*lines, rest.strip()]).strip(), store


def test_a_second_ctrl_c_while_closing_does_not_stop_the_close(tmp_path: Path) -> None:
    code, stderr, store = _interrupt_while_a_tool_runs(tmp_path, presses=2)
    assert code == 130
    assert stderr.splitlines() == [
        "corral: interrupted; closing the runtime (turns cancelled, logs flushed)",
        "corral: still closing the runtime (logs are being flushed); Ctrl-C again quits at "
        "once, leaving running turns for rt.resume to repair",
    ]
    shown = run_ok(["log", "show", "held", "--store", store])
    assert "released" in shown  # the tool finished during the close and its result is logged
    assert "invariants: 1 session OK" in run_ok(["log", "check", "--store", store])


def test_a_third_ctrl_c_quits_at_once_leaving_the_turn_for_resume(tmp_path: Path) -> None:
    code, stderr, store = _interrupt_while_a_tool_runs(tmp_path, presses=3)
    assert code == 130, stderr
    assert stderr.splitlines()[-1] == "corral: quit without closing the runtime"
    assert corral("log", "check", "--store", store).returncode == 3  # the turn is open
    checked = run_ok(["log", "check", "--allow-open-tail", "--store", store])
    assert "invariants: 1 session OK" in checked


def test_an_async_main_is_run_and_its_int_is_the_exit_code(tmp_path: Path) -> None:
    body = """
import asyncio
from runtime import ScriptedModel

async def main(rt, argv):
    agent = rt.spawn(model=ScriptedModel.echo(), session_id="async")
    agent.followup("from async main")
    await asyncio.get_running_loop().run_in_executor(None, agent.wait_idle, 10)
    return int(argv[0])
"""
    store = tmp_path / "store"
    result = corral("run", "--store", store, write_script(tmp_path, "a.py", body), "5")
    assert result.returncode == 5, result.stderr
    assert "RuntimeWarning" not in result.stderr
    assert "user: from async main" in run_ok(["log", "show", "async", "--store", store])


@pytest.mark.parametrize(
    ("raised", "shown"),
    [("GeneratorExit('g')", "GeneratorExit: g"), ("Custom('mine')", "Custom: mine")],
)
def test_a_script_raising_a_base_exception_exits_1_with_one_line(
    tmp_path: Path, raised: str, shown: str
) -> None:
    body = f"class Custom(BaseException):\n    pass\n\nraise {raised}\n"
    script = write_script(tmp_path, "b.py", body)
    result = corral("run", "--store", tmp_path / "store", script)
    assert result.returncode == 1
    assert_one_error_line(result, f"{script}:4: {shown}")
