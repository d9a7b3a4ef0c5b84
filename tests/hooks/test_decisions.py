"""How a run's exit code and stdout read under each dialect (no subprocess: the rules)."""

from __future__ import annotations

import json

import pytest

from runtime.hooks import CommandResult, read_outcome
from runtime.hooks.decisions import UNSET


def _out(payload: object) -> CommandResult:
    return CommandResult(exit_code=0, stdout=json.dumps(payload))


def _pre(**specific: object) -> CommandResult:
    return _out({"hookSpecificOutput": {"hookEventName": "PreToolUse", **specific}})


@pytest.mark.parametrize(
    ("result", "claude", "codex"),
    [
        (_pre(permissionDecision="allow"), "allow", "Codex takes permissionDecision: allow only with updatedInput"),
        (_pre(permissionDecision="ask"), "ask", "Codex does not support permissionDecision: ask"),
        (_pre(permissionDecision="deny"), "deny", "Codex needs a permissionDecisionReason to deny"),
        (_pre(updatedInput={"a": 1}), None, "Codex takes updatedInput only with permissionDecision: allow"),
        (_out({"decision": "approve"}), "allow", "Codex does not support decision: approve"),
        (_out({"decision": "block", "reason": "no"}), "deny", "deny"),
        (_out({"continue": False}), None, "Codex does not support continue: false in PreToolUse"),
        (CommandResult(exit_code=2, stderr=""), "deny", "exited with code 2 but wrote no reason to stderr"),
    ],
)
def test_pre_tool_use_answers_read_by_each_dialect(
    result: CommandResult, claude: str | None, codex: str
) -> None:
    ours = read_outcome("PreToolUse", result, dialect="claude", fail_closed=False)
    assert ours.problem is None and ours.decision == claude
    theirs = read_outcome("PreToolUse", result, dialect="codex", fail_closed=False)
    if codex in ("allow", "deny", "ask"):
        assert theirs.problem is None and theirs.decision == codex
    else:
        assert theirs.problem == codex and theirs.decision is None


def test_a_rewrite_an_allow_and_a_stop_are_read_together() -> None:
    result = _out(
        {
            "continue": False,
            "stopReason": "enough",
            "hookSpecificOutput": {"permissionDecision": "allow", "updatedInput": {"x": 2}},
        }
    )
    outcome = read_outcome("PreToolUse", result, dialect="claude", fail_closed=False)
    assert (outcome.decision, outcome.updated_input, outcome.stop) == ("allow", {"x": 2}, "enough")
    deny = _pre(permissionDecision="deny", permissionDecisionReason="no", updatedInput={"x": 2})
    assert read_outcome("PreToolUse", deny, dialect="claude", fail_closed=False).updated_input is UNSET


@pytest.mark.parametrize("event", ["UserPromptSubmit", "PostToolUse", "Stop"])
def test_block_needs_a_reason_under_codex_and_exit_2_blocks_these_events(event: str) -> None:
    bare = _out({"decision": "block"})
    assert read_outcome(event, bare, dialect="claude", fail_closed=False).decision == "block"
    codex = read_outcome(event, bare, dialect="codex", fail_closed=False)
    assert codex.decision is None and "non-empty reason" in (codex.problem or "")
    two = read_outcome(event, CommandResult(exit_code=2, stderr="why\n"), dialect="codex", fail_closed=False)
    assert (two.decision, two.reason) == ("block", "why")


def test_plain_stdout_is_context_only_where_the_tools_make_it_so() -> None:
    text = CommandResult(exit_code=0, stdout="remember this\n")
    for event in ("SessionStart", "UserPromptSubmit"):
        assert read_outcome(event, text, dialect="claude", fail_closed=False).context == "remember this"
    for event in ("PreToolUse", "PostToolUse", "Stop"):
        assert read_outcome(event, text, dialect="claude", fail_closed=False).context is None


def test_failures_are_problems_and_deny_or_block_only_when_fail_closed() -> None:
    for result in (
        CommandResult(exit_code=1, stderr="boom"),
        CommandResult(exit_code=None, timed_out=True, error="timed out after 1 s (killed)"),
        CommandResult(exit_code=0, stdout="{broken"),
        CommandResult(exit_code=0, stdout="[1, 2]"),
    ):
        open_ = read_outcome("PreToolUse", result, dialect="claude", fail_closed=False)
        assert open_.problem and open_.decision is None
        closed = read_outcome("PreToolUse", result, dialect="claude", fail_closed=True)
        assert closed.decision == "deny" and "fail-closed" in (closed.reason or "")
        assert read_outcome("Stop", result, dialect="claude", fail_closed=True).decision == "block"
        assert read_outcome("SessionStart", result, dialect="claude", fail_closed=True).decision is None
