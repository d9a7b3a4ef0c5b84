"""``corral compare A.json B.json``: two ``corral bench --json`` records side by side.

Each metric with A, B and the ratio B/A; a metric worse in B by more than
``--threshold`` is flagged, and any flag makes the exit status 1 (for CI: a change that
made the stack slower fails the build). Sweeps are compared point by point.
"""

from __future__ import annotations

from pathlib import Path

import click
import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from runtime.load import (
    Comparison,
    LoadReport,
    SweepReport,
    compare_reports,
    compare_sweeps,
    read_report,
)

from .errors import CliError
from .options import FiniteFloatRange

__all__ = ["RegressionError", "compare"]


class RegressionError(CliError):
    """B is worse than A past the threshold on at least one metric (exit code 1)."""


def _read(path: Path) -> LoadReport | SweepReport:
    try:
        return read_report(path.read_bytes())
    except OSError as err:
        raise CliError(f"cannot read {path}: {err.strerror or err}") from err
    except msgspec.DecodeError as err:  # ValidationError too
        raise CliError(f"{path} is not a corral bench --json record: {err}") from err


def _value(number: float) -> str:
    return f"{number:,.4g}" if abs(number) < 1000 else f"{number:,.0f}"


def _table(rows: list[Comparison], a: Path, b: Path, threshold: float) -> Table:
    sweep = any(row.point is not None for row in rows)
    table = Table(title=f"B/A, worse by more than {threshold:.0%} flagged", title_justify="left")
    if sweep:
        table.add_column("point", justify="right")
    table.add_column("metric", style="bold")
    table.add_column(f"A {a.name}", justify="right")
    table.add_column(f"B {b.name}", justify="right")
    table.add_column("B/A", justify="right")
    table.add_column("")
    for row in rows:
        ratio = f"{row.ratio:.3f}" if row.ratio is not None else "-"
        flag = Text("REGRESSION", style="bold red") if row.regressed else Text("")
        cells: list[str | Text] = [row.metric, _value(row.a), _value(row.b), ratio, flag]
        if sweep:
            cells.insert(0, f"{row.point:,g}" if row.point is not None else "")
        table.add_row(*cells)
    return table


@click.command()
@click.argument("a", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("b", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--threshold",
    type=FiniteFloatRange(min=0),
    default=0.1,
    show_default=True,
    help="Flag a metric worse in B by more than this fraction (0.1: 10%).",
)
def compare(a: Path, b: Path, threshold: float) -> None:
    """Compare two `corral bench --json` records (A the baseline, B the candidate);
    exit 1 if B regressed on any metric past --threshold."""
    first, second = _read(a), _read(b)
    if isinstance(first, SweepReport) and isinstance(second, SweepReport):
        rows = compare_sweeps(first, second, threshold=threshold)
    elif isinstance(first, LoadReport) and isinstance(second, LoadReport):
        rows = compare_reports(first, second, threshold=threshold)
    else:
        raise CliError(f"{a} and {b} are not both a run's report or both a sweep's")
    if not rows:
        raise CliError(f"{a} and {b} have no metric in common")
    out = Console(highlight=False, markup=False, emoji=False)
    out.print(_table(rows, a, b, threshold))
    regressed = [row for row in rows if row.regressed]
    if regressed:
        names = ", ".join(
            row.metric + (f" at {row.point:g}" if row.point is not None else "")
            for row in regressed[:5]
        )
        more = f" and {len(regressed) - 5} more" if len(regressed) > 5 else ""
        raise RegressionError(f"{len(regressed)} regression(s) past {threshold:.0%}: {names}{more}")
    out.print(f"no regression past {threshold:.0%} ({len(rows)} metrics)")
