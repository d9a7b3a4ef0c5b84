"""The runtime's garbage-collector tuning is scoped to its lifetime."""

from __future__ import annotations

import gc
from pathlib import Path

from runtime import Runtime
from runtime.gctune import GC_THRESHOLDS, collection_paused


def test_a_runtime_raises_gc_thresholds_while_open_and_restores_them_on_close(tmp_path: Path) -> None:
    before = gc.get_threshold()
    with Runtime.open(tmp_path / "a") as first:
        assert gc.get_threshold()[0] >= GC_THRESHOLDS[0]
        with Runtime.open(tmp_path / "b"):
            assert gc.get_threshold()[0] >= GC_THRESHOLDS[0]
        assert gc.get_threshold()[0] >= GC_THRESHOLDS[0], "still tuned while one runtime is open"
        assert first.store.sessions() == []
    assert gc.get_threshold() == before


def test_gc_tuning_can_be_turned_off(tmp_path: Path) -> None:
    before = gc.get_threshold()
    with Runtime.open(tmp_path / "s", tune_gc=False):
        assert gc.get_threshold() == before


def test_a_paused_batch_runs_without_collection_and_leaves_its_objects_in_the_oldest_generation() -> None:
    was_enabled = gc.isenabled()
    gc.enable()
    try:
        with collection_paused():
            assert not gc.isenabled()
            with collection_paused():  # a second batch at the same time (another thread)
                pass
            assert not gc.isenabled(), "still paused while the first batch runs"
            made = [[] for _ in range(100)]
        assert gc.isenabled()
        young = {id(o) for o in gc.get_objects(generation=0)}
        young |= {id(o) for o in gc.get_objects(generation=1)}
        assert not young.intersection(map(id, made)), "no young pass would rescan them"
        assert gc.is_tracked(made[0])
    finally:
        if not was_enabled:
            gc.disable()


def test_a_paused_batch_leaves_a_disabled_collector_disabled() -> None:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        if was_enabled:
            gc.enable()
