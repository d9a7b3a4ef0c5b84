"""The load driver: host a pool of agents on a :class:`~runtime.Runtime` and send them
work, in a closed or an open loop, measuring what happened.

*Closed loop* (no ``traffic``): every agent gets its first follow-up at once; each later
one is sent from the ``agent/settled`` listener when that agent's previous turn settled,
``spec.turns`` per agent. *Open loop* (``traffic``): arrivals come on their schedule
(:mod:`runtime.load.traffic`) whether or not the stack keeps up; an arrival goes to an
idle agent of the pool, else waits in a queue of ``traffic.queue_limit`` (default ten per
agent) for the next agent to settle, else is shed.

A turn's latency runs from its arrival (closed loop: its ``followup`` call) to its
``agent/settled`` event, so an automatic retry chain counts as one (longer) turn.
Failed requests are counted live by code by an observing ``agent/request-error``
listener (with the first message of each code); retry turns, events and the per-turn
breakdown (:mod:`runtime.load.breakdown`) are read from the agents' session logs
afterwards, with the run's live marks (:mod:`runtime.load.probes`: the durable waits,
the listener chains), so the load adds no ``session/event`` listener to the hot path.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import psutil  # type: ignore[import-untyped]

from actors import AgentSettled, Model, RequestError
from storage import Errored

from ..checks import resolve_model
from .breakdown import TurnTimes, breakdown, turn_times
from .failures import FailureTally
from .probes import Probes
from .report import (
    LoadProgress,
    LoadReport,
    LoadSamples,
    OpenLoop,
    percentile,
    summary,
)
from .spec import LoadSpec
from .stack import AgentStack, Factory, Prompts, build_stack, lookup_tool
from .traffic import Traffic, arrival_times

if TYPE_CHECKING:
    from ..agent import Agent
    from ..runtime import Runtime

__all__ = ["LoadDriver", "run_load"]

_RECENT: Final = 2000  # latencies the live p99 looks at
_SPAWN_STEP: Final = 1_000  # agents per rt.spawn_many call (a stop or the timeout checked between)

log = logging.getLogger("corral.load")


class _AgentState:
    __slots__ = ("agent", "arrived_at", "busy", "done", "sent_at")

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.busy = False  # a turn sent and not settled
        self.done = 0
        self.sent_at = 0.0  # perf_counter of the followup call
        self.arrived_at = 0.0  # perf_counter of the arrival (closed loop: sent_at)


class LoadDriver:
    """One load run over ``rt``. Call :meth:`run` once; ``samples`` then holds the raw
    latencies and the progress timeline. ``stop`` set (or a ``KeyboardInterrupt`` in
    :meth:`run`) ends the run early: nothing more is sent, what ran is reported.

    ``factory`` (instead of ``stack``) is called here, after the run's probes are
    registered, so that its listeners' time can be told apart (see
    :mod:`runtime.load.probes`); a ``stack`` built before has its listeners' time where
    the log puts it."""

    def __init__(
        self,
        rt: Runtime,
        spec: LoadSpec,
        *,
        model: Model | None = None,
        stack: AgentStack | None = None,
        factory: Factory | None = None,
        stack_name: str = "scripted",
        prompts: Prompts | None = None,
        traffic: Traffic | None = None,
        on_progress: Callable[[LoadProgress], None] | None = None,
        interval_s: float = 0.5,
        stop: threading.Event | None = None,
    ) -> None:
        self.rt = rt
        self.spec = spec
        self.probes = Probes(rt, durability=rt.durability)
        self.probes.install()
        try:
            if factory is not None:
                stack = build_stack(factory, rt, stack_name)
            self.probes.trim()
        except BaseException:
            self.probes.close()
            raise
        self.stack = stack or AgentStack()
        self.stack_name = stack_name
        chosen = model if model is not None else self.stack.model
        resolved = resolve_model(chosen) if chosen is not None else spec.scripted_model()
        self._unwrapped = resolved
        self.model_name = f"{resolved.provider}:{resolved.name}"
        self.model: Model = self.probes.wrap(resolved)
        self.prompts = prompts or Prompts(seed=spec.seed)
        self.traffic = traffic
        self.on_progress = on_progress
        self.interval_s = interval_s
        self.stop = stop or threading.Event()
        self.samples = LoadSamples()
        self.turn_records: list[tuple[str, int, float, float]] = []
        """(agent id, turn, latency from the followup call in ms, settle epoch ms)."""
        self.agent_ids: list[str] = []  # the agents this run spawned
        self._states: dict[str, _AgentState] = {}
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._schedule = arrival_times(traffic, spec.seed) if traffic is not None else []
        self._total = len(self._schedule) if traffic is not None else spec.agents * spec.turns
        self._done = 0  # settled turns
        self._sent = 0  # followups sent
        self._skipped = 0  # turns never sent because a follow-up was refused
        self._errored = 0
        self._shed = 0
        self._arrived = 0
        self._idle: deque[_AgentState] = deque()
        self._queue: deque[float] = deque()  # arrival times waiting for an agent
        self._queue_limit = 0
        self._queue_ms: list[float] = []
        self._lag_ms: list[float] = []
        self._failures = FailureTally()
        self._send_failures: list[str] = []
        self._process = psutil.Process()
        self._rss_peak = 0.0
        self._started = 0.0
        self._interrupted = False

    # ------------------------------------------------------------------ listeners

    def _send(self, state: _AgentState, arrived_at: float | None = None) -> None:
        now = time.perf_counter()
        state.sent_at = now
        state.arrived_at = now if arrived_at is None else arrived_at
        turns = 0 if self.traffic is not None else self.spec.turns
        prompt = self.prompts.next(state.agent.id, state.done + 1, turns)
        with self._lock:  # before the send: its turn may settle before followup returns
            self._sent += 1
            state.busy = True
        try:
            state.agent.followup(prompt, id=self.probes.first_id(state.agent))
        except Exception as err:  # noqa: BLE001 - a refused send ends this agent's load
            with self._lock:
                self._sent -= 1
                state.busy = False
                self._send_failures.append(f"{state.agent.id}: {err}")
                self._skipped += 1 if self.traffic is not None else self.spec.turns - state.done
                self._check_finished()

    def _check_finished(self) -> None:
        """Under the lock: set ``_finished`` once every turn is accounted for."""
        if self._done + self._skipped + self._shed >= self._total and (
            self.traffic is None or self._arrived >= self._total
        ):
            self._finished.set()

    def _on_request_error(self, event: RequestError, next_: Callable[[], Any]) -> Any:
        """Counts every failed request (retried or not), then lets the others decide."""
        if event.agent.id in self._states:
            with self._lock:
                self._failures.request(event.failure.code, event.failure.message)
        return next_()

    def _on_settled(self, event: AgentSettled) -> None:
        now = time.perf_counter()
        state = self._states.get(event.agent.id)
        if state is None:
            return  # an agent this run does not drive
        settled_ms = time.time() * 1000.0
        following: float | None = None
        with self._lock:
            state.done += 1
            state.busy = False
            self.samples.latencies_ms.append((now - state.arrived_at) * 1000.0)
            self.samples.settled_s.append(now - self._started)
            self.turn_records.append(
                (state.agent.id, event.turn, (now - state.sent_at) * 1000.0, settled_ms)
            )
            self._done += 1
            reason = event.reason
            if isinstance(reason, Errored):
                self._errored += 1
                self._failures.turn(reason.error.code, reason.error.message)
            self._check_finished()
            more = not self.stop.is_set()
            if self.traffic is None:
                more = more and state.done < self.spec.turns
            elif more and self._queue:
                following = self._queue.popleft()
                self._queue_ms.append((now - following) * 1000.0)
            else:
                self._idle.append(state)
                more = False
        if more:
            self._send(state, following)

    # ------------------------------------------------------------------ open loop

    def _arrive(self, scheduled: float) -> None:
        """One arrival, due at ``scheduled`` (perf_counter): send, queue or shed it."""
        now = time.perf_counter()
        with self._lock:
            self._arrived += 1
            self._lag_ms.append(max(0.0, now - scheduled) * 1000.0)
            state = self._idle.popleft() if self._idle else None
            if state is None:
                if len(self._queue) < self._queue_limit:
                    self._queue.append(scheduled)
                else:
                    self._shed += 1
                    self._check_finished()
                return
            self._queue_ms.append(max(0.0, now - scheduled) * 1000.0)
        self._send(state, scheduled)

    def _pace(self, started: float, deadline: float) -> None:
        """Send the open loop's arrivals on their schedule (late ones at once), with
        progress every ``interval_s``; returns when all arrived, or at ``deadline``."""
        last = (started, 0)
        next_progress = started + self.interval_s
        for offset in self._schedule:
            due = started + offset
            while True:
                now = time.perf_counter()
                if self.stop.is_set() or now >= deadline:
                    return
                if now >= next_progress:
                    last = self._progress(started, last)
                    next_progress = now + self.interval_s
                if now >= due:
                    break
                self.stop.wait(min(due, next_progress) - now)
            self._arrive(due)

    # ------------------------------------------------------------------ run

    def _sample_rss(self) -> float:
        rss = float(self._process.memory_info().rss) / (1 << 20)
        self._rss_peak = max(self._rss_peak, rss)
        return rss

    def _progress(self, started: float, last: tuple[float, int]) -> tuple[float, int]:
        now = time.perf_counter()
        with self._lock:
            done, errored, shed = self._done, self._errored, self._shed
            in_flight = self._sent - self._done
            recent = self.samples.latencies_ms[-_RECENT:]
            failures = tuple((f.code, f.requests, f.example) for f in self._failures.counts())
            retried = self._failures.retried()
            total = self._arrived if self.traffic is not None else self._total
            oldest = max((now - st.sent_at for st in self._states.values() if st.busy), default=0.0)
        elapsed = now - started
        self.samples.timeline.append((round(elapsed, 3), done))
        rate = (done - last[1]) / (now - last[0]) if now > last[0] else 0.0
        rss = self._sample_rss()
        if self.on_progress is not None:
            self.on_progress(
                LoadProgress(
                    elapsed_s=elapsed,
                    turns_done=done,
                    turns_total=total,
                    turns_per_s=rate,
                    p99_ms=percentile(recent, 99),
                    errored=errored,
                    rss_mb=rss,
                    in_flight=in_flight,
                    retried=retried,
                    shed=shed,
                    failures=failures,
                    oldest_s=oldest,
                )
            )
        return now, done

    def _until(self, deadline: float) -> float:
        return min(self.interval_s, max(0.0, deadline - time.perf_counter()))

    def _spawn(self, deadline: float) -> None:
        stack = self.stack
        tools = list(stack.tools)
        if not tools and stack.model is None and self.spec.tool_calls:
            tools = [lookup_tool()]
        while len(self._states) < self.spec.agents and time.perf_counter() < deadline:
            if self.stop.is_set():
                break
            batch = min(_SPAWN_STEP, self.spec.agents - len(self._states))  # (stop between)
            for agent in self.rt.spawn_many(
                batch, model=self.model, tools=tools, system=stack.system, limits=stack.limits
            ):
                self.agent_ids.append(agent.id)
                state = self._states[agent.id] = _AgentState(agent)
                self._idle.append(state)

    def _warm(self, deadline: float) -> None:
        """A model in a process of its own (``ProcessModel``) started before the load, so
        that its child's start (its imports, a few hundred ms) is not in the first turns'
        latency. (Only if that module is loaded: else the model cannot be one.)"""
        process = sys.modules.get("runtime.providers.process")
        if process is None or not isinstance(self._unwrapped, process.ProcessModel):
            return
        starting = asyncio.run_coroutine_threadsafe(self._unwrapped.start(), self.rt.io.loop)
        try:
            starting.result(max(0.0, deadline - time.perf_counter()))
        except Exception:  # its requests fail then, and the report counts them
            starting.cancel()
            log.warning("the model's process did not start; its requests will fail", exc_info=True)

    def run(self, *, ready: Callable[[], None] | None = None) -> LoadReport:
        """Spawn the agents, send the load, wait (at most ``spec.timeout_s``), report.
        ``ready`` is called between the spawns and the load (runs that must start their
        load together wait there for each other)."""
        spec, rt = self.spec, self.rt
        self._sample_rss()
        t0 = time.perf_counter()
        deadline = t0 + spec.timeout_s  # spawning counts: a huge --agents still ends
        disposers = [rt.on("agent/request-error", self._on_request_error)]
        started = wall_s = 0.0
        try:
            self._spawn(deadline)
            spawn_s = time.perf_counter() - t0
            self._warm(deadline)
            if ready is not None:
                ready()
            disposers.append(rt.on("agent/settled", self._on_settled))
            started = self._started = time.perf_counter()
            last = (started, 0)
            if self.traffic is not None:
                self._queue_limit = (
                    self.traffic.queue_limit
                    if self.traffic.queue_limit is not None
                    else 10 * len(self._states)
                )
                self._pace(started, deadline)
            else:
                idle, self._idle = list(self._idle), deque()
                for state in idle:
                    if self.stop.is_set():
                        break
                    self._send(state)
            while not self._finished.wait(self._until(deadline)):
                last = self._progress(started, last)
                if time.perf_counter() >= deadline or self.stop.is_set():
                    break
        except KeyboardInterrupt:
            self._interrupted = True
            self.stop.set()
            spawn_s = time.perf_counter() - t0 if not started else started - t0
        finally:
            for dispose in disposers:
                dispose()
            self.probes.close()
        if started:
            rt.flush()
            wall_s = time.perf_counter() - started
            self._progress(started, (started, 0))
        # every agent spawned, also when a Ctrl-C came while spawning
        return self._report([state.agent for state in self._states.values()], spawn_s, wall_s)

    def _report(self, agents: list[Agent], spawn_s: float, wall_s: float) -> LoadReport:
        events = retried = 0
        times: list[tuple[str, TurnTimes]] = []
        for agent in agents:
            log = agent.session.events()
            events += agent.session.last_seq + 1
            retried += sum(
                1 for e in log if e.type == "turn/start" and e.data.trigger.kind == "retry"
            )
            marks = self.probes.marks.get(agent.id, [])
            times.extend(
                (agent.id, t) for t in turn_times(log, marks, tool_gate=self.probes.tool_gate)
            )
        with self._lock:
            settled, errored = self._done, self._errored
            latencies = list(self.samples.latencies_ms)
            in_flight = self._sent - self._done
            failures = self._failures.counts()
            self.samples.queue_ms = list(self._queue_ms)
            self.samples.lag_ms = list(self._lag_ms)
        self.samples.turns = [t for _aid, t in times]
        dispatcher = self.rt.dispatcher.statistics()
        return LoadReport(
            agents=self.spec.agents,
            turns=self.spec.turns if self.traffic is None else 0,
            durability=self.rt.durability,
            threads=dispatcher.workers - dispatcher.standby,
            standby=dispatcher.standby,
            model=self.model_name,
            wall_s=round(wall_s, 4),
            spawn_s=round(spawn_s, 4),
            turns_per_s=round(settled / wall_s, 1) if wall_s > 0 else 0.0,
            events=events,
            events_per_s=round(events / wall_s, 1) if wall_s > 0 else 0.0,
            latency_ms=summary(latencies),
            settled=settled,
            errored=errored,
            retried=retried,
            timed_out=not self._finished.is_set() and not self.stop.is_set(),
            rss_peak_mb=round(self._rss_peak, 1),
            violations=[f"follow-up refused: {line}" for line in self._send_failures],
            mode="closed" if self.traffic is None else "open",
            stack=self.stack_name,
            turns_total=self._total,
            error_rate=round(errored / settled, 6) if settled else 0.0,
            in_flight=in_flight,
            interrupted=self._interrupted or self.stop.is_set(),
            failures=failures,
            breakdown=breakdown(self.samples.turns, live=True),
            open_loop=self._open_loop(settled, wall_s),
        )

    def _open_loop(self, settled: int, wall_s: float) -> OpenLoop | None:
        traffic = self.traffic
        if traffic is None:
            return None
        with self._lock:
            arrived, shed = self._arrived, self._shed
            queue_ms, lag_ms = list(self._queue_ms), list(self._lag_ms)
        return OpenLoop(
            shape=traffic.shape,
            rate=traffic.rate,
            duration_s=traffic.duration_s,
            arrivals=len(self._schedule),
            offered_rate=round(arrived / traffic.duration_s, 3),
            dispatched=len(queue_ms),
            shed=shed,
            queue_limit=self._queue_limit,
            achieved_rate=round(settled / wall_s, 3) if wall_s > 0 else 0.0,
            queue_ms=summary(queue_ms),
            lag_ms=summary(lag_ms),
        )


def run_load(
    rt: Runtime,
    spec: LoadSpec,
    *,
    model: Model | None = None,
    stack: AgentStack | None = None,
    stack_name: str = "scripted",
    prompts: Prompts | None = None,
    traffic: Traffic | None = None,
    on_progress: Callable[[LoadProgress], None] | None = None,
    interval_s: float = 0.5,
) -> LoadReport:
    """Host ``spec.agents`` agents on ``rt`` and send them the load; see module doc."""
    return LoadDriver(
        rt,
        spec,
        model=model,
        stack=stack,
        stack_name=stack_name,
        prompts=prompts,
        traffic=traffic,
        on_progress=on_progress,
        interval_s=interval_s,
    ).run()
