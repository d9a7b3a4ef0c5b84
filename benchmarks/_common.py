"""Shared benchmark plumbing: argparse defaults, timing, statistics, tables, JSON, RSS.

Every ``bench_<topic>.py`` builds its parser with :func:`parser`, measures with
``time.perf_counter`` over repeats, reports medians (and ratios against a baseline
measured in the same run), prints a table with :func:`print_table` and writes a JSON
record with :func:`write_json` when ``--json PATH`` is given. Memory is measured in a
fresh subprocess with :func:`rss_of` so the benchmark's own heap does not pollute it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "median",
    "parser",
    "percentile",
    "print_table",
    "rss_of",
    "system_info",
    "timed",
    "write_json",
]


def parser(description: str, *, repeats: int = 5) -> argparse.ArgumentParser:
    """An argparse parser with the shared ``--json PATH`` and ``--repeats N`` options."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--repeats", type=int, default=repeats, help=f"runs per case (default {repeats})"
    )
    return p


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes (``perf_counter``)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print an aligned text table: the first column left, the others right; floats
    get thousands separators (or 2 decimals when small)."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in text]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in parts)

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in text:
        print(line(row))


def system_info() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def write_json(path: Path | None, name: str, results: dict[str, Any]) -> None:
    """Write ``{"benchmark", "system", "argv", "results"}`` to ``path`` (if given)."""
    if path is None:
        return
    record = {"benchmark": name, "system": system_info(), "argv": sys.argv, "results": results}
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def rss_of(code: str, *, timeout: float = 600.0) -> dict[str, int]:
    """Run the snippet ``code`` in a fresh interpreter; return its peak RSS in bytes.

    The snippet may print; the helper appends its own line and reads the last one.
    """
    probe = (
        f"{code}\n"
        "import json as _j, resource as _r\n"
        "print(_j.dumps({'max_rss': _r.getrusage(_r.RUSAGE_SELF).ru_maxrss * 1024}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=timeout
    )
    return {"max_rss": int(json.loads(done.stdout.strip().splitlines()[-1])["max_rss"])}
