"""The reusable load driver: host N agents for T turns each and measure what happened.

:func:`run_load` drives agents on a :class:`~runtime.Runtime` you opened; :func:`run_bench`
opens one over a store path, drives it, closes it, reopens the store and checks every
session log with :func:`storage.invariants.check_invariants`. Both return a
:class:`LoadReport` (msgspec: ``msgspec.json.encode(report)`` is the ``--json`` record).

How the load runs: every agent gets its first follow-up at once; each later follow-up is
sent from the ``agent/settled`` listener when the previous turn of that agent settled.
A turn's latency runs from its ``followup`` call to its ``agent/settled`` event, so an
automatic retry chain counts as one (longer) turn. Retry turns (``turn/start`` with a
``retry`` trigger) are counted from the agents' session logs afterwards, so the load
adds no ``session/event`` listener to the hot path.

This module has no terminal or CLI concerns; ``corral bench`` and
``benchmarks/bench_turns.py`` both build on it.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec
import psutil  # type: ignore[import-untyped]

from actors import AgentSettled, Model, ModelRequest
from storage import (
    Durability,
    IgnoredRecord,
    LlmFailure,
    StorageError,
    Store,
    ToolMessage,
    check_invariants,
)

from .policy import RetryPolicy
from .runtime import Runtime
from .scripted import ScriptedModel, ScriptItem, ToolCall, last_user_text
from .tool import FunctionTool, tool

if TYPE_CHECKING:
    from .agent import Agent

__all__ = [
    "FAST_RETRY",
    "LatencySummary",
    "LoadDriver",
    "LoadProgress",
    "LoadReport",
    "LoadSamples",
    "LoadSpec",
    "SessionViolations",
    "StoreCheck",
    "check_store",
    "lookup_tool",
    "percentile",
    "run_bench",
    "run_load",
    "scripted_load_model",
    "store_bytes",
]

FAST_RETRY: Final = RetryPolicy(base_s=0.01, cap_s=0.1)
"""The retry policy load runs use: the default schedule, 50x faster."""

_RECENT: Final = 2000  # latencies the live p99 looks at
_FILLER: Final = (
    "The task is done; here is a short, deterministic answer with enough text to be "
    "streamed in several chunks."
)


class LoadSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What to run. The scripted-model options are ignored when a real model is given."""

    agents: int = 1000
    turns: int = 10
    latency_s: float = 0.0  # model latency (the mean, with jitter_s)
    jitter_s: float = 0.0  # uniform spread around latency_s
    chunks: int = 1  # streamed chunks per reply
    tool_calls: int = 0  # calls of the cheap `lookup` tool per turn (one extra step)
    failure_rate: float = 0.0  # fraction of model requests failing with SERVER
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.agents < 1 or self.turns < 1:
            raise ValueError(f"agents and turns must be >= 1, got {self.agents} and {self.turns}")
        if not 0.0 <= self.failure_rate < 1.0:
            raise ValueError(f"failure_rate must be in [0, 1), got {self.failure_rate}")
        if self.latency_s < 0 or self.jitter_s < 0:
            raise ValueError("latency and jitter are seconds >= 0")
        if self.chunks < 1 or self.tool_calls < 0:
            raise ValueError("chunks must be >= 1 and tool_calls >= 0")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


class LatencySummary(msgspec.Struct, frozen=True):
    """Turn latency percentiles in milliseconds (0 when nothing settled)."""

    p50: float
    p95: float
    p99: float
    mean: float
    max: float


class LoadProgress(msgspec.Struct, frozen=True):
    """A live snapshot, handed to ``on_progress`` about every ``interval_s``."""

    elapsed_s: float
    turns_done: int
    turns_total: int
    turns_per_s: float  # over the last interval
    p99_ms: float  # over the most recent turns
    errored: int
    rss_mb: float


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    """The record of one load run (the ``--json`` fields)."""

    agents: int
    turns: int
    durability: str
    threads: int  # dispatcher workers
    standby: int  # standby workers (they run only while the others are stuck)
    model: str
    wall_s: float  # first follow-up to the last settled turn, plus the final flush
    spawn_s: float
    turns_per_s: float
    events: int  # durable events appended by this run's sessions
    events_per_s: float
    latency_ms: LatencySummary
    settled: int
    errored: int
    retried: int
    timed_out: bool
    rss_peak_mb: float
    log_bytes: int | None = None
    sessions_checked: int | None = None
    invariants_ok: bool | None = None  # None: not checked
    violations: list[str] = msgspec.field(default_factory=list)


class LoadSamples(msgspec.Struct):
    """Raw samples of a run, for plots: every turn's latency and settle time (seconds
    since the first follow-up, same order), and the progress timeline."""

    latencies_ms: list[float] = msgspec.field(default_factory=list)
    settled_s: list[float] = msgspec.field(default_factory=list)
    timeline: list[tuple[float, int]] = msgspec.field(default_factory=list)  # (s, turns done)


class SessionViolations(msgspec.Struct, frozen=True):
    session_id: str
    violations: list[str]


class StoreCheck(msgspec.Struct, frozen=True):
    """The result of :func:`check_store`: how many sessions, which broke invariants."""

    sessions: int
    failed: list[SessionViolations]
    ignored: dict[str, int] = msgspec.field(default_factory=dict)
    """How many records of each ignorable type the checking store did not know (checked
    for their seq only: see :class:`storage.events.IgnoredRecord`)."""

    @property
    def ok(self) -> bool:
        return not self.failed

    def lines(self, limit: int | None = None) -> list[str]:
        out = [f"{s.session_id}: {v}" for s in self.failed for v in s.violations]
        return out if limit is None else out[:limit]


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0..100) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _summary(latencies_ms: Sequence[float]) -> LatencySummary:
    if not latencies_ms:
        return LatencySummary(0.0, 0.0, 0.0, 0.0, 0.0)
    ordered = sorted(latencies_ms)
    return LatencySummary(
        p50=round(percentile(ordered, 50), 3),
        p95=round(percentile(ordered, 95), 3),
        p99=round(percentile(ordered, 99), 3),
        mean=round(sum(ordered) / len(ordered), 3),
        max=round(ordered[-1], 3),
    )


def _rss_mb(process: psutil.Process) -> float:
    return float(process.memory_info().rss) / (1 << 20)


def lookup_tool() -> FunctionTool:
    """The cheap, concurrency-safe tool load runs call."""

    @tool(concurrency_safe=True)
    def lookup(key: str) -> str:
        """Look a key up (instantly; a stand-in for a cheap tool)."""
        return f"value-of-{key}"

    return lookup


def scripted_load_model(spec: LoadSpec) -> ScriptedModel:
    """The ScriptedModel a load run drives: per request, fail with ``SERVER`` with
    probability ``failure_rate``; else call ``tool_calls`` tools on a turn's first step,
    and answer with text once the tools answered."""
    rng = random.Random(spec.seed)
    calls = [ToolCall("lookup", {"key": f"k{i}"}) for i in range(spec.tool_calls)]

    def reply(request: ModelRequest) -> ScriptItem:
        # ScriptedModel serializes these calls under its lock: rng needs no lock of its own.
        if spec.failure_rate and rng.random() < spec.failure_rate:
            return LlmFailure(message="scripted server error", code="SERVER", status=500)
        last = request.messages[-1] if request.messages else None
        if calls and not isinstance(last, ToolMessage):
            return calls
        return f"{last_user_text(request.messages)}: {_FILLER}"

    latency: float | Callable[[], float] = spec.latency_s
    if spec.jitter_s > 0:
        latency = ScriptedModel.jittered(spec.latency_s, spec.jitter_s, seed=spec.seed)
    return ScriptedModel(reply, latency=latency, chunks=spec.chunks, name="load")


class _AgentState:
    __slots__ = ("agent", "done", "sent_at")

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.done = 0
        self.sent_at = 0.0


class LoadDriver:
    """One load run over ``rt``. Call :meth:`run` once; ``samples`` then holds the raw
    latencies and the progress timeline."""

    def __init__(
        self,
        rt: Runtime,
        spec: LoadSpec,
        *,
        model: Model | None = None,
        on_progress: Callable[[LoadProgress], None] | None = None,
        interval_s: float = 0.5,
    ) -> None:
        self.rt = rt
        self.spec = spec
        self.model = model if model is not None else scripted_load_model(spec)
        self.on_progress = on_progress
        self.interval_s = interval_s
        self.samples = LoadSamples()
        self._states: dict[str, _AgentState] = {}
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._total = spec.agents * spec.turns
        self._done = 0  # settled turns
        self._skipped = 0  # turns never sent because a follow-up was refused
        self._errored = 0
        self._send_failures: list[str] = []
        self._process = psutil.Process()
        self._rss_peak = 0.0
        self._started = 0.0

    # ------------------------------------------------------------------ listener

    def _prompt(self, agent_id: str, turn: int) -> str:
        return f"task {turn} of {self.spec.turns} for agent {agent_id[-6:]}"

    def _send(self, state: _AgentState) -> None:
        state.sent_at = time.perf_counter()
        try:
            state.agent.followup(self._prompt(state.agent.id, state.done + 1))
        except Exception as err:  # noqa: BLE001 - a refused send ends this agent's load
            with self._lock:
                self._send_failures.append(f"{state.agent.id}: {err}")
                self._skipped += self.spec.turns - state.done
                if self._done + self._skipped >= self._total:
                    self._finished.set()

    def _on_settled(self, event: AgentSettled) -> None:
        now = time.perf_counter()
        state = self._states.get(event.agent.id)
        if state is None:
            return  # an agent this run does not drive
        state.done += 1
        with self._lock:
            self.samples.latencies_ms.append((now - state.sent_at) * 1000.0)
            self.samples.settled_s.append(now - self._started)
            self._done += 1
            if event.reason.kind == "error":
                self._errored += 1
            if self._done + self._skipped >= self._total:
                self._finished.set()
        if state.done < self.spec.turns:
            self._send(state)

    # ------------------------------------------------------------------ run

    def _sample_rss(self) -> float:
        rss = _rss_mb(self._process)
        self._rss_peak = max(self._rss_peak, rss)
        return rss

    def _progress(self, started: float, last: tuple[float, int]) -> tuple[float, int]:
        now = time.perf_counter()
        with self._lock:
            done, errored = self._done, self._errored
            recent = self.samples.latencies_ms[-_RECENT:]
        elapsed = now - started
        self.samples.timeline.append((round(elapsed, 3), done))
        rate = (done - last[1]) / (now - last[0]) if now > last[0] else 0.0
        rss = self._sample_rss()
        if self.on_progress is not None:
            self.on_progress(
                LoadProgress(elapsed, done, self._total, rate, percentile(recent, 99), errored, rss)
            )
        return now, done

    def _until(self, deadline: float) -> float:
        return min(self.interval_s, max(0.0, deadline - time.perf_counter()))

    def run(self) -> LoadReport:
        """Spawn the agents, drive every turn, wait (at most ``spec.timeout_s``), report."""
        spec, rt = self.spec, self.rt
        self._sample_rss()
        t0 = time.perf_counter()
        deadline = t0 + spec.timeout_s  # spawning counts: a huge --agents still ends
        tools = [lookup_tool()] if spec.tool_calls else []
        agents: list[Agent] = []
        while len(agents) < spec.agents and time.perf_counter() < deadline:
            agent = rt.spawn(model=self.model, tools=tools)
            agents.append(agent)
            self._states[agent.id] = _AgentState(agent)
        spawn_s = time.perf_counter() - t0
        dispose = rt.on("agent/settled", self._on_settled)
        try:
            started = self._started = time.perf_counter()
            for state in self._states.values():
                self._send(state)
            last = (started, 0)
            while not self._finished.wait(self._until(deadline)):
                last = self._progress(started, last)
                if time.perf_counter() >= deadline:
                    break
            rt.flush()
            wall_s = time.perf_counter() - started
            self._progress(started, last)
        finally:
            dispose()
        return self._report(agents, spawn_s, wall_s)

    def _report(self, agents: list[Agent], spawn_s: float, wall_s: float) -> LoadReport:
        events = retried = 0
        for agent in agents:
            log = agent.session.events()
            events += agent.session.last_seq + 1
            retried += sum(
                1 for e in log if e.type == "turn/start" and e.data.trigger.kind == "retry"
            )
        with self._lock:
            settled, errored = self._done, self._errored
            latencies = list(self.samples.latencies_ms)
        model = f"{self.model.provider}:{self.model.name}"
        dispatcher = self.rt.dispatcher.statistics()
        return LoadReport(
            agents=self.spec.agents,
            turns=self.spec.turns,
            durability=self.rt.durability,
            threads=dispatcher.workers - dispatcher.standby,
            standby=dispatcher.standby,
            model=model,
            wall_s=round(wall_s, 4),
            spawn_s=round(spawn_s, 4),
            turns_per_s=round(settled / wall_s, 1) if wall_s > 0 else 0.0,
            events=events,
            events_per_s=round(events / wall_s, 1) if wall_s > 0 else 0.0,
            latency_ms=_summary(latencies),
            settled=settled,
            errored=errored,
            retried=retried,
            timed_out=not self._finished.is_set(),
            rss_peak_mb=round(self._rss_peak, 1),
            violations=[f"follow-up refused: {line}" for line in self._send_failures],
        )


def run_load(
    rt: Runtime,
    spec: LoadSpec,
    *,
    model: Model | None = None,
    on_progress: Callable[[LoadProgress], None] | None = None,
    interval_s: float = 0.5,
) -> LoadReport:
    """Host ``spec.agents`` agents for ``spec.turns`` turns each on ``rt``; see module doc."""
    return LoadDriver(rt, spec, model=model, on_progress=on_progress, interval_s=interval_s).run()


# --------------------------------------------------------------------------- store-level


def store_bytes(path: str | Path) -> int:
    """Bytes the store directory occupies on disk (allocated blocks, as ``du`` counts)."""
    total = 0
    for entry in Path(path).iterdir():
        if entry.is_file():
            stat = entry.stat()
            total += min(stat.st_size, stat.st_blocks * 512)
    return total


def check_store(store: Store, *, allow_open_tail: bool = False) -> StoreCheck:
    """Check every session log of ``store`` against the session invariants. A session
    that cannot be read back counts as failed, with the storage error as its violation.
    Records of ignorable types that ``store`` does not know (a plugin's, registered in
    the process that wrote them) are accounted for by their seq and counted by type."""
    headers = store.sessions()
    failed: list[SessionViolations] = []
    ignored: Counter[str] = Counter()
    for header in headers:
        try:
            events = store.read(header.id, include_ignored=True)
        except StorageError as err:
            failed.append(SessionViolations(header.id, [f"[unreadable] {err}"]))
            continue
        ignored.update(e.type for e in events if type(e.data) is IgnoredRecord)
        found = check_invariants(events, allow_open_tail=allow_open_tail)
        if found:
            failed.append(SessionViolations(header.id, [str(v) for v in found]))
    return StoreCheck(len(headers), failed, dict(sorted(ignored.items())))


def run_bench(
    path: str | Path,
    spec: LoadSpec,
    *,
    durability: Durability = "write-ahead",
    threads: int | None = None,
    model: Model | None = None,
    retry_policy: RetryPolicy | None = FAST_RETRY,
    on_progress: Callable[[LoadProgress], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    interval_s: float = 0.5,
) -> tuple[LoadReport, LoadSamples]:
    """Open a runtime over the store at ``path``, run the load, close it, then reopen the
    store read-only and check every session log. Returns the report and raw samples.
    ``on_phase`` hears what happens after the load ("closing the runtime", ...)."""
    phase = on_phase or (lambda _what: None)
    rt = Runtime.open(path, durability=durability, threads=threads, retry_policy=retry_policy)
    try:
        driver = LoadDriver(rt, spec, model=model, on_progress=on_progress, interval_s=interval_s)
        report = driver.run()
        phase("closing the runtime")
    finally:
        rt.close()
    with Store.open(path, readonly=True) as store:
        phase(f"checking {len(store.sessions()):,} session logs")
        check = check_store(store)
    violations = [*report.violations, *check.lines(limit=50)]
    report = msgspec.structs.replace(
        report,
        log_bytes=store_bytes(path),
        sessions_checked=check.sessions,
        invariants_ok=check.ok and not report.violations,
        violations=violations,
    )
    return report, driver.samples
