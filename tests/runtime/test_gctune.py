"""The runtime's garbage-collector tuning is scoped to its lifetime."""

from __future__ import annotations

import gc
from pathlib import Path

from runtime import Runtime
from runtime.gctune import GC_THRESHOLDS


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
