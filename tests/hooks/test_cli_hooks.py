"""``--hooks FILE`` on ``corral run`` and ``corral bench``; ``hook/run`` in ``corral log``."""

from __future__ import annotations

import json
from pathlib import Path

from runtime.cli.options import STORE_FILES
from tests.cli.conftest import assert_one_error_line, corral, run_ok, write_script

SCRIPT = '''
from runtime import ScriptedModel, ToolCall, tool


@tool
def shout(text: str) -> str:
    """Shout."""
    return text.upper()


def main(rt, argv):
    agent = rt.spawn(
        model=ScriptedModel([[ToolCall(name="shout", arguments={"text": "hi"})], "done"]),
        tools=[shout],
        session_id="hooked",
    )
    agent.followup("go")
    assert agent.wait_idle(30)
    print(agent.session.events()[-1].type)
'''


def test_corral_run_with_hooks_logs_each_run_and_log_show_displays_it(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.json"
    hooks.write_text(
        json.dumps(
            {
                "hooks": {
                    "PreToolUse": [
                        {"matcher": "shout", "hooks": [{"command": "echo no shouting >&2; exit 2"}]}
                    ]
                }
            }
        )
    )
    script = write_script(tmp_path, "agent.py", SCRIPT)
    store = tmp_path / "store"
    run_ok(["run", "--store", store, "--hooks", hooks, script])
    shown = run_ok(["log", "show", "hooked", "--store", store])
    assert "tool error shout TOOL_DENIED: no shouting" in shown
    [line] = [line for line in shown.splitlines() if "hook/run" in line]
    assert '"event":"PreToolUse"' in line and '"exitCode":2' in line and '"decision":"deny"' in line
    raw = [json.loads(x) for x in run_ok(["log", "show", "hooked", "--raw", "--store", store]).splitlines()]
    [run] = [r for r in raw if r["type"] == "hook/run"]
    assert run["ignorable"] is True and run["data"]["reason"] == "no shouting"
    check = corral("log", "check", "--store", store)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "hook/run (1)" in check.stdout


def test_bad_hook_settings_are_one_error_line(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.json"
    hooks.write_text('{"hooks": {"Stop": [{"hooks": [{"command": ""}]}]}}')
    script = write_script(tmp_path, "agent.py", SCRIPT)
    result = corral("run", "--store", tmp_path / "store", "--hooks", hooks, script)
    assert_one_error_line(result, "'command' is a non-empty string")


def test_corral_bench_runs_every_agents_hooks(tmp_path: Path) -> None:
    count = tmp_path / "count"
    hooks = tmp_path / "hooks.json"
    hooks.write_text(json.dumps({"hooks": {"Stop": [{"hooks": [{"command": f"echo x >> {count}"}]}]}}))
    store = tmp_path / "store"
    out = run_ok(["bench", "--agents", "5", "--turns", "2", "--store", store, "--hooks", hooks, "-q"])
    assert "invariants: 5 sessions OK" in out
    assert count.read_text().count("x") == 10  # one Stop per turn
    assert {p.name for p in store.iterdir()} <= STORE_FILES  # transcripts live elsewhere
    again = ["bench", "--agents", "2", "--turns", "1", "--store", store, "--fresh", "--hooks", hooks, "-q"]
    assert "invariants: 2 sessions OK" in run_ok(again)
    assert count.read_text().count("x") == 12
