"""``corral top``: a live view of a store that another process is writing, read-only.

Every refresh opens the store read-only (short LMDB read transactions: the writer is
never blocked), reads only the events appended since the last refresh (each session's
durable event count tells what is new) and folds them into :class:`StoreView`. What a
log cannot tell is not shown: a passivated agent is a runtime's state, not a fact of its
session, so sessions are counted by what their logs say (a turn open, idle, new).

Whether the writer still runs is read off the store's ``writer.lock`` (the pid its writer
recorded; :func:`storage.writer_pid`) and asked of the system; a writer killed with
SIGKILL leaves its last durable facts readable, and the view says it is gone.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from pathlib import Path
from typing import Final

import click
import psutil  # type: ignore[import-untyped]
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from runtime.load import store_bytes
from storage import Event, InvalidEventError, LogCorruptError, StorageError, Store, writer_pid

from .errors import CliError
from .options import FiniteFloatRange, store_option
from .transcript import shown

__all__ = ["StoreView", "top"]

_SLOWEST: Final = 5
_READ_WINDOW: Final = 4096


class _Session:
    __slots__ = ("cursor", "model", "open_since", "open_turn", "retrying", "turns")

    def __init__(self) -> None:
        self.cursor = 0  # the next seq to read
        self.open_turn: int | None = None
        self.open_since = 0  # epoch ms of the open turn's turn/start
        self.retrying = False  # an llm/retry was logged for the open turn
        self.turns = 0
        self.model = "-"


class StoreView:
    """What ``corral top`` shows, folded from the events read so far."""

    def __init__(self, path: Path, window_s: float = 10.0) -> None:
        self.path = path
        self.window_s = window_s
        self._sessions: dict[str, _Session] = {}
        self.outcomes: Counter[str] = Counter()
        self.retries = 0
        self.events = 0
        self.chains = 0  # turns ended as a user counts them (a chain's terminal turn)
        self.tokens: dict[str, list[int]] = {}  # model -> [in, out]
        self.unreadable: set[str] = set()
        self._samples: deque[tuple[float, int, int]] = deque()
        self.size = 0
        self.writer: int | None = None
        self.writer_alive = False
        self.error: str | None = None

    def refresh(self) -> None:
        """Read what was appended since the last refresh."""
        try:
            with Store.open(self.path, readonly=True) as store:
                for header in store.sessions():
                    if header.id not in self._sessions:
                        self._sessions[header.id] = _Session()
                for session_id, state in self._sessions.items():
                    if session_id not in self.unreadable:
                        self._catch_up(store, session_id, state)
            self.error = None
        except StorageError as err:
            self.error = str(err)
        self.size = store_bytes(self.path)
        self.writer = writer_pid(self.path)
        self.writer_alive = _running(self.writer)
        now = time.monotonic()
        self._samples.append((now, self.chains, self.events))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def _catch_up(self, store: Store, session_id: str, state: _Session) -> None:
        count = store.stats(session_id).event_count
        while state.cursor < count:
            try:
                window = store.read(
                    session_id,
                    lower=state.cursor,
                    upper=min(count, state.cursor + _READ_WINDOW) - 1,
                    include_ignored=True,
                )
            except (InvalidEventError, LogCorruptError):
                self.unreadable.add(session_id)
                return
            if not window:
                return
            for event in window:
                self._fold(state, event)
            self.events += window[-1].seq + 1 - state.cursor
            state.cursor = window[-1].seq + 1

    def _fold(self, state: _Session, event: Event) -> None:
        kind = event.type
        if kind == "turn/start":
            state.open_turn = event.data.turn
            if event.data.trigger.kind != "retry":
                state.open_since = event.time  # a retry turn goes on with its chain's age
        elif kind == "llm/retry":
            state.retrying = True
            self.retries += 1
        elif kind == "turn/end":
            state.open_turn = None
            if state.retrying:  # a failed turn a retry turn follows: not an outcome
                state.retrying = False
            else:
                state.turns += 1
                self.chains += 1
                self.outcomes[event.data.reason.kind] += 1
        elif kind == "request/header":
            state.model = f"{event.data.config.provider}:{event.data.config.model}"
        elif kind == "assistant/message" and event.data.usage is not None:
            tokens = self.tokens.setdefault(state.model, [0, 0])
            tokens[0] += event.data.usage.input_tokens
            tokens[1] += event.data.usage.output_tokens

    # ------------------------------------------------------------------ reading it

    def states(self) -> Counter[str]:
        counts: Counter[str] = Counter({"open": 0, "idle": 0, "new": 0})
        for session_id, state in self._sessions.items():
            if session_id in self.unreadable:
                counts["unreadable"] += 1
            elif state.open_turn is not None:
                counts["open"] += 1
            else:
                counts["idle" if state.turns or state.cursor else "new"] += 1
        return counts

    def rates(self) -> tuple[float, float]:
        """Turns/s and events/s over the last ``window_s`` seconds (0 before two refreshes)."""
        if len(self._samples) < 2:
            return 0.0, 0.0
        (t0, c0, e0), (t1, c1, e1) = self._samples[0], self._samples[-1]
        elapsed = max(t1 - t0, 1e-9)
        return (c1 - c0) / elapsed, (e1 - e0) / elapsed

    def slowest(self, now_ms: int) -> list[tuple[str, int, float]]:
        """(session, turn, seconds open) of the longest-open turns."""
        open_turns = [
            (session_id, state.open_turn, (now_ms - state.open_since) / 1000)
            for session_id, state in self._sessions.items()
            if state.open_turn is not None
        ]
        open_turns.sort(key=lambda row: -row[2])
        return open_turns[:_SLOWEST]

    def render(self) -> RenderableType:
        now_ms = int(time.time() * 1000)
        turns_s, events_s = self.rates()
        if self.writer is None:
            writer = Text("writer: none has opened this store", style="yellow")
        elif self.writer_alive:
            writer = Text(f"writer: process {self.writer} running", style="green")
        else:
            writer = Text(
                f"writer: process {self.writer} is not running (it exited or was killed)\n"
                "  shown: what it made durable",
                style="bold red",
            )
        head = Text(f"corral top  {shown(str(self.path))}  {self.size:,} bytes on disk")
        parts: list[RenderableType] = [head, writer]
        if self.error is not None:
            parts.append(Text(f"cannot read the store: {shown(self.error)}", style="red"))
        states = self.states()
        summary = Table(box=None, show_header=False, pad_edge=False)
        summary.add_column("what", style="bold")
        summary.add_column("value", justify="right")
        summary.add_row("sessions", f"{sum(states.values()):,}")
        for name in ("open", "idle", "new", "unreadable"):
            if name in states:
                summary.add_row(f"  {name}", f"{states[name]:,}")
        summary.add_row("turns/s", f"{turns_s:,.1f}")
        summary.add_row("events/s", f"{events_s:,.1f}")
        summary.add_row("events", f"{self.events:,}")
        summary.add_row("turns", f"{self.chains:,}")
        for outcome, count in self.outcomes.most_common():
            summary.add_row(f"  {outcome}", f"{count:,}")
        summary.add_row("retries", f"{self.retries:,}")
        parts.append(summary)
        tokens = Table(box=None, pad_edge=False, title_justify="left")
        for name, justify in (("model", "left"), ("tokens in", "right"), ("tokens out", "right")):
            tokens.add_column(name, justify=justify)  # type: ignore[arg-type]
        for model, (tin, tout) in sorted(self.tokens.items()):
            tokens.add_row(Text(model), f"{tin:,}", f"{tout:,}")
        parts.append(tokens)
        slow = Table(box=None, pad_edge=False)
        for name, justify in (("slowest open turns", "left"), ("turn", "right"), ("open", "right")):
            slow.add_column(name, justify=justify)  # type: ignore[arg-type]
        for session_id, turn, age in self.slowest(now_ms):
            slow.add_row(Text(shown(session_id)), f"{turn:,}", f"{age:,.1f} s")
        parts.append(slow)
        return Group(*parts)


def _running(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:  # no such process (or not ours to ask: then it is not the writer)
        return False


@click.command()
@store_option
@click.option(
    "--interval",
    type=FiniteFloatRange(min=0.1, max=3600),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--frames",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after N refreshes (default: until Ctrl-C). Off a terminal, each is printed.",
)
def top(store: Path, interval: float, frames: int | None) -> None:
    """A live view of a store another process writes (read-only): sessions by state,
    turns/s and events/s, outcomes, retries, tokens by model, the slowest open turns."""
    if not (store / "data.mdb").exists():
        raise CliError(f"no corral store at {store} (give the store with --store)")
    view = StoreView(store)
    console = Console(highlight=False, markup=False, emoji=False)
    shown_frames = 0
    try:
        if not console.is_terminal:
            while frames is None or shown_frames < frames:
                if shown_frames:
                    time.sleep(interval)
                view.refresh()
                console.print(view.render())
                console.file.flush()
                shown_frames += 1
            return
        view.refresh()
        with Live(view.render(), console=console, auto_refresh=False, screen=False) as live:
            shown_frames = 1
            while frames is None or shown_frames < frames:
                time.sleep(interval)
                view.refresh()
                live.update(view.render(), refresh=True)
                shown_frames += 1
    except KeyboardInterrupt:
        return  # Ctrl-C is how the view ends
