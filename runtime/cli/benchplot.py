"""``corral bench --plot``'s pictures (matplotlib, the optional ``corral[plot]`` extra):
a run's throughput over time and latency histogram; a sweep's throughput and p50/p99
against the swept value, with the knee marked."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Final

import click

from runtime.load import LoadReport, LoadSamples, SweepReport

from .errors import CliError
from .options import NewFilePath

__all__ = ["PlotPath", "check_plot_support", "write_plot", "write_sweep_plot"]


def _matplotlib(module: str = "matplotlib") -> Any:
    """Import the optional ``corral[plot]`` extra (untyped, hence ``Any``)."""
    return importlib.import_module(module)


# matplotlib's own formats (``FigureCanvasBase.filetypes``), for when it is not installed
_PLOT_FORMATS: Final = frozenset(
    {"eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff"}
    | {"webp"}
)


def _plot_formats() -> frozenset[str]:
    """The image formats ``savefig`` writes: matplotlib's list when it is installed."""
    try:
        backend_bases = _matplotlib("matplotlib.backend_bases")
    except ImportError:
        return _PLOT_FORMATS
    return frozenset(backend_bases.FigureCanvasBase.get_supported_filetypes())


def _plot_format(path: Path) -> str:
    """The format named by ``path``'s suffix; ``png`` without one."""
    return path.suffix[1:].lower() or "png"


class PlotPath(NewFilePath):
    """``--plot``'s file: also refused up front if its suffix names a format matplotlib
    does not write (``out.mdb``)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        fmt = _plot_format(Path(path))
        formats = _plot_formats()
        if fmt not in formats:
            shown = ", ".join(f".{name}" for name in sorted(formats))
            self.fail(
                f"matplotlib does not write .{fmt} files (it writes {shown}; no suffix: png).",
                param,
                ctx,
            )
        return path


def check_plot_support() -> None:
    try:
        _matplotlib()
    except ImportError as err:
        raise CliError(
            "--plot needs matplotlib, which is not installed: pip install 'corral[plot]'"
        ) from err


def write_plot(path: Path, report: LoadReport, samples: LoadSamples, title: str) -> None:
    """A PNG: throughput over time (left) and the turn latency histogram (right)."""
    _matplotlib().use("Agg")
    plt = _matplotlib("matplotlib.pyplot")

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    span = max(samples.settled_s, default=0.0) or 1.0
    bins = max(10, min(100, len(samples.settled_s) // 20))
    width = span / bins
    counts = [0] * bins
    for t in samples.settled_s:
        counts[min(bins - 1, int(t / width))] += 1
    left.plot([(i + 0.5) * width for i in range(bins)], [c / width for c in counts])
    left.set(title="throughput", xlabel="seconds since the first follow-up", ylabel="turns/s")
    left.set_ylim(bottom=0)
    right.hist(samples.latencies_ms, bins=50)
    right.set(title="turn latency", xlabel="ms", ylabel="turns")
    for pct, value in (("p50", report.latency_ms.p50), ("p99", report.latency_ms.p99)):
        right.axvline(value, linestyle="--", color="black", linewidth=0.8)
        right.annotate(
            pct,
            (value, 1),
            xycoords=("data", "axes fraction"),
            xytext=(2, -12),
            textcoords="offset points",
        )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format=_plot_format(path))
    plt.close(fig)


def write_sweep_plot(path: Path, sweep: SweepReport, title: str) -> None:
    """One picture, two curves against the swept value: throughput (left axis) and the
    turn latency p50/p99 (right axis); the knee a dashed vertical line."""
    _matplotlib().use("Agg")
    plt = _matplotlib("matplotlib.pyplot")

    xs = [p.value for p in sweep.points]
    fig, left = plt.subplots(figsize=(8, 4.5))
    right = left.twinx()
    left.plot(xs, [p.report.turns_per_s for p in sweep.points], "o-", color="tab:blue")
    left.set_ylabel("throughput, turns/s", color="tab:blue")
    left.set_ylim(bottom=0)
    right.plot(xs, [p.report.latency_ms.p50 for p in sweep.points], "s--", color="tab:orange")
    right.plot(xs, [p.report.latency_ms.p99 for p in sweep.points], "^-", color="tab:red")
    right.set_ylabel("turn latency, ms (p50 dashed, p99 solid)", color="tab:red")
    right.set_ylim(bottom=0)
    if len(xs) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 20:
        left.set_xscale("log")
    left.set_xlabel("agents" if sweep.swept == "agents" else "offered rate, arrivals/s")
    if sweep.knee is not None:
        left.axvline(sweep.knee, linestyle=":", color="black", linewidth=1)
        left.annotate(
            f"knee {sweep.knee:g}",
            (sweep.knee, 1),
            xycoords=("data", "axes fraction"),
            xytext=(4, -14),
            textcoords="offset points",
        )
    left.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format=_plot_format(path))
    plt.close(fig)
