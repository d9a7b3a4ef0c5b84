"""``corral bench``: host N agents for T turns on the embedded store and report.

The load itself is :func:`runtime.load.run_bench`; this module adds the flags, the live
progress display (rich ``Live`` on a terminal, a plain line every few seconds
otherwise), the final table, ``--json``, ``--plot`` and the ``--fresh`` wipe.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, cast

import click
import msgspec
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from actors import Model
from runtime.load import LoadProgress, LoadReport, LoadSamples, LoadSpec, run_bench
from storage import Durability, SchemaVersionError, StorageError, Store

from .errors import CliError, InvariantsError
from .options import (
    STORE_FILES,
    FiniteFloatRange,
    NewFilePath,
    durability_option,
    refuse_store_file,
    store_option,
    threads_option,
)
from .transcript import plural, shown

__all__ = ["bench", "wipe_store"]

_PLAIN_EVERY_S: Final = 2.0


def wipe_store(path: Path) -> None:
    """Delete the corral store at ``path`` (its files; the directory stays).

    Refuses anything that is not clearly a corral store: a file, a directory holding other
    files, an LMDB environment that is not a store, or a store another process has open
    for writing. A missing or empty directory is left as it is."""
    if not path.exists():
        return
    if not path.is_dir():
        raise CliError(f"--fresh refuses to wipe {path}: it is not a directory")
    names = {entry.name for entry in path.iterdir()}
    if not names:
        return
    strangers = sorted(names - STORE_FILES)
    if strangers or "data.mdb" not in names:
        shown = ", ".join(strangers[:3]) or "no data.mdb"
        raise CliError(f"--fresh refuses to wipe {path}: it is not a corral store ({shown})")
    try:
        Store.open(path, durability="none").close()  # takes the writer lock: nobody writes
    except SchemaVersionError:
        pass  # a corral store of another version, and nobody held its writer lock
    except StorageError as err:
        raise CliError(f"--fresh refuses to wipe {path}: {err}") from err
    for name in names:
        (path / name).unlink()


class _Display:
    """Live progress on a terminal; a plain line every few seconds otherwise."""

    def __init__(self, console: Console, *, quiet: bool, title: str) -> None:
        self.console = console
        self.quiet = quiet
        self.title = title
        self.live: Live | None = None
        self._last_plain = time.monotonic()

    def __enter__(self) -> _Display:
        if not self.quiet and self.console.is_terminal:
            self.live = Live(
                self._render(None), console=self.console, refresh_per_second=4, transient=True
            )
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def _render(self, p: LoadProgress | None) -> Group:
        if p is None:
            return Group(Text(f"{self.title}: spawning agents...", style="bold"))
        bar = ProgressBar(total=p.turns_total, completed=p.turns_done, width=40)
        line = Text.assemble(
            (f"{p.turns_done:,}/{p.turns_total:,} turns", "bold"),
            f"  {p.turns_per_s:,.0f} turns/s  p99 {p.p99_ms:,.0f} ms  "
            f"errored {p.errored:,}  RSS {p.rss_mb:,.0f} MB  {p.elapsed_s:,.1f} s",
        )
        return Group(Text(self.title, style="bold"), bar, line)

    def phase(self, what: str) -> None:
        if self.quiet:
            return
        if self.live is not None:
            self.live.update(Group(Text(self.title, style="bold"), Text(f"{what}...")))
        else:
            self.console.print(Text(f"bench: {what}..."))

    def update(self, p: LoadProgress) -> None:
        if self.quiet:
            return
        if self.live is not None:
            self.live.update(self._render(p))
            return
        now = time.monotonic()
        if now - self._last_plain >= _PLAIN_EVERY_S:
            self._last_plain = now
            self.console.print(
                f"bench: {p.turns_done:,}/{p.turns_total:,} turns  {p.turns_per_s:,.0f} turns/s  "
                f"p99 {p.p99_ms:,.0f} ms  errored {p.errored:,}  RSS {p.rss_mb:,.0f} MB",
                highlight=False,
            )


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.1f} {unit}" if unit != "B" else f"{n:,} B"
        size /= 1024
    return f"{n:,} B"


def render_table(r: LoadReport) -> Table:
    """The final table of a run."""
    table = Table(show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    lat = r.latency_ms
    rows = [
        ("turns/s", f"{r.turns_per_s:,.0f}"),
        ("durable events/s", f"{r.events_per_s:,.0f}  ({r.events:,} events)"),
        ("turn latency p50", f"{lat.p50:,.1f} ms"),
        ("turn latency p95", f"{lat.p95:,.1f} ms"),
        ("turn latency p99", f"{lat.p99:,.1f} ms"),
        ("settled", f"{r.settled:,} / {r.agents * r.turns:,}"),
        ("errored", f"{r.errored:,}"),
        ("retried", f"{r.retried:,}"),
        ("RSS peak", f"{r.rss_peak_mb:,.1f} MB"),
        ("log size on disk", _size(r.log_bytes)),
        ("spawn time", f"{r.spawn_s:,.2f} s"),
        ("turns wall time", f"{r.wall_s:,.2f} s"),  # turns/s is settled / this
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


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


def _check_plot_support() -> None:
    try:
        _matplotlib()
    except ImportError as err:
        raise CliError(
            "--plot needs matplotlib, which is not installed: pip install 'corral[plot]'"
        ) from err


def write_plot(path: Path, report: LoadReport, samples: LoadSamples) -> None:
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
    fig.suptitle(f"{_load(report.agents, report.turns)}, {report.durability}")
    fig.tight_layout()
    fig.savefig(path, dpi=100, format=_plot_format(path))
    plt.close(fig)


def _resolve(model: str) -> Model:
    from runtime.providers.resolve import resolve_model  # noqa: PLC0415 - optional vendor SDKs

    return resolve_model(model)


@click.command()
@click.option(
    "--agents", type=click.IntRange(min=1), default=1000, show_default=True, help="Agents to host."
)
@click.option(
    "--turns",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Turns per agent (follow-ups sent one after the other).",
)
@store_option
@click.option("--fresh", is_flag=True, help="Wipe the store first (only a corral store).")
@durability_option
@threads_option
@click.option(
    "--latency",
    type=FiniteFloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Scripted model latency per request, seconds.",
)
@click.option(
    "--latency-jitter",
    type=FiniteFloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Uniform spread around --latency, seconds.",
)
@click.option(
    "--chunks",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Streamed chunks per reply.",
)
@click.option(
    "--tool-calls",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Calls of a cheap concurrency-safe tool per turn.",
)
@click.option(
    "--failure-rate",
    type=FiniteFloatRange(min=0, max=1, max_open=True),
    default=0.0,
    show_default=True,
    help="Fraction of model requests failing with SERVER (retried).",
)
@click.option(
    "--model",
    "model_spec",
    metavar="STRING",
    default=None,
    help="A real model string (e.g. openai:gpt-4.1-mini) instead of ScriptedModel.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the scripted model.")
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Give up after this many seconds (spawning included).",
)
@click.option(
    "--json",
    "json_path",
    type=NewFilePath(),
    help="Write the report as JSON.",
)
@click.option(
    "--plot",
    "plot_path",
    type=PlotPath(),
    help="Write a PNG, or the image format of its suffix (needs corral[plot]).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress display.")
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    default=None,
    help="Run the load in N shard processes on Ray (corral[ray]; docs/cluster.md).",
)
@click.option(
    "--address",
    metavar="ADDR",
    default=None,
    help="With --shards: a running Ray cluster's address (default: a local Ray).",
)
def bench(
    *,
    agents: int,
    turns: int,
    store: Path,
    fresh: bool,
    durability: str,
    threads: int | None,
    latency: float,
    latency_jitter: float,
    chunks: int,
    tool_calls: int,
    failure_rate: float,
    model_spec: str | None,
    seed: int,
    timeout: float,
    json_path: Path | None,
    plot_path: Path | None,
    quiet: bool,
    shards: int | None,
    address: str | None,
) -> None:
    """Host N agents for T turns each and report throughput, latency and memory."""
    if json_path is not None:  # before the run, which may make the store there
        refuse_store_file(json_path, store, "json_path")
    if plot_path is not None:
        refuse_store_file(plot_path, store, "plot_path")
        _check_plot_support()
    if address is not None and shards is None:
        raise click.UsageError("--address goes with --shards")
    model = _resolve(model_spec) if model_spec and shards is None else None
    spec = LoadSpec(
        agents=agents,
        turns=turns,
        latency_s=latency,
        jitter_s=latency_jitter,
        chunks=chunks,
        tool_calls=tool_calls,
        failure_rate=failure_rate,
        seed=seed,
        timeout_s=timeout,
    )
    if fresh:
        wipe_store(store)
    out, err = _plain_console(), _plain_console(stderr=True)
    title = f"corral bench: {_load(agents, turns)} ({durability})"
    with _Display(err, quiet=quiet, title=title) as display:
        run = run_bench if shards is None else _sharded(shards, address, model_spec)
        report, samples = run(
            store,
            spec,
            durability=cast(Durability, durability),
            threads=threads,
            model=model,
            on_progress=display.update,
            on_phase=display.phase,
            interval_s=0.25 if display.live else 0.5,
        )
    # two lines, each within 80 columns (rich wraps a pipe's output there) but a long model
    out.print(
        Text(f"corral bench: {_load(report.agents, report.turns)}, {report.durability}", "bold")
    )
    out.print(
        Text(f"{_threads(report.threads, report.standby)}, model {report.model}", "bold"),
        soft_wrap=True,
    )
    out.print(render_table(report))
    if json_path is not None:
        json_path.write_bytes(msgspec.json.format(msgspec.json.encode(report)) + b"\n")
    if plot_path is not None:
        write_plot(plot_path, report, samples)
    _finish(out, report)


def _finish(out: Console, report: LoadReport) -> None:
    if report.invariants_ok:
        out.print(f"invariants: {plural(report.sessions_checked or 0, 'session')} OK")
    else:
        for line in report.violations[:20]:
            out.print(Text(f"  {shown(line)}"))
        more = len(report.violations) - 20
        if more > 0:
            out.print(f"  ... and {more} more (see `corral log check`)")
    if report.timed_out:
        raise CliError(
            f"timed out: {report.settled:,} of {report.agents * report.turns:,} turns settled "
            "within --timeout"
        )
    if not report.invariants_ok:
        raise InvariantsError(
            f"invariants: {plural(len(report.violations), 'violation')} over "
            f"{plural(report.sessions_checked or 0, 'session')}"
        )


def _sharded(shards: int, address: str | None, model: str | None) -> Callable[..., Any]:
    """``run_bench``'s twin that runs the load inside ``shards`` shards on Ray."""
    from runtime.cluster.bench import sharded_bench_runner  # noqa: PLC0415 - optional extra

    return sharded_bench_runner(shards, address, model)


def _plain_console(*, stderr: bool = False) -> Console:
    """A console printing text as it is: a model string or a violation may hold brackets
    and colons, never markup or emoji codes (styled parts are rich ``Text``)."""
    return Console(stderr=stderr, highlight=False, markup=False, emoji=False)


def _load(agents: int, turns: int) -> str:
    """``1 agent x 1 turn``, ``1,000 agents x 10 turns``."""
    return f"{plural(agents, 'agent')} x {plural(turns, 'turn')}"


def _threads(workers: int, standby: int) -> str:
    """``1 thread + 1 standby``, ``2 threads``."""
    text = f"{workers} thread{'s' if workers != 1 else ''}"
    return f"{text} + {standby} standby" if standby else text
