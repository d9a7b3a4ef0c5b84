"""``corral run SCRIPT``: the global ``rt``, ``main(rt, argv)``, exit codes, Ctrl-C, and
the example supervisor scripts."""

from __future__ import annotations

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
    assert "invariants: 1 sessions OK" in run_ok(["log", "check", "--store", store])


@pytest.mark.parametrize(
    ("example", "args", "expect"),
    [
        ("fan_out_fan_in.py", ["200"], "fan-in: 200 answers"),
        ("restart_crashed.py", ["10", "3"], "10/10 tasks completed, 3 restart(s)"),
        ("steer_and_cancel.py", [], "'steered': ['completed']"),
    ],
)
def test_the_examples_run_as_they_are(
    tmp_path: Path, example: str, args: list[str], expect: str
) -> None:
    store = tmp_path / "store"
    out = run_ok(["run", "--store", store, EXAMPLES / example, *args])
    assert expect in out
    assert "sessions OK" in run_ok(["log", "check", "--store", store])
