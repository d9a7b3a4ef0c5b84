"""``corral log``: read, follow, export, import and check session logs.

Read commands open the store read-only (``Store.open(path, readonly=True)``), so they
work while another process's runtime is writing: every read is a short LMDB read
transaction that never blocks the writer. Only ``import`` opens the store writable.

The CLI registers no plugin event type: a record of an ignorable type (a plugin's)
is shown, followed and checked as a placeholder of its type, seq and time (see
:class:`storage.events.IgnoredRecord`); ``--raw`` prints it as it is stored.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from operator import attrgetter
from pathlib import Path
from typing import BinaryIO, Final

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from runtime.cluster.layout import stores_for
from runtime.load import StoreCheck, check_store, latency_of, store_bytes
from storage import (
    SCHEMA_VERSION,
    DuplicateSessionError,
    Event,
    IgnoredRecord,
    InvalidSessionIdError,
    Store,
    UnknownSessionError,
    check_session_id,
)

from .benchview import breakdown_table
from .errors import CliError, InvariantsError
from .listing import SORT_KEYS, STATES, SessionSummary, parse_time, summarize
from .options import (
    STORE_FILES,
    FiniteFloatRange,
    group_store_option,
    inherited_store_option,
    refuse_store_file,
)
from .reading import reading, reading_session
from .transcript import plural, safe_json, shown, summary, transcript

__all__ = ["log"]

_TAIL_WINDOW: Final = 64


def _out() -> Console:
    """Plain output: ids, paths and logged text hold brackets and colons, never markup
    or emoji codes (styled parts are rich ``Text``)."""
    return Console(highlight=False, soft_wrap=True, markup=False, emoji=False)


def _require(store: Store, session_id: str) -> int:
    """The durable event count of ``session_id``; a clear error if there is no such session."""
    try:
        return store.stats(session_id).event_count
    except UnknownSessionError as err:
        raise CliError(
            f"no session {session_id!r} in the store at {store.path} (`corral log ls` lists them)"
        ) from err


class _Counter(io.RawIOBase):
    """A write-only sink that only counts bytes."""

    def __init__(self) -> None:
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.count += len(data)
        return len(data)


def _created(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


@click.group(name="log")
@group_store_option
def log(store: Path) -> None:
    """Read, follow, export, import and check session logs.

    A SESSION argument may be any unique prefix of a session id."""




@log.command(name="ls")
@inherited_store_option
@click.option("-n", "--limit", type=click.IntRange(min=0), default=None, help="Show at most N.")
@click.option(
    "--state",
    "states",
    type=click.Choice(STATES),
    multiple=True,
    help="Only sessions in this state (repeatable): open (a turn is open), idle, new.",
)
@click.option(
    "--outcome",
    "outcomes",
    multiple=True,
    metavar="KIND",
    help="Only sessions whose last turn ended so: completed, error, aborted, blocked, "
    "max-tokens, interrupted, limit (repeatable).",
)
@click.option("--since", metavar="TIME", help="Only sessions active since TIME (10m, 2h, 3d, ISO).")
@click.option("--until", metavar="TIME", help="Only sessions created before TIME.")
@click.option(
    "--sort",
    type=click.Choice(SORT_KEYS),
    default="created",
    show_default=True,
    help="Order (created streams rows as they are read; the others read every session first).",
)
@click.option("-r", "--reverse", is_flag=True, help="Reverse the order (newest, largest first).")
@click.option("--bytes", "with_bytes", is_flag=True, help="Also each session's export size (slow).")
def ls(
    *,
    store: Path,
    limit: int | None,
    states: tuple[str, ...],
    outcomes: tuple[str, ...],
    since: str | None,
    until: str | None,
    sort: str,
    reverse: bool,
    with_bytes: bool,
) -> None:
    """List sessions: created, turns (retries apart), last turn, state, events.

    A turn counts as a user reads it: the message's turn with any retry turns it took."""
    now = int(time.time() * 1000)
    try:
        since_ms = None if since is None else parse_time(since, now)
        until_ms = None if until is None else parse_time(until, now)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(reading(path)) for path in stores_for(store)]
        pairs = [(st, header) for st in opened for header in st.sessions()]  # shards too
        total = len(pairs)
        if until_ms is not None:
            pairs = [(st, h) for st, h in pairs if h.created < until_ms]
        if reverse and sort == "created":
            pairs.reverse()
        width = max([len("session")] + [len(shown(h.id)) for _, h in pairs])
        out = sys.stdout
        line = f"{'session':<{width}}  {'created':<19}  {'turns':>7}  {'retries':>7}  "
        line += f"{'last turn':<11}  {'state':<10}  {'events':>9}"
        out.write(line + ("  " + f"{'bytes':>11}" if with_bytes else "") + "\n")
        out.flush()

        def wanted(item: SessionSummary) -> bool:
            return (
                (not states or item.state in states)
                and (not outcomes or item.outcome in outcomes)
                and (since_ms is None or item.active >= since_ms)
            )

        read = ((st, summarize(st, header)) for st, header in pairs)
        rows: Iterator[tuple[Store, SessionSummary]] = (r for r in read if wanted(r[1]))
        if sort != "created":
            key = attrgetter(sort)
            rows = iter(sorted(rows, key=lambda r: key(r[1]), reverse=reverse))
        shown_count = 0
        for st, item in rows:
            if limit is not None and shown_count >= limit:
                break
            shown_count += 1
            out.write(_row(st, item, width, with_bytes) + "\n")
            if shown_count <= 100 or shown_count % 1000 == 0:
                out.flush()  # the first rows at once, then in big writes
    if shown_count == total:
        _out().print(Text(f"{total:,} session(s) in {store}"))
    else:
        _out().print(Text(f"{shown_count:,} of {total:,} session(s) in {store}"))


def _row(st: Store, item: SessionSummary, width: int, with_bytes: bool) -> str:
    unreadable = item.state == "unreadable"  # `log check` says why
    turns = "?" if unreadable else f"{item.turns:,}"
    retries = "?" if unreadable else f"{item.retries:,}"
    cells = (
        f"{shown(item.id):<{width}}  {_created(item.created):<19}  {turns:>7}  "
        f"{retries:>7}  {item.outcome:<11}  {item.state:<10}  "
        f"{item.events:>9,}"
    )
    if with_bytes:
        counter = _Counter()
        st.export_jsonl(item.id, counter)  # type: ignore[arg-type]
        cells += f"  {counter.count:>11,}"
    if item.parent is not None:
        cells += f"  (fork of {shown(item.parent)})"
    return cells


@log.command()
@click.argument("session")
@inherited_store_option
@click.option("--raw", is_flag=True, help="Print the stored events as JSON lines.")
@click.option("-v", "--verbose", is_flag=True, help="Also show chunks, inbox and request facts.")
def show(session: str, store: Path, raw: bool, verbose: bool) -> None:
    """Print a session as a readable transcript (or its raw events)."""
    with reading_session(store, session) as (st, session_id):
        count = _require(st, session_id)
        if raw:
            _write_records(st, session_id, sys.stdout.buffer)
            return
        events = st.read(session_id, include_ignored=True)
        header = next((h for h in st.sessions() if h.id == session_id), None)
    out = _out()
    created = f"  created {_created(header.created)}" if header is not None else ""
    out.print(Text(f"session {shown(session_id)}{created}  {count:,} events", style="bold"))
    for line in transcript(events, verbose=verbose):
        out.print(line)


def _write_records(st: Store, session: str, out: BinaryIO) -> None:
    """The stored record lines of a session, without the export header line (DEL and C1
    controls escaped: the same JSON, safe for a terminal)."""
    buffer = io.BytesIO()
    st.export_jsonl(session, buffer)
    data = buffer.getvalue()
    out.write(safe_json(data[data.index(b"\n") + 1 :].decode()).encode())
    out.flush()


def _print_events(out: Console, events: list[Event], raw: bool) -> None:
    for event in events:
        if raw and type(event.data) is IgnoredRecord:  # not decoded: the stored record
            out.file.write(safe_json(event.data.raw.decode()) + "\n")
        elif raw:
            import msgspec  # noqa: PLC0415 - only for --raw

            out.file.write(safe_json(msgspec.json.encode(event).decode()) + "\n")
        else:
            out.print(summary(event))
    out.file.flush()


@log.command()
@click.argument("session")
@inherited_store_option
@click.option(
    "-n",
    "--lines",
    "count",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Events to print from the end.",
)
@click.option(
    "-f",
    "--follow/--no-follow",
    default=False,
    help="Keep printing events as they are appended (Ctrl-C ends).",
)
@click.option(
    "--interval",
    type=FiniteFloatRange(min=0.01, max=3600),
    default=0.2,
    show_default=True,
    help="Seconds between polls with --follow.",
)
@click.option("--raw", is_flag=True, help="Print events as JSON lines.")
def tail(
    *, session: str, store: Path, count: int, follow: bool, interval: float, raw: bool
) -> None:
    """Print the last events of a session; with --follow, keep printing new ones."""
    out = _out()
    with reading_session(store, session) as (st, session_id):
        total = _require(st, session_id)
        lower = max(0, total - count)
        if not follow:
            events = st.read(session_id, lower=lower, include_ignored=True) if count else []
            _print_events(out, events, raw)
            return
        try:
            next_seq = lower if count else total
            while True:
                events = st.read(session_id, lower=next_seq, include_ignored=True)
                if events:
                    _print_events(out, events, raw)
                    next_seq = events[-1].seq + 1
                time.sleep(interval)
        except KeyboardInterrupt:
            return  # Ctrl-C is how following ends, from its first line on: exit 0


@log.command()
@click.argument("session")
@inherited_store_option
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    default="-",
    help="Write to FILE instead of stdout.",
)
def export(session: str, store: Path, output: Path) -> None:
    """Export a session as JSONL (a header line, then every stored record)."""
    to_stdout = str(output) == "-"
    if not to_stdout:
        refuse_store_file(output, store, "output")
    with reading_session(store, session) as (st, session_id):
        _require(st, session_id)
        if to_stdout:
            written = st.export_jsonl(session_id, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            return
        # owner-only, like the store it comes from (a log may hold private content)
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            written = st.export_jsonl(session_id, fh)
    click.echo(f"exported {written:,} events of {shown(session_id)} to {output}", err=True)


def _new_session_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--session-id``, checked before anything is opened (a usage error, exit 2)."""
    if value is None:
        return None
    if not value:
        raise click.BadParameter(
            "a session id must not be empty: leave --session-id out to keep the export's id."
        )
    try:
        return check_session_id(value)
    except InvalidSessionIdError as err:
        raise click.BadParameter(str(err)) from err


@log.command(name="import")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False, allow_dash=True))
@inherited_store_option
@click.option(
    "--session-id",
    default=None,
    callback=_new_session_id,
    help="Import under this id (default: the export's).",
)
def import_(file: Path, store: Path, session_id: str | None) -> None:
    """Import a JSONL export as a new session (every line is validated first)."""
    new_dirs = _missing_dirs(store)
    new_store = not (store / "data.mdb").exists()
    imported = False
    try:
        with contextlib.ExitStack() as stack:
            source: BinaryIO = (
                sys.stdin.buffer if str(file) == "-" else stack.enter_context(file.open("rb"))
            )
            st = stack.enter_context(Store.open(store))  # after the file opened
            try:
                session = st.import_jsonl(source, session_id=session_id)
            except DuplicateSessionError as err:
                raise CliError(f"{err}; give another id with --session-id") from err
            imported = True
            st.flush()
    except BaseException:
        if new_store and not imported:
            _remove_new_store(store, new_dirs)
        raise
    click.echo(f"imported {session.last_seq + 1:,} events as session {session.id}")


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, deepest first."""
    missing: list[Path] = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _remove_new_store(path: Path, new_dirs: list[Path]) -> None:
    """Undo what a failed import created: the store's files (if it holds no session)
    and the directories that did not exist before it."""
    if (path / "data.mdb").exists():
        try:
            with Store.open(path, readonly=True) as st:
                if st.sessions():
                    return
        except Exception:  # noqa: BLE001 - unreadable: not ours to delete
            return
        for name in STORE_FILES:
            (path / name).unlink(missing_ok=True)
    for directory in new_dirs:
        try:
            directory.rmdir()
        except OSError:  # not empty (not only ours) or gone
            return


@log.command()
@inherited_store_option
@click.option(
    "--allow-open-tail",
    is_flag=True,
    help="Accept logs that end inside a turn (e.g. a runtime is still writing).",
)
def check(store: Path, allow_open_tail: bool) -> None:
    """Check every session log against the session invariants."""
    checks = []
    for path in stores_for(store):  # one, or a cluster's shard stores
        with reading(path) as st:
            checks.append(check_store(st, allow_open_tail=allow_open_tail))
    result = StoreCheck(
        sum(c.sessions for c in checks),
        [failed for c in checks for failed in c.failed],
        dict(sorted(sum((Counter(c.ignored) for c in checks), Counter()).items())),
    )
    out = _out()
    if result.ignored:  # a plugin's records: their seqs are checked, nothing else
        kinds = ", ".join(f"{shown(name)} ({count:,})" for name, count in result.ignored.items())
        out.print(
            Text(f"records of ignorable types not known here, checked for their seq only: {kinds}")
        )
    if result.ok:
        out.print(f"invariants: {plural(result.sessions, 'session')} OK")
        return
    for failed in result.failed:
        out.print(Text(f"{shown(failed.session_id)}:"))
        for violation in failed.violations:
            out.print(Text(f"  {shown(violation)}"))  # may quote a logged record
    raise InvariantsError(
        f"invariants: {len(result.failed):,} of {result.sessions:,} sessions break the session "
        "invariants"
    )


@log.command()
@inherited_store_option
@click.option(
    "--latency",
    is_flag=True,
    help="Also where the turns' time went (queue, hooks, model, tools...), from the logs.",
)
def stats(store: Path, latency: bool) -> None:
    """Store statistics: sessions, events, bytes, map size."""
    with reading(store) as st:
        statistics = st.statistics()
        events = sum(st.stats(h.id).event_count for h in st.sessions())
        turns = latency_of(st) if latency else None
    data = store / "data.mdb"
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("store", Text(f"{store} (schema version {SCHEMA_VERSION})"))
    table.add_row("sessions", f"{statistics.sessions:,}")
    table.add_row("events", f"{events:,}")
    table.add_row("bytes on disk", f"{store_bytes(store):,}")
    table.add_row("data file", f"{data.stat().st_size:,}")
    table.add_row("map size", f"{statistics.map_size:,}")
    _out().print(table)
    if turns is not None:
        _out().print(breakdown_table(turns))
