"""``benchmarks/bench_telemetry.py``'s cases, small: every case settles its turns, the SDK
case exports the 4 spans a turn makes, and each floor case makes what it says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk")  # the test extra installs it

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_telemetry  # noqa: E402 -- the benchmarks directory is not a package


@pytest.mark.parametrize("case", bench_telemetry.CASES)
def test_each_case_settles_every_turn_and_the_sdk_case_exports_four_spans_a_turn(
    case: str,
) -> None:
    result = bench_telemetry.run(4, 2, 3, 0.0, case)
    assert result["turns_per_s"] > 0 and result["cpu_us_per_turn"] > 0
    assert result["spans"] == (4 * 2 * bench_telemetry.SPANS_PER_TURN if case == "on" else 0)


@pytest.mark.parametrize("kind", bench_telemetry.FLOORS)
def test_each_floor_case_makes_the_spans_and_measurements_it_says(kind: str) -> None:
    result = bench_telemetry.floor(kind, 20)
    assert result["cpu_us_per_turn"] > 0
    spans = 0 if kind == "sdk measurements" else bench_telemetry.SPANS_PER_TURN
    measurements = 0 if kind == "sdk spans" else bench_telemetry.MEASUREMENTS_PER_TURN
    assert result["spans_per_turn"] == spans
    assert result["measurements_per_turn"] == measurements
