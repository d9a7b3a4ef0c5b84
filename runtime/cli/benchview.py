"""What ``corral bench`` shows: the live progress (rich ``Live`` on a terminal, a plain
line every few seconds otherwise) and the final tables (the run, its failures by code,
where the time went, a sweep's points)."""

from __future__ import annotations

import time
from typing import Final

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from runtime.load import Breakdown, FailureCount, LoadProgress, LoadReport, SweepReport

from .transcript import shown

__all__ = [
    "Display",
    "breakdown_table",
    "failures_table",
    "render_table",
    "size",
    "sweep_table",
]

_PLAIN_EVERY_S: Final = 2.0
_EXAMPLE_COLUMNS: Final = 60
_OLDEST_SHOWN_S: Final = 5.0


def _failures_line(p: LoadProgress) -> str:
    parts = [f"{code} {n:,}" for code, n, _example in p.failures]
    return "failures: " + ", ".join(parts) if parts else ""


def _oldest(p: LoadProgress) -> str:
    """How long the oldest turn in flight has waited, once that is long enough to say."""
    if p.in_flight and p.oldest_s >= _OLDEST_SHOWN_S:
        return f"  oldest waiting {p.oldest_s:,.0f} s"
    return ""


class Display:
    """Live progress on a terminal; a plain line every few seconds otherwise."""

    def __init__(self, console: Console, *, quiet: bool, title: str) -> None:
        self.console = console
        self.quiet = quiet
        self.title = title
        self.live: Live | None = None
        self._last_plain = time.monotonic()
        self._codes_shown: set[str] = set()  # failure codes whose example was printed

    def __enter__(self) -> Display:
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
        bar = ProgressBar(total=max(1, p.turns_total), completed=p.turns_done, width=40)
        line = Text.assemble(
            (f"{p.turns_done:,}/{p.turns_total:,} turns", "bold"),
            f"  {p.turns_per_s:,.0f} turns/s  p99 {p.p99_ms:,.0f} ms  in flight "
            f"{p.in_flight:,}  errored {p.errored:,}  retried {p.retried:,}"
            + (f"  shed {p.shed:,}" if p.shed else "")
            + _oldest(p)
            + f"  RSS {p.rss_mb:,.0f} MB  {p.elapsed_s:,.1f} s",
        )
        rows: list[Text | ProgressBar] = [Text(self.title, style="bold"), bar, line]
        for code, n, example in p.failures[:4]:
            rows.append(Text(f"  {code} x{n:,}: {shown(example)[:100]}", style="red"))
        return Group(*rows)

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
        for code, _n, example in p.failures:  # each code's first message, once, at once
            if code not in self._codes_shown:
                self._codes_shown.add(code)
                self.console.print(Text(f"bench: first {code} failure: {shown(example)}"))
        now = time.monotonic()
        if now - self._last_plain >= _PLAIN_EVERY_S:
            self._last_plain = now
            failures = _failures_line(p)
            self.console.print(
                f"bench: {p.turns_done:,}/{p.turns_total:,} turns  {p.turns_per_s:,.0f} turns/s  "
                f"p99 {p.p99_ms:,.0f} ms  in flight {p.in_flight:,}  errored {p.errored:,}  "
                f"retried {p.retried:,}" + _oldest(p) + (f"  {failures}" if failures else ""),
                highlight=False,
            )


def size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.1f} {unit}" if unit != "B" else f"{n:,} B"
        value /= 1024
    return f"{n:,} B"


def render_table(r: LoadReport) -> Table:
    """The final table of a run."""
    table = Table(show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    lat = r.latency_ms
    total = r.turns_total or r.agents * r.turns
    rows = [
        ("turns/s", f"{r.turns_per_s:,.0f}"),
        ("durable events/s", f"{r.events_per_s:,.0f}  ({r.events:,} events)"),
        ("turn latency p50", f"{lat.p50:,.1f} ms"),
        ("turn latency p95", f"{lat.p95:,.1f} ms"),
        ("turn latency p99", f"{lat.p99:,.1f} ms"),
        ("settled", f"{r.settled:,} / {total:,}"),
        ("errored", f"{r.errored:,}" + (f"  ({r.error_rate:.2%})" if r.errored else "")),
        ("retried", f"{r.retried:,}"),
    ]
    if r.in_flight:
        rows.append(("in flight at the end", f"{r.in_flight:,}"))
    loop = r.open_loop
    if loop is not None:
        rows += [
            ("offered rate", f"{loop.offered_rate:,.1f}/s  ({loop.arrivals:,} arrivals)"),
            ("achieved rate", f"{loop.achieved_rate:,.1f}/s"),
            ("shed", f"{loop.shed:,}  (queue limit {loop.queue_limit:,})"),
            ("queue wait p50 / p99", f"{loop.queue_ms.p50:,.1f} / {loop.queue_ms.p99:,.1f} ms"),
        ]
    rows += [
        ("RSS peak", f"{r.rss_peak_mb:,.1f} MB"),
        ("log size on disk", size(r.log_bytes)),
        ("spawn time", f"{r.spawn_s:,.2f} s"),
        ("turns wall time", f"{r.wall_s:,.2f} s"),  # turns/s is settled / this
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def failures_table(failures: list[FailureCount]) -> Table:
    """Failed requests by code: how many, how many ended their turn, one message."""
    table = Table(title="failed model requests", title_justify="left")
    table.add_column("code", style="bold red")
    table.add_column("requests", justify="right")
    table.add_column("turns ended", justify="right")
    table.add_column("example", overflow="fold", max_width=_EXAMPLE_COLUMNS)
    for f in failures:
        table.add_row(f.code, f"{f.requests:,}", f"{f.turns:,}", Text(shown(f.example)))
    return table


def breakdown_table(b: Breakdown) -> Table:
    """Where a turn's time went: each part's p50/p95/p99 (ms)."""
    table = Table(title=f"where the time went ({b.turns:,} turns, ms)", title_justify="left")
    table.add_column("part", style="bold")
    for pct in ("p50", "p95", "p99", "mean"):
        table.add_column(pct, justify="right")
    rows = [
        ("queue (inbox)", b.queue),
        ("hooks / listeners", b.hooks),
        ("time to first chunk", b.ttft),
        ("model (incl. ttft)", b.model),
        ("tools", b.tool),
        ("engine", b.engine),
        ("retry back-off", b.retry),
    ]
    if b.commit is not None:  # a live run's: its turns end at agent/settled
        rows.append(("durable commit", b.commit))
    rows.append(("turn (to settled)" if b.commit is not None else "turn (logged)", b.wall))
    for name, s in rows:
        table.add_row(name, f"{s.p50:,.1f}", f"{s.p95:,.1f}", f"{s.p99:,.1f}", f"{s.mean:,.1f}")
    return table


def sweep_table(sweep: SweepReport) -> Table:
    """A sweep's points: throughput and latency against the swept value."""
    table = Table(title=f"sweep over {sweep.swept}", title_justify="left")
    table.add_column(sweep.swept, justify="right", style="bold")
    for name in ("turns/s", "p50 ms", "p99 ms", "errored", "shed", ""):
        table.add_column(name, justify="right")
    for point in sweep.points:
        r = point.report
        shed = f"{r.open_loop.shed:,}" if r.open_loop is not None else "-"
        mark = "knee" if sweep.knee is not None and point.value == sweep.knee else ""
        table.add_row(
            f"{point.value:,g}",
            f"{r.turns_per_s:,.0f}",
            f"{r.latency_ms.p50:,.1f}",
            f"{r.latency_ms.p99:,.1f}",
            f"{r.errored:,}",
            shed,
            mark,
        )
    return table
