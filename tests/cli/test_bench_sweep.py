"""``corral bench --sweep``: one run per value, a table, a JSON record and one PNG with
both curves and the knee; ``corral compare`` flags a planted regression."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import msgspec
import pytest

from runtime.load import LoadReport, SweepReport, read_report
from tests.cli.conftest import assert_one_error_line, corral


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    return width, height


def test_a_sweep_of_three_points_writes_the_table_the_json_and_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra (CI installs it)")
    report, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    result = corral(
        "bench",
        "--store",
        tmp_path / "store",
        "--sweep",
        "agents=2,4,8",
        "--turns",
        "2",
        "--latency",
        "0.01",
        "--json",
        report,
        "--plot",
        plot,
        "-q",
    )
    assert result.returncode == 0, result.stderr
    assert "sweep over agents" in result.stdout and "knee:" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows[:3]] == ["2", "4", "8"]
    sweep = json.loads(report.read_text())
    assert sweep["swept"] == "agents" and sweep["schema"] == 2
    assert [p["value"] for p in sweep["points"]] == [2, 4, 8]
    assert [p["report"]["settled"] for p in sweep["points"]] == [4, 8, 16]
    assert all(p["report"]["invariants_ok"] for p in sweep["points"])
    assert [p["report"]["sessions_checked"] for p in sweep["points"]] == [2, 4, 8]
    width, height = _png_size(plot)
    assert (width, height) == (800, 450)  # figsize 8 x 4.5 at 100 dpi
    assert plot.stat().st_size > 10_000  # two curves, axes and labels, not an empty frame
    # the picture opens as an image of that size, with more than one colour in it
    image = pytest.importorskip("matplotlib.image").imread(plot)
    assert image.shape[:2] == (450, 800)
    assert len({tuple(px) for px in image.reshape(-1, image.shape[2])[::97]}) > 5


def test_a_rate_sweep_runs_open_loops_and_reports_each_rate(tmp_path: Path) -> None:
    report = tmp_path / "sweep.json"
    result = corral(
        "bench",
        "--store",
        tmp_path / "store",
        "--agents",
        "4",
        "--sweep",
        "rate=20,40",
        "--duration",
        "0.5",
        "--arrivals",
        "constant",
        "--json",
        report,
        "-q",
    )
    assert result.returncode == 0, result.stderr
    decoded = read_report(report.read_bytes())
    assert isinstance(decoded, SweepReport) and decoded.swept == "rate"
    loops = [p.report.open_loop for p in decoded.points]
    assert [loop.rate for loop in loops if loop is not None] == [20, 40]
    assert [loop.arrivals for loop in loops if loop is not None] == [10, 20]


def _run(tmp_path: Path, name: str) -> Path:
    report = tmp_path / name
    result = corral(
        "bench", "--store", tmp_path / name.replace(".json", ""), "--agents", "10",
        "--turns", "2", "--json", report, "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return report


def test_compare_flags_a_planted_regression_and_exits_1(tmp_path: Path) -> None:
    a = _run(tmp_path, "a.json")
    base = msgspec.json.decode(a.read_bytes(), type=LoadReport)
    slower = msgspec.structs.replace(
        base,
        turns_per_s=base.turns_per_s / 2,
        latency_ms=msgspec.structs.replace(base.latency_ms, p99=base.latency_ms.p99 * 3 + 5),
    )
    b = tmp_path / "b.json"
    b.write_bytes(msgspec.json.encode(slower))
    result = corral("compare", a, b)
    line = assert_one_error_line(result, "2 regression(s) past 10%")
    assert "turns/s" in line and "latency p99 ms" in line
    flagged = [row for row in result.stdout.splitlines() if "REGRESSION" in row]
    assert len(flagged) == 2
    assert any("turns/s" in row and "0.500" in row for row in flagged)


def test_compare_of_a_report_with_itself_finds_no_regression(tmp_path: Path) -> None:
    a = _run(tmp_path, "a.json")
    result = corral("compare", a, a)
    assert result.returncode == 0, result.stderr
    assert "no regression past 10%" in result.stdout
    assert "1.000" in result.stdout


def test_compare_refuses_a_file_that_is_no_report(tmp_path: Path) -> None:
    a = _run(tmp_path, "a.json")
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"hello": 1}')
    assert_one_error_line(corral("compare", a, bogus), "is not a corral bench --json record")
