"""What a hook's run says: its exit code and stdout read by Claude Code's or Codex's rules.

- Exit 0: stdout, if it is a JSON object, holds the decision; plain text is context for
  ``SessionStart`` and ``UserPromptSubmit`` and ignored elsewhere; text that starts like
  JSON but does not parse is a *problem* (fail-open: ignored, unless fail-closed).
- Exit 2: a blocking error, stderr is the reason: denies a ``PreToolUse``, blocks a
  ``UserPromptSubmit`` or a ``Stop``, is fed back after a ``PostToolUse``; nothing for
  ``SessionStart`` / ``SessionEnd``. Codex needs a non-empty stderr to block (an empty
  one is a problem); Claude Code blocks either way.
- Any other exit, a timeout, a command that cannot start: a problem.
- A problem of a fail-closed command denies (``PreToolUse``) or blocks (the others).

The JSON fields read (``hookSpecificOutput`` is where the event's own ones live):
``continue`` / ``stopReason`` (stop the agent), ``decision`` / ``reason``,
``permissionDecision`` / ``permissionDecisionReason`` / ``updatedInput``,
``additionalContext``, and for ``PostToolUse`` under Codex ``updatedToolOutput``. What
Codex refuses (docs/hooks.md lists it, from codex-rs/hooks/src/engine/output_parser.rs)
is a problem under ``"dialect": "codex"``.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal, TypeAlias

import msgspec

from .runner import CommandResult
from .settings import Dialect

__all__ = ["UNSET", "Decision", "HookOutcome", "read_outcome"]

Decision: TypeAlias = Literal["allow", "deny", "ask", "block"]
_CONTEXT_EVENTS: Final = frozenset({"SessionStart", "UserPromptSubmit"})
_BLOCKING: Final = frozenset({"UserPromptSubmit", "PostToolUse", "Stop"})


class _Unset(msgspec.Struct, frozen=True):
    """No value given (a hook may set ``updatedInput`` to null)."""


UNSET: Final = _Unset()


class HookOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What one command's run decided."""

    decision: Decision | None = None
    reason: str | None = None
    context: str | None = None
    updated_input: Any = UNSET
    updated_output: Any = UNSET
    stop: str | None = None
    """``continue: false``: stop the agent, with this reason."""
    problem: str | None = None
    """Why the run was not read as a decision (ignored unless fail-closed)."""


def _failed(event: str, problem: str, fail_closed: bool) -> HookOutcome:
    if not fail_closed:
        return HookOutcome(problem=problem)
    decision: Decision | None = "deny" if event == "PreToolUse" else "block"
    if event not in _BLOCKING and event != "PreToolUse":
        decision = None  # SessionStart / SessionEnd have nothing to block
    reason = f"hook failed (fail-closed): {problem}"
    return HookOutcome(decision=decision, reason=reason, problem=problem)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _exit_two(event: str, result: CommandResult, dialect: Dialect) -> HookOutcome:
    reason = result.stderr.strip()
    if not reason and dialect == "codex":
        return HookOutcome(problem="exited with code 2 but wrote no reason to stderr")
    reason = reason or "blocked by a hook (exit code 2)"
    if event == "PreToolUse":
        return HookOutcome(decision="deny", reason=reason)
    if event in _BLOCKING:
        return HookOutcome(decision="block", reason=reason)
    return HookOutcome(reason=reason)  # SessionStart / SessionEnd: shown, not acted on


def _pre_tool_use(out: dict[str, Any], specific: dict[str, Any], dialect: Dialect) -> HookOutcome:
    permission = specific.get("permissionDecision")
    reason = _text(specific.get("permissionDecisionReason"))
    updated = specific.get("updatedInput", UNSET)
    context = _text(specific.get("additionalContext"))
    legacy = out.get("decision")
    if permission is None and legacy is not None:  # the older top-level form
        if dialect == "codex" and legacy == "approve":
            return HookOutcome(problem="Codex does not support decision: approve")
        permission = {"approve": "allow", "block": "deny"}.get(legacy, legacy)
        reason = _text(out.get("reason"))
    if permission not in (None, "allow", "deny", "ask"):
        return HookOutcome(problem=f"permissionDecision is allow, deny or ask, got {permission!r}")
    if dialect == "codex":
        if permission == "ask":
            return HookOutcome(problem="Codex does not support permissionDecision: ask")
        if updated is not UNSET and permission != "allow":
            return HookOutcome(
                problem="Codex takes updatedInput only with permissionDecision: allow"
            )
        if permission == "allow" and updated is UNSET:
            return HookOutcome(
                problem="Codex takes permissionDecision: allow only with updatedInput"
            )
        if permission == "deny" and reason is None:
            return HookOutcome(problem="Codex needs a permissionDecisionReason to deny")
        for key in ("stopReason", "suppressOutput"):
            if out.get(key):
                return HookOutcome(problem=f"Codex does not support {key} in PreToolUse")
        if out.get("continue") is False:
            return HookOutcome(problem="Codex does not support continue: false in PreToolUse")
    return HookOutcome(
        decision=permission,
        reason=reason,
        context=context,
        updated_input=updated if permission != "deny" else UNSET,
    )


def _blocking(
    event: str, out: dict[str, Any], specific: dict[str, Any], dialect: Dialect
) -> HookOutcome:
    decision = out.get("decision")
    reason = _text(out.get("reason"))
    if decision not in (None, "block", "approve"):
        return HookOutcome(problem=f"decision is 'block' (or absent), got {decision!r}")
    if decision == "block" and reason is None and dialect == "codex":
        return HookOutcome(problem=f"Codex needs a non-empty reason with decision: block ({event})")
    updated: Any = UNSET
    if event == "PostToolUse" and "updatedToolOutput" in specific:
        if dialect != "codex":
            return HookOutcome(
                problem="updatedToolOutput is Codex's (set \"dialect\": \"codex\"); Claude Code "
                "rewrites only MCP tools' output"
            )
        updated = specific["updatedToolOutput"]
    return HookOutcome(
        decision="block" if decision == "block" else None,
        reason=reason or ("blocked by a hook" if decision == "block" else None),
        context=_text(specific.get("additionalContext")),
        updated_output=updated,
    )


def _json_outcome(event: str, stdout: str, dialect: Dialect) -> HookOutcome:
    try:
        out = json.loads(stdout)
    except ValueError as err:
        return HookOutcome(problem=f"stdout is not valid JSON: {err}")
    if not isinstance(out, dict):
        return HookOutcome(problem=f"stdout JSON is not an object: {stdout[:200]!r}")
    specific = out.get("hookSpecificOutput") or {}
    if not isinstance(specific, dict):
        return HookOutcome(problem="hookSpecificOutput is not an object")
    if event == "PreToolUse":
        outcome = _pre_tool_use(out, specific, dialect)
    elif event in _BLOCKING:
        outcome = _blocking(event, out, specific, dialect)
    else:  # SessionStart, SessionEnd
        outcome = HookOutcome(context=_text(specific.get("additionalContext")))
    if outcome.problem is None and out.get("continue") is False:
        stop = _text(out.get("stopReason")) or f"a {event} hook stopped the agent"
        outcome = msgspec.structs.replace(outcome, stop=stop)
    return outcome


def read_outcome(
    event: str, result: CommandResult, *, dialect: Dialect, fail_closed: bool
) -> HookOutcome:
    """The decision of one run of a hook command for ``event``."""
    if result.exit_code is None:
        return _failed(event, result.error or "did not exit", fail_closed)
    if result.exit_code == 2:
        outcome = _exit_two(event, result, dialect)
    elif result.exit_code != 0:
        stderr = result.stderr.strip()[:500]
        detail = f": {stderr}" if stderr else ""
        return _failed(event, f"exited with code {result.exit_code}{detail}", fail_closed)
    else:
        stdout = result.stdout.strip()
        if not stdout:
            return HookOutcome()
        if stdout[0] in "{[":
            outcome = _json_outcome(event, stdout, dialect)
        elif event in _CONTEXT_EVENTS:
            return HookOutcome(context=stdout)
        else:
            return HookOutcome()
    if outcome.problem is not None:
        return _failed(event, outcome.problem, fail_closed)
    return outcome
