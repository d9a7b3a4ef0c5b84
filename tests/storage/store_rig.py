"""The store tests' shared fixture and builders (``test_store*`` files)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import Store
from tests.storage.builders import LogBuilder, completed_turn, ticking_clock, tool_turn

WAIT = 30.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "store", clock=ticking_clock()) as opened:
        yield opened


def two_turns(store: Store, session_id: str = "agent-1") -> LogBuilder:
    log = LogBuilder(store.create_session(session_id))
    completed_turn(log)
    tool_turn(log)
    return log
