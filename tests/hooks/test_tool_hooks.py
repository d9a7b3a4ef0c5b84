"""PreToolUse and PostToolUse hooks: real scripts run as subprocesses around real tools."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from runtime import Runtime, ScriptedModel, ToolCall, tool
from storage import ToolResultData

from .conftest import checked, hook_runs, settings

CALL = ToolCall(name="write_note", arguments={"text": "rm -rf /"})


def _tools(seen: list[str]) -> list[object]:
    @tool
    def write_note(text: str) -> str:
        """Write a note."""
        seen.append(text)
        return f"wrote {text!r}"

    return [write_note]


def _results(rt: Runtime, agent_id: str) -> list[ToolResultData]:
    return [e.data for e in rt.get(agent_id).session.events() if e.type == "tool/result"]


def _run_one_call(rt: Runtime, seen: list[str]) -> str:
    agent = rt.spawn(model=ScriptedModel([[CALL], "done"]), tools=_tools(seen))
    agent.followup("write it")
    assert agent.wait_idle(30)
    return agent.id


def test_a_pre_tool_use_hook_that_exits_2_blocks_the_call_with_its_stderr_as_reason(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime]
) -> None:
    block = script(
        "block.py",
        "import json, sys\n"
        "call = json.load(sys.stdin)\n"
        "if 'rm -rf' in call['tool_input']['text']:\n"
        "    print('destructive command refused', file=sys.stderr)\n"
        "    sys.exit(2)\n",
    )
    rt = open_runtime(settings("PreToolUse", block, matcher="write_note"))
    seen: list[str] = []
    agent_id = _run_one_call(rt, seen)
    assert seen == []  # the body never ran
    [result] = _results(rt, agent_id)
    assert result.error is not None and result.error.code == "TOOL_DENIED"
    assert result.error.message == "destructive command refused"
    events = checked(rt.get(agent_id).session.events())
    [run] = hook_runs(events)
    assert run["event"] == "PreToolUse" and run["exitCode"] == 2
    assert run["decision"] == "deny" and run["reason"] == "destructive command refused"
    assert run["callId"] == result.message.call_id and run["durationMs"] > 0


def test_a_json_deny_blocks_and_a_matcher_that_does_not_match_runs_nothing(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime]
) -> None:
    deny = script(
        "deny.py",
        "import json\n"
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'PreToolUse',"
        " 'permissionDecision': 'deny', 'permissionDecisionReason': 'not today'}}))\n",
    )
    hooks = {
        "hooks": {
            "PreToolUse": [
                {"matcher": "Bash", "hooks": [{"type": "command", "command": "exit 2"}]},
                {"matcher": "write_.*", "hooks": [{"type": "command", "command": deny}]},
            ]
        }
    }
    rt = open_runtime(hooks)
    seen: list[str] = []
    agent_id = _run_one_call(rt, seen)
    assert seen == []
    [result] = _results(rt, agent_id)
    assert result.error is not None and result.error.message == "not today"
    [run] = hook_runs(rt.get(agent_id).session.events())  # the Bash group did not match
    assert run["command"] == deny and run["exitCode"] == 0 and run["decision"] == "deny"


def test_updated_input_rewrites_what_the_tool_runs_with(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime]
) -> None:
    rewrite = script(
        "rewrite.py",
        "import json, sys\n"
        "call = json.load(sys.stdin)\n"
        "text = call['tool_input']['text'].replace('rm -rf /', 'ls')\n"
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'PreToolUse',"
        " 'permissionDecision': 'allow', 'updatedInput': {'text': text}}}))\n",
    )
    rt = open_runtime(settings("PreToolUse", rewrite))
    seen: list[str] = []
    agent_id = _run_one_call(rt, seen)
    assert seen == ["ls"]
    [result] = _results(rt, agent_id)
    assert result.error is None and result.message.content[0].text == "wrote 'ls'"
    events = checked(rt.get(agent_id).session.events())
    [call] = [e.data for e in events if e.type == "tool/call"]
    assert json.loads(call.arguments) == {"text": "rm -rf /"}  # the model's call, as logged
    [run] = hook_runs(events)
    assert run["decision"] == "allow" and run["updated"] is True


def test_a_hook_that_hangs_past_its_timeout_is_killed_and_the_call_goes_on(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    marker = tmp_path / "finished"
    hang = script("hang.py", f"import time\ntime.sleep(60)\nopen({str(marker)!r}, 'w').close()\n")
    rt = open_runtime(settings("PreToolUse", hang, timeout=0.5))
    seen: list[str] = []
    agent_id = _run_one_call(rt, seen)
    assert seen == ["rm -rf /"]  # fail-open: the call ran
    [run] = hook_runs(rt.get(agent_id).session.events())
    assert run["timedOut"] is True and "exitCode" not in run and "decision" not in run
    assert "timed out after 0.5 s" in run["problem"]
    assert 500 <= run["durationMs"] < 30_000
    assert not marker.exists()


def test_a_fail_closed_hook_that_hangs_denies_the_call(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime]
) -> None:
    hang = script("hang.py", "import time\ntime.sleep(60)\n")
    rt = open_runtime(settings("PreToolUse", hang, timeout=0.5, failClosed=True))
    seen: list[str] = []
    agent_id = _run_one_call(rt, seen)
    assert seen == []
    [result] = _results(rt, agent_id)
    assert result.error is not None and result.error.code == "TOOL_DENIED"
    assert "fail-closed" in result.error.message and "timed out" in result.error.message
    [run] = hook_runs(rt.get(agent_id).session.events())
    assert run["decision"] == "deny" and run["failClosed"] is True


def test_a_hook_that_prints_invalid_json_is_ignored_and_logged(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime]
) -> None:
    broken = script("broken.py", "print('{\"hookSpecificOutput\": {\"permissionDecision\": ')\n")
    rt = open_runtime(settings("PreToolUse", broken))
    seen: list[str] = []
    agent_id = _run_one_call(rt, seen)
    assert seen == ["rm -rf /"]
    [run] = hook_runs(rt.get(agent_id).session.events())
    assert run["exitCode"] == 0 and "not valid JSON" in run["problem"]
    assert "decision" not in run


def test_another_exit_code_is_a_non_blocking_error(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime]
) -> None:
    rt = open_runtime(settings("PreToolUse", "echo oops >&2; exit 3"))
    seen: list[str] = []
    agent_id = _run_one_call(rt, seen)
    assert seen == ["rm -rf /"]
    [run] = hook_runs(rt.get(agent_id).session.events())
    assert run["exitCode"] == 3 and run["problem"] == "exited with code 3: oops"


def test_post_tool_use_block_and_context_are_fed_back_and_codex_may_replace_the_output(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime]
) -> None:
    feedback = script(
        "feedback.py",
        "import json, sys\n"
        "call = json.load(sys.stdin)\n"
        "assert call['tool_response'] == \"wrote 'rm -rf /'\", call\n"
        "print(json.dumps({'decision': 'block', 'reason': 'that note looks dangerous',"
        " 'hookSpecificOutput': {'hookEventName': 'PostToolUse',"
        " 'additionalContext': 'notes are public'}}))\n",
    )
    rt = open_runtime(settings("PostToolUse", feedback))
    seen: list[str] = []
    agent_id = _run_one_call(rt, seen)
    [result] = _results(rt, agent_id)
    assert result.message.content[0].text == (
        "wrote 'rm -rf /'\n\nPostToolUse hook: that note looks dangerous\n\nnotes are public"
    )
    rt.close()

    replace = script(
        "replace.py",
        "import json\n"
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'PostToolUse',"
        " 'updatedToolOutput': 'redacted'}}))\n",
    )
    for dialect, expected in (("codex", "redacted"), ("claude", "wrote 'rm -rf /'")):
        rt = open_runtime({**settings("PostToolUse", replace), "dialect": dialect})
        agent_id = _run_one_call(rt, seen)
        [result] = _results(rt, agent_id)
        assert result.message.content[0].text == expected
        [run] = hook_runs(rt.get(agent_id).session.events())
        assert ("problem" in run) is (dialect == "claude")
        rt.close()


def test_codex_needs_a_reason_on_stderr_to_block_with_exit_2_and_refuses_ask(
    open_runtime: Callable[..., Runtime],
) -> None:
    ask = (
        "echo '{\"hookSpecificOutput\": {\"hookEventName\": \"PreToolUse\","
        " \"permissionDecision\": \"ask\"}}'"
    )
    for dialect, ran in (("claude", False), ("codex", True)):
        rt = open_runtime({**settings("PreToolUse", "exit 2"), "dialect": dialect})
        seen: list[str] = []
        _run_one_call(rt, seen)
        assert bool(seen) is ran, dialect
        rt.close()
        # ask: Claude Code asks the user (nobody can here: denied, saying so); Codex refuses it
        rt = open_runtime({**settings("PreToolUse", ask), "dialect": dialect})
        seen = []
        agent_id = _run_one_call(rt, seen)
        assert bool(seen) is ran, dialect
        if not ran:
            [result] = _results(rt, agent_id)
            assert result.error is not None and "corral acp" in result.error.message
        rt.close()
