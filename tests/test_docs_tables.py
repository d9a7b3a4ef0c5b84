"""The docs' reference tables against the code they describe."""

from __future__ import annotations

import re
from pathlib import Path

from actors.events import ToolResultEvent

EVENTS = Path(__file__).resolve().parent.parent / "docs" / "events.md"


def _row(event: str) -> list[str]:
    """The cells of the live-event table's row for ``event`` alone."""
    for line in EVENTS.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"| `{event}` |"):
            return [cell.strip() for cell in line.strip("|").split("|")]
    raise AssertionError(f"docs/events.md has no live-event row for {event!r} alone")


def test_the_readme_lists_the_payload_the_tools_result_event_carries() -> None:
    # Before, README.md gave tools/result the payload of the tool waterfalls ("the
    # call: call_id, name, arguments"); it carries no arguments (its tool/call does).
    payload = _row("tools/result")[2]
    listed = re.match(r"`([^`]*)`", payload)
    assert listed is not None, payload
    fields = [name.strip() for name in listed.group(1).split(",")]
    assert sorted(fields) == sorted(ToolResultEvent.__struct_fields__)
