"""``benchmarks/ab_turns.py`` end to end, small: two checkouts run at the same moment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ab_turns_runs_both_versions_in_pairs_and_reports_each_ratio_and_their_median(
    tmp_path: Path,
) -> None:
    out = tmp_path / "ab.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "ab_turns.py"),
            str(ROOT),
            str(ROOT),
            "--repeats",
            "2",
            "--agents",
            "20",
            "--turns",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text(encoding="utf-8"))["results"]
    assert len(results["pairs"]) == 2
    for pair, ratio in zip(results["pairs"], results["ratios"], strict=True):
        assert pair["A"]["turns_per_s"] > 0
        assert pair["B"]["turns_per_s"] > 0
        assert ratio == pair["B"]["turns_per_s"] / pair["A"]["turns_per_s"]
    assert sorted(results["ratios"])[0] <= results["median"] <= sorted(results["ratios"])[1]
    assert "median B / A" in done.stdout


def test_ab_turns_refuses_a_version_that_is_neither_a_checkout_nor_a_revision(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ab_turns.py"), "no-such-rev", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "not a directory or git revision: 'no-such-rev'" in done.stderr
