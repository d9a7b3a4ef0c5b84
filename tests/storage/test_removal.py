"""Removing whole sessions from a store no process writes (what a cluster reshard does
with a session it copied to another shard): the others stay intact, byte for byte."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from storage import StorageError, Store, remove_sessions
from tests.storage.builders import LogBuilder, completed_turn, tool_turn


def _exported(store: Store, session_id: str) -> bytes:
    out = io.BytesIO()
    store.export_jsonl(session_id, out)
    return out.getvalue()


def test_removed_sessions_are_gone_and_the_others_read_back_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        for name in ("keep-1", "drop", "keep-2", "drop-too"):
            log = LogBuilder(store.create_session(name))
            completed_turn(log, text=f"hello {name}")
            tool_turn(log)
        store.flush()
        kept = {name: _exported(store, name) for name in ("keep-1", "keep-2")}
    assert remove_sessions(path, ["drop", "drop-too", "never-there"]) == ["drop", "drop-too"]
    assert remove_sessions(path, ["drop"]) == []  # run again (after a crash): nothing left
    with Store.open(path) as store:
        assert [h.id for h in store.sessions()] == ["keep-1", "keep-2"]
        assert not store.has_session("drop")
        assert store.read("drop") == []
        assert {name: _exported(store, name) for name in kept} == kept
        fresh = LogBuilder(store.create_session("drop"))  # the id is free again
        completed_turn(fresh)
        store.flush()
        new_key = store.sessions()[-1].key
    with Store.open(path, readonly=True) as store:
        assert [h.id for h in store.sessions()] == ["keep-1", "keep-2", "drop"]
        assert new_key > max(h.key for h in store.sessions()[:2])  # keys are not reused
        assert len(store.read("drop")) == len(fresh.events)


def test_a_store_open_for_writing_is_not_touched(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Store.open(path) as store:
        completed_turn(LogBuilder(store.create_session("busy")))
        store.flush()
        with pytest.raises(StorageError, match="already open for writing"):
            remove_sessions(path, ["busy"])
        assert store.has_session("busy")
