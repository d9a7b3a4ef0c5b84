"""What ``corral log ls`` and ``corral top`` know of a session, read off its log; and the
unique-prefix lookup every command that takes a session id uses.

A :class:`SessionSummary` comes from one pass over a session's durable events through
the store's public read API (``Store.read``: about a microsecond an event), so a store of
100,000 short sessions summarises in seconds, and ``ls`` prints each row as soon as its
session is read.

Turns are counted as a user reads them: a *turn* is a chain, opened by a message and
ended by its terminal turn; the retry turns a failed request opened inside a chain are
counted apart (``retries``), and the chain's outcome is its last turn's.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Final, Literal, TypeAlias

import msgspec

from storage import InvalidEventError, LogCorruptError, SessionHeader, Store

from .errors import CliError

__all__ = [
    "SORT_KEYS",
    "STATES",
    "SessionState",
    "SessionSummary",
    "parse_time",
    "resolve_session",
    "resolve_session_in",
    "summaries",
    "summarize",
]

SessionState: TypeAlias = Literal["open", "idle", "new", "unreadable"]
STATES: Final = ("open", "idle", "new", "unreadable")
"""``open``: a turn is open (running now, or cut off by a crash: a resume closes it);
``idle``: every turn ended; ``new``: no turn yet; ``unreadable``: ``log check`` says why."""

SORT_KEYS: Final = ("created", "active", "turns", "retries", "events", "id")

_READ_WINDOW: Final = 4096  # events decoded per read (a long log is not held whole)


class SessionSummary(msgspec.Struct, frozen=True):
    id: str
    parent: str | None
    created: int  # epoch ms
    active: int  # epoch ms of its last event (created if it has none)
    events: int
    turns: int  # chains: turns opened by a message, each with its retries
    retries: int  # retry turns
    state: SessionState
    outcome: str  # the last ended chain's outcome ("completed", "error", ...), or "-"
    tokens_in: int = 0
    tokens_out: int = 0
    model: str = ""
    open_since: int | None = None  # epoch ms of the open turn's turn/start


def summarize(store: Store, header: SessionHeader) -> SessionSummary:
    """One session's summary, from every durable event of it."""
    turns = retries = events = tokens_in = tokens_out = 0
    active = header.created
    outcome = "-"
    model = ""
    open_since: int | None = None
    lower = 0
    try:
        while True:
            window = store.read(
                header.id, lower=lower, upper=lower + _READ_WINDOW - 1, include_ignored=True
            )
            for event in window:
                kind = event.type
                if kind == "turn/start":
                    open_since = event.time
                    if event.data.trigger.kind == "retry":
                        retries += 1
                    else:
                        turns += 1
                elif kind == "turn/end":
                    open_since = None
                    outcome = event.data.reason.kind
                elif kind == "assistant/message":
                    usage = event.data.usage
                    if usage is not None:
                        tokens_in += usage.input_tokens
                        tokens_out += usage.output_tokens
                elif kind == "request/header":
                    model = f"{event.data.config.provider}:{event.data.config.model}"
            if window:
                events = window[-1].seq + 1
                active = window[-1].time
            if len(window) < _READ_WINDOW:
                break
            lower += _READ_WINDOW
    except (InvalidEventError, LogCorruptError):
        return SessionSummary(
            header.id,
            header.parent,
            header.created,
            active,
            events,
            turns,
            retries,
            "unreadable",
            outcome,
        )
    # A retry turn still open, or one that ended "error" with a retry after it, leaves
    # its chain's outcome to the turn that ends it: only an ended chain has one.
    state: SessionState = "open" if open_since is not None else "idle" if turns else "new"
    return SessionSummary(
        header.id,
        header.parent,
        header.created,
        active,
        events,
        turns,
        retries,
        state,
        outcome,
        tokens_in,
        tokens_out,
        model,
        open_since,
    )


def summaries(store: Store, headers: Iterable[SessionHeader]) -> Iterator[SessionSummary]:
    for header in headers:
        yield summarize(store, header)


def resolve_session(store: Store, text: str) -> str:
    """The id of the one session whose id is ``text`` or starts with it (as git takes a
    commit); a :class:`CliError` that says what to do if none or several do."""
    return resolve_session_in([store], text, f"the store at {store.path}")[1]


def resolve_session_in(stores: Sequence[Store], text: str, where: str) -> tuple[Store, str]:
    """:func:`resolve_session` over several stores (a cluster's shards, ``where`` named
    in its errors): the store holding the one session ``text`` names, and its id."""
    for store in stores:
        if store.has_session(text):
            return store, text
    if not text:
        raise CliError("an empty session id matches every session: give one (`corral log ls`)")
    matches = [(st, h.id) for st in stores for h in st.sessions() if h.id.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise CliError(
            f"no session {text!r} (nor one starting with it) in {where} "
            "(`corral log ls` lists them)"
        )
    ids = sorted(session for _, session in matches)
    shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
    raise CliError(f"{len(ids):,} sessions start with {text!r} ({shown}): give more characters")


_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now_ms: int) -> int:
    """Epoch ms of ``text``: a duration back from now (``90s``, ``10m``, ``2h``, ``3d``,
    ``1w``) or an ISO date or date and time (local time unless it names a zone)."""
    match = _DURATION.match(text)
    if match is not None:
        return now_ms - int(float(match.group(1)) * _UNIT_S[match.group(2)] * 1000)
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError as err:
        raise ValueError(
            f"{text!r} is neither a duration (90s, 10m, 2h, 3d, 1w) nor an ISO date or time "
            "(2026-12-01, 2026-12-01T20:00)"
        ) from err
    return int(moment.timestamp() * 1000)
