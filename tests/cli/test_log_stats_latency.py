"""``corral log stats --latency``: where a store's turns spent their time, read from the
logs after the run that wrote them (here: another process's)."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import run_ok


def _row(out: str, part: str) -> list[float]:
    line = next(line for line in out.splitlines() if line.startswith(f"│ {part} "))
    cells = [cell.strip() for cell in line.strip("│").split("│")]
    return [float(cell.replace(",", "")) for cell in cells[1:]]


def test_latency_breaks_the_stores_turns_down_from_their_logs(written_store: Path) -> None:
    out = run_ok(["log", "stats", "--latency", "--store", written_store])
    assert "sessions" in out  # the statistics are still there
    # three sessions, each one chain: a tool step, a failed request, its retry turn
    assert "where the time went (3 turns, ms)" in out
    p50, _p95, _p99, _mean = _row(out, "retry back-off")
    assert p50 >= 400  # the default retry policy waits 0.5 s (+-10%) before the retry
    wall = _row(out, "turn (logged)")
    parts = ("queue (inbox)", "hooks / listeners", "model (incl. ttft)", "tools", "engine")
    mean_parts = sum(_row(out, part)[3] for part in parts) + _row(out, "retry back-off")[3]
    assert abs(mean_parts - wall[3]) <= 0.5  # the means add up (rounded to 0.1 ms each)
    assert "durable commit" not in out  # not in the log: a live run measures it


def test_without_latency_stats_print_no_breakdown(written_store: Path) -> None:
    out = run_ok(["log", "stats", "--store", written_store])
    assert "where the time went" not in out
