"""Helpers for the hook tests: real hook scripts written to tmp_path, a real store."""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from storage import Event, assert_invariants


@pytest.fixture
def script(tmp_path: Path) -> Callable[[str, str], str]:
    """``script(name, python_source)``: an executable Python hook script; returns the
    command line that runs it."""

    def write(name: str, source: str) -> str:
        path = tmp_path / name
        path.write_text(f"#!{sys.executable}\n{source}", encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return str(path)

    return write


def settings(event: str, *commands: str, matcher: str | None = None, **extra: Any) -> dict[str, Any]:
    """A settings mapping running ``commands`` for ``event``."""
    group: dict[str, Any] = {"hooks": [{"type": "command", "command": c, **extra} for c in commands]}
    if matcher is not None:
        group["matcher"] = matcher
    return {"hooks": {event: [group]}}


@pytest.fixture
def open_runtime(tmp_path: Path) -> Iterator[Callable[..., Runtime]]:
    opened: list[Runtime] = []

    def open_(hooks: Any, **kwargs: Any) -> Runtime:
        rt = Runtime.open(tmp_path / "store", hooks=hooks, **kwargs)
        opened.append(rt)
        return rt

    yield open_
    for rt in opened:
        rt.close()


def hook_runs(events: list[Event]) -> list[dict[str, Any]]:
    """The ``hook/run`` facts of a log, as the JSON they are stored as."""
    import msgspec

    return [
        json.loads(msgspec.json.encode(e.data)) for e in events if e.type == "hook/run"
    ]


def checked(events: list[Event]) -> list[Event]:
    assert_invariants(events)
    return events
