"""The record of a load run: every ``corral bench`` run writes one :class:`LoadReport`
(``--json``), a sweep one :class:`SweepReport`; both carry ``schema`` (this version:
:data:`SCHEMA`). ``docs/load.md`` documents every field.

Schema rules (msgspec's): a new field gets a default; fields are never reordered or
retyped; a change a reader must know about bumps :data:`SCHEMA`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, Literal

import msgspec

__all__ = [
    "SCHEMA",
    "Breakdown",
    "FailureCount",
    "LatencySummary",
    "LoadProgress",
    "LoadReport",
    "LoadSamples",
    "OpenLoop",
    "SweepPoint",
    "SweepReport",
    "TurnTimes",
    "percentile",
    "summary",
]

SCHEMA: Final = 2
"""The report schema version (1: the fields before open loops, failures, breakdowns)."""

_EXAMPLE_CHARS: Final = 300


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0..100) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class LatencySummary(msgspec.Struct, frozen=True):
    """Percentiles in milliseconds (all 0 when there was nothing to measure)."""

    p50: float
    p95: float
    p99: float
    mean: float
    max: float


def summary(values_ms: Sequence[float]) -> LatencySummary:
    """The percentiles of ``values_ms``, rounded to microseconds."""
    if not values_ms:
        return LatencySummary(0.0, 0.0, 0.0, 0.0, 0.0)
    ordered = sorted(values_ms)
    return LatencySummary(
        p50=round(percentile(ordered, 50), 3),
        p95=round(percentile(ordered, 95), 3),
        p99=round(percentile(ordered, 99), 3),
        mean=round(sum(ordered) / len(ordered), 3),
        max=round(ordered[-1], 3),
    )


class FailureCount(msgspec.Struct, frozen=True):
    """Failed model requests of one code: how many, and the first one's message.

    ``turns`` counts the turns that *ended* with this code (their retries ran out or the
    code is not retried); the other ``requests - turns`` failures were retried."""

    code: str
    requests: int
    turns: int
    example: str

    @staticmethod
    def clip(message: str) -> str:
        if len(message) <= _EXAMPLE_CHARS:
            return message
        return f"{message[:_EXAMPLE_CHARS]}... ({len(message) - _EXAMPLE_CHARS} more characters)"


class Breakdown(msgspec.Struct, frozen=True, kw_only=True):
    """Where a turn's time went, as percentiles over the run's turns, in milliseconds,
    from the session logs' own facts (see :mod:`runtime.load.breakdown`).

    ``queue + hooks + model + tool + engine + retry`` is a turn's logged time (its message's
    insertion to its ``turn/end``); ``ttft`` is the first part of ``model``; ``commit``
    (live runs only: the log does not hold it) is ``turn/end`` to ``agent/settled``."""

    turns: int
    wall: LatencySummary  # insertion to turn/end
    queue: LatencySummary
    hooks: LatencySummary
    ttft: LatencySummary
    model: LatencySummary
    tool: LatencySummary
    engine: LatencySummary
    retry: LatencySummary
    commit: LatencySummary | None = None


class OpenLoop(msgspec.Struct, frozen=True, kw_only=True):
    """What an open-loop run offered and achieved."""

    shape: Literal["poisson", "constant"]
    rate: float  # requested arrivals per second
    duration_s: float
    arrivals: int  # arrivals scheduled within the duration
    offered_rate: float  # arrivals / duration
    dispatched: int  # arrivals sent to an agent
    shed: int  # arrivals refused: the queue held queue_limit already
    queue_limit: int
    achieved_rate: float  # settled turns / wall time
    queue_ms: LatencySummary  # an arrival's wait for a free agent (dispatched ones)
    lag_ms: LatencySummary  # how late the arrivals were sent against their schedule


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    """The record of one load run (the ``--json`` fields; docs/load.md)."""

    agents: int
    turns: int  # per agent, closed loop; 0 in an open loop (see ``open_loop``)
    durability: str
    threads: int  # dispatcher workers
    standby: int  # standby workers (they run only while the others are stuck)
    model: str
    wall_s: float  # first follow-up to the last settled turn, plus the final flush
    spawn_s: float
    turns_per_s: float
    events: int  # durable events appended by this run's sessions
    events_per_s: float
    latency_ms: LatencySummary  # a turn's arrival (closed loop: its followup call) to settled
    settled: int
    errored: int  # turns that ended in error (after their retries)
    retried: int  # retry turns
    timed_out: bool
    rss_peak_mb: float
    log_bytes: int | None = None
    sessions_checked: int | None = None
    invariants_ok: bool | None = None  # None: not checked
    violations: list[str] = msgspec.field(default_factory=list)
    # schema 2
    schema: int = SCHEMA
    mode: Literal["closed", "open"] = "closed"
    stack: str = "scripted"  # the factory (module:name), or the built-in stack
    turns_total: int = 0  # turns the run meant to settle (closed: agents x turns)
    error_rate: float = 0.0  # errored / settled
    in_flight: int = 0  # turns sent and not settled when the run ended
    interrupted: bool = False  # stopped early (Ctrl-C)
    earlier_sessions: int = 0  # sessions the store held before (not counted here)
    failures: list[FailureCount] = msgspec.field(default_factory=list)
    breakdown: Breakdown | None = None
    open_loop: OpenLoop | None = None


class TurnTimes(msgspec.Struct, kw_only=True):
    """One turn (a retry chain) of one session, in milliseconds."""

    turn: int  # the chain's last turn number (agent/settled's ``turn``)
    inserted_ms: int  # epoch ms
    ended_ms: int  # epoch ms of the last turn/end (a live run's: of agent/settled)
    queue: int = 0
    hooks: int = 0
    ttft: int = 0
    stream: int = 0
    tool: int = 0
    engine: int = 0
    retry: int = 0
    commit: int = 0  # the durable waits (live runs only)
    retries: int = 0

    @property
    def model(self) -> int:
        return self.ttft + self.stream

    @property
    def wall(self) -> int:
        return self.ended_ms - self.inserted_ms

    def parts_ms(self) -> int:
        """queue + hooks + model + tool + engine + retry + commit (== ``wall``)."""
        return (
            self.queue
            + self.hooks
            + self.model
            + self.tool
            + self.engine
            + self.retry
            + self.commit
        )


class LoadProgress(msgspec.Struct, frozen=True, kw_only=True):
    """A live snapshot, handed to ``on_progress`` about every ``interval_s``."""

    elapsed_s: float
    turns_done: int
    turns_total: int  # an open loop's: the arrivals so far
    turns_per_s: float  # over the last interval
    p99_ms: float  # over the most recent turns
    errored: int
    rss_mb: float
    in_flight: int = 0
    retried: int = 0  # failed requests that were retried (live)
    shed: int = 0
    failures: tuple[tuple[str, int, str], ...] = ()  # (code, requests, example)
    oldest_s: float = 0.0  # how long the oldest unsettled turn has been waiting


class LoadSamples(msgspec.Struct):
    """Raw samples of a run, for plots and for merging the runs of shards: every turn's
    latency and settle time (seconds since the first follow-up, same order), the
    progress timeline, an open loop's queue waits and pacer lags, and every turn's
    breakdown."""

    latencies_ms: list[float] = msgspec.field(default_factory=list)
    settled_s: list[float] = msgspec.field(default_factory=list)
    timeline: list[tuple[float, int]] = msgspec.field(default_factory=list)  # (s, turns done)
    queue_ms: list[float] = msgspec.field(default_factory=list)
    lag_ms: list[float] = msgspec.field(default_factory=list)
    turns: list[TurnTimes] = msgspec.field(default_factory=list)


class SweepPoint(msgspec.Struct, frozen=True):
    value: float  # the swept value at this point
    report: LoadReport


class SweepReport(msgspec.Struct, frozen=True, kw_only=True):
    """A sweep: one run per value of ``swept``; ``knee`` is the last value that still
    scaled (see :func:`runtime.load.sweep.knee`), None if every step scaled."""

    swept: Literal["agents", "rate"]
    points: list[SweepPoint]
    knee: float | None
    schema: int = SCHEMA
