"""Claude Code / Codex command hooks, run unchanged on corral's public event surface.

``Runtime.open(path, hooks="settings.json")`` (or ``--hooks FILE`` on ``corral run``,
``corral bench`` and ``corral acp``) loads a settings file in their format and
:func:`install` s a :class:`HookBridge` on the runtime: every agent's
``SessionStart``, ``UserPromptSubmit``, ``PreToolUse``, ``PostToolUse``, ``Stop`` and
``SessionEnd`` hooks run as subprocesses on the I/O side, each run a durable
``hook/run`` fact. See docs/hooks.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .bridge import Asker, HookBridge, HookHost
from .decisions import HookOutcome, read_outcome
from .facts import HOOK_RUN, HookRun
from .runner import CommandResult, run_command
from .settings import (
    EVENTS,
    HookCommand,
    HookSettings,
    HookSettingsError,
    MatcherGroup,
    load_settings,
)

__all__ = [
    "EVENTS",
    "HOOK_RUN",
    "Asker",
    "CommandResult",
    "HookBridge",
    "HookCommand",
    "HookOutcome",
    "HookRun",
    "HookSettings",
    "HookSettingsError",
    "MatcherGroup",
    "install",
    "load_settings",
    "read_outcome",
    "run_command",
]


def install(
    rt: HookHost,
    hooks: str | os.PathLike[str] | Mapping[str, Any] | HookSettings,
    *,
    cwd: str | None = None,
    transcripts: Path | None = None,
) -> HookBridge:
    """Load ``hooks`` (a settings file, a mapping of its shape, or loaded settings) and
    run them for every agent of ``rt``; returns the bridge (``bridge.close()`` removes
    it). ``cwd`` is where the commands run (default: this process's working directory);
    ``transcripts`` the directory of the ``transcript_path`` exports (default: a
    private temporary directory, removed with the bridge or at the process's exit)."""
    settings = load_settings(hooks)
    return HookBridge(rt, settings, cwd=cwd, transcripts=transcripts).install()
