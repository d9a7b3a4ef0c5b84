"""Hook settings in Claude Code's / Codex's command-hook format, loaded and checked.

The shape (both tools document it)::

    {"hooks": {"PreToolUse": [{"matcher": "Bash|write_.*",
                               "hooks": [{"type": "command", "command": "./check.sh",
                                          "timeout": 30}]}]}}

``hooks`` maps an event name to matcher groups; each group's ``hooks`` are the commands
to run, each with a ``timeout`` in seconds. corral reads two more keys of its own, which
the other tools ignore: a top-level ``"dialect"`` (``"claude"``, the default, or
``"codex"``: whose rules decide what a hook's output means, see
:mod:`runtime.hooks.decisions`) and ``"failClosed"`` (top level or per command: a hook
that fails, times out or prints what cannot be read then denies or blocks instead of
being ignored). Events corral has no counterpart for and non-``command`` hooks are kept
in :attr:`HookSettings.ignored` (and logged once), so one settings file can serve every
tool.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

import msgspec

from storage import CorralError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "EVENTS",
    "Dialect",
    "HookCommand",
    "HookSettings",
    "HookSettingsError",
    "MatcherGroup",
    "load_settings",
]

log = logging.getLogger("corral.hooks")

Dialect: TypeAlias = Literal["claude", "codex"]
EVENTS: Final = (
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "Stop",
    "SessionEnd",
)
"""The hook events corral runs (the others of Claude Code and Codex are ignored)."""
DEFAULT_TIMEOUT_S: Final = 60.0
"""A command's timeout when its settings give none (Claude Code's default)."""
_MATCH_ALL: Final = ("", "*")


class HookSettingsError(CorralError, ValueError):
    """A hook settings file (or mapping) cannot be used: the message says where."""


class HookCommand(msgspec.Struct, frozen=True):
    """One ``{"type": "command"}`` hook: a shell command line and its limits."""

    command: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    fail_closed: bool = False


class MatcherGroup(msgspec.Struct, frozen=True):
    """The commands of one matcher; ``matcher`` None matches everything."""

    matcher: str | None
    commands: tuple[HookCommand, ...]

    def matches(self, value: str | None, dialect: Dialect) -> bool:
        """Whether ``value`` (a tool name, a session source) is matched. Claude Code
        matches a plain name exactly and anything else as a regular expression of the
        whole value; Codex searches for the expression in the value."""
        if self.matcher is None or self.matcher in _MATCH_ALL or value is None:
            return True
        if dialect == "codex":
            return re.search(self.matcher, value) is not None
        return re.fullmatch(self.matcher, value) is not None


class HookSettings(msgspec.Struct, frozen=True):
    """Loaded settings: the matcher groups of each event corral runs."""

    dialect: Dialect = "claude"
    events: Mapping[str, tuple[MatcherGroup, ...]] = msgspec.field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    """What was left out, named (``"Notification"``, ``"PreToolUse[0].hooks[1] (prompt)"``)."""

    def commands(self, event: str, value: str | None = None) -> list[HookCommand]:
        """The commands to run for ``event`` on ``value``, in settings order; one command
        line that several groups match runs once (both tools deduplicate)."""
        seen: dict[str, HookCommand] = {}
        for group in self.events.get(event, ()):
            if group.matches(value, self.dialect):
                for command in group.commands:
                    seen.setdefault(command.command, command)
        return list(seen.values())

    def has(self, event: str) -> bool:
        return bool(self.events.get(event))


def _where(path: str | None) -> str:
    return f"hook settings {path}" if path else "hook settings"


def _timeout(raw: object, where: str) -> float:
    if raw is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw < 86_400:
        raise HookSettingsError(f"{where}: timeout is a number of seconds > 0, got {raw!r}")
    return float(raw)


def _flag(raw: object, where: str, default: bool) -> bool:
    if raw is None:
        return default
    if type(raw) is not bool:
        raise HookSettingsError(f"{where}: failClosed is true or false, got {raw!r}")
    return raw


def _group(raw: object, where: str, fail_closed: bool, ignored: list[str]) -> MatcherGroup:
    if not isinstance(raw, Mapping):
        raise HookSettingsError(f"{where}: a matcher group is an object, got {raw!r}")
    matcher = raw.get("matcher")
    if matcher is not None:
        if type(matcher) is not str:
            raise HookSettingsError(f"{where}: matcher is a string, got {matcher!r}")
        try:
            re.compile(matcher)
        except re.error as err:
            raise HookSettingsError(
                f"{where}: matcher {matcher!r} is not a regular expression: {err}"
            ) from err
    hooks = raw.get("hooks")
    if not isinstance(hooks, list):
        raise HookSettingsError(f"{where}: 'hooks' is a list of commands, got {hooks!r}")
    commands: list[HookCommand] = []
    for index, entry in enumerate(hooks):
        at = f"{where}.hooks[{index}]"
        if not isinstance(entry, Mapping):
            raise HookSettingsError(f"{at}: a hook is an object, got {entry!r}")
        kind = entry.get("type", "command")
        if kind != "command":
            ignored.append(f"{at} ({kind})")
            continue
        command = entry.get("command")
        if type(command) is not str or not command.strip():
            raise HookSettingsError(f"{at}: 'command' is a non-empty string, got {command!r}")
        commands.append(
            HookCommand(
                command=command,
                timeout_s=_timeout(entry.get("timeout"), at),
                fail_closed=_flag(entry.get("failClosed"), at, fail_closed),
            )
        )
    return MatcherGroup(matcher=matcher, commands=tuple(commands))


def _parse(raw: object, path: str | None) -> HookSettings:
    where = _where(path)
    if not isinstance(raw, Mapping):
        raise HookSettingsError(f"{where}: the settings are a JSON object, got {raw!r}")
    dialect = raw.get("dialect", "claude")
    if dialect not in ("claude", "codex"):
        raise HookSettingsError(f"{where}: dialect is 'claude' or 'codex', got {dialect!r}")
    fail_closed = _flag(raw.get("failClosed"), where, False)
    hooks = raw.get("hooks", {})
    if not isinstance(hooks, Mapping):
        raise HookSettingsError(f"{where}: 'hooks' maps event names to lists, got {hooks!r}")
    events: dict[str, tuple[MatcherGroup, ...]] = {}
    ignored: list[str] = []
    for event, groups in hooks.items():
        if event not in EVENTS:
            ignored.append(str(event))
            continue
        if not isinstance(groups, list):
            raise HookSettingsError(f"{where}: hooks.{event} is a list, got {groups!r}")
        events[event] = tuple(
            _group(group, f"{where}: {event}[{i}]", fail_closed, ignored)
            for i, group in enumerate(groups)
        )
    if ignored:
        log.warning("%s: corral does not run %s", where, ", ".join(ignored))
    return HookSettings(dialect=dialect, events=events, ignored=tuple(ignored))


def load_settings(
    source: str | os.PathLike[str] | Mapping[str, Any] | HookSettings,
) -> HookSettings:
    """The settings of a JSON file (a path) or of a mapping of that shape; raises
    :class:`HookSettingsError` naming what is wrong."""
    if isinstance(source, HookSettings):
        return source
    if isinstance(source, Mapping):
        return _parse(source, None)
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"hooks is a settings file path or a mapping, got {source!r}")
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise HookSettingsError(f"cannot read hook settings {path}: {err}") from err
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise HookSettingsError(f"hook settings {path} are not JSON: {err}") from err
    return _parse(raw, str(path))
