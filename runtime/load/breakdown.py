"""Where a turn's time goes, read from a session log's own facts, and in a live run
from the run's marks too (:mod:`runtime.load.probes`).

A *turn* here is what a sender waits for: from the insertion of its message into the
inbox (``agent/inbox/spliced``) to the ``turn/end`` of the last turn of its retry chain
(a live run: to its ``agent/settled``). Every interval between two consecutive facts
(or marks) of that span is given to one part, by what the loop was doing after the
earlier one:

- ``queue``: insertion to the first ``turn/start`` (the agent was busy, or not yet
  scheduled);
- ``hooks``: ``turn/start`` or ``step/end`` to the next ``step/start`` or ``turn/end``
  (the claim, ``agent/pre-step`` and ``agent/turn-stopping`` listeners, the loop); live,
  also the ``agent/request``, ``tools/pre-execute`` and ``tools/post-execute`` chains
  and the ``session/flush`` checkpoint's listeners;
- ``ttft``: ``step/start`` to the step's first ``assistant/chunk``; live, from the model
  call on (log only, it also holds the ``agent/request`` listeners and the write-ahead
  flush: no fact marks where they end);
- ``model``: ``ttft`` plus first chunk to ``assistant/message`` (streaming);
- ``tool``: while a ``tool/call`` has no ``tool/result`` yet (log only, after the
  flush that precedes the tools);
- ``commit`` (live runs): the durable waits: the write-ahead flush before a model
  request (``step/start`` to the model call, less the ``agent/request`` listeners) and
  before the tools (the last ``tool/call`` to the first tool hook or result),
  and the wait for the chain's ``turn/end`` to be durable (to ``session/flush``);
- ``engine``: the rest inside a step (``assistant/message`` to ``tool/call``, the last
  ``tool/result`` to ``step/end``);
- ``retry``: a failed turn's end to its retry's first step (the back-off).

So the parts add up to the span exactly. Fact times are epoch milliseconds, and so are
marks (each put between the facts it came between), so each part is exact to 1 ms per
fact. Works on any store, during or after a run (without the marks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from storage import AgentInboxSpliced, Event, Store, TurnStart

from .probes import Mark
from .report import Breakdown, TurnTimes, summary

__all__ = ["PARTS", "TurnTimes", "breakdown", "latency_of", "turn_times"]

PARTS: Final = ("queue", "hooks", "ttft", "model", "tool", "engine", "retry", "commit")


_AFTER: Final = {
    "turn/start": "hooks",
    "assistant/message": "engine",
    "step/end": "hooks",
    "llm/retry": "retry",
}

_Item = tuple[str, int, Any]  # (fact type or mark kind, epoch ms, the fact's data)


def _merged(events: Sequence[Event], marks: Sequence[Mark]) -> Iterator[_Item]:
    """The facts with the marks between them (a mark after the fact of its seq), each
    mark's time kept between its neighbours' (the clocks agree to the millisecond)."""
    ordered = sorted(marks, key=lambda m: m[0])  # stable: marks of one seq keep their order
    at = 0
    last = events[0].time if events else 0
    for index, event in enumerate(events):
        yield event.type, event.time, event.data
        last = max(last, event.time)
        upper = events[index + 1].time if index + 1 < len(events) else None
        while at < len(ordered) and ordered[at][0] <= event.seq:
            _seq, ms, kind = ordered[at]
            at += 1
            last = max(last, ms) if upper is None else min(max(last, ms), upper)
            yield kind, last, None
    for _seq, ms, kind in ordered[at:]:
        last = max(last, ms)
        yield kind, last, None


def _modelled_steps(items: Sequence[_Item]) -> set[int]:
    """The indexes of the ``step/start`` items whose step has a ``model`` mark."""
    out: set[int] = set()
    open_step: int | None = None
    for index, (kind, _ms, _data) in enumerate(items):
        if kind == "step/start":
            open_step = index
        elif kind == "step/end":
            open_step = None
        elif kind == "model" and open_step is not None:
            out.add(open_step)
    return out


def turn_times(
    events: Iterable[Event], marks: Sequence[Mark] | None = None, *, tool_gate: bool = False
) -> list[TurnTimes]:
    """The turns of one session's log that ended, in order (an open tail is left out).

    ``marks``: a live run's for this session (:class:`runtime.load.probes.Probes`):
    the durable waits become ``commit``, the listener chains ``hooks``, and a turn ends
    at its ``settled`` mark (one without is left out). ``tool_gate``: a step's first
    tool hook marks the end of its write-ahead flush (the probes listened to
    ``tools/pre-execute``)."""
    live = marks is not None
    facts = list(events)
    items = (
        list(_merged(facts, marks))
        if marks is not None
        else [(e.type, e.time, e.data) for e in facts]
    )
    modelled = _modelled_steps(items) if live else set()
    out: list[TurnTimes] = []
    waiting: deque[int] = deque()  # insertion times of next-turn messages not yet claimed
    current: TurnTimes | None = None
    ended: TurnTimes | None = None  # the last chain, until the next turn/start says
    state, prev, open_calls = "hooks", 0, 0
    durability: str | None = None  # the open turn's (None: write-ahead)
    step_modelled = final = False
    previous_fact = last_fact = ""  # the types of the turn's last two facts (marks aside)
    for index, (kind, now, data) in enumerate(items):
        if isinstance(data, AgentInboxSpliced) and data.target == "next-turn":
            waiting.extend([now] * len(data.inserted))
        if current is None:
            if kind != "turn/start" or not isinstance(data, TurnStart):
                continue
            durability = data.durability
            if ended is not None and data.trigger.kind == "retry":
                current, ended = ended, None  # the chain goes on
                current.retry += now - current.ended_ms
                current.retries += 1
                state = "retry"  # a retry turn waits out its delay before its first step
            else:
                if ended is not None:
                    out.append(ended)
                    ended = None
                inserted = waiting.popleft() if waiting else now
                current = TurnTimes(turn=0, inserted_ms=inserted, ended_ms=now)
                current.queue = now - inserted
                state = "hooks"
            prev, open_calls, final, last_fact = now, 0, False, kind
            continue
        _add(current, state, now - prev)
        prev = now
        if data is not None:  # a fact (a mark has no data)
            previous_fact, last_fact = last_fact, kind
        if kind == "assistant/chunk":
            if state == "ttft":
                state = "stream"
        elif kind == "step/start":
            step_modelled = index in modelled
            # modelled: to the model call is the flush before the request (with the
            # step's own first facts; the agent/request listeners are marked apart)
            state = "commit" if step_modelled else "ttft"
        elif kind == "tool/call":
            open_calls += 1
            state = "commit" if live and tool_gate and durability is None else "tool"
        elif kind == "tool/result":
            open_calls = max(0, open_calls - 1)
            state = "tool" if open_calls else "engine"
        elif kind == "turn/end":
            current.turn = data.turn
            current.ended_ms = now
            if live and previous_fact != "llm/retry":  # the chain's last turn: settled comes
                final = True
                state = "engine" if durability == "none" else "commit"
            else:
                ended, current = current, None
        elif kind in _AFTER:
            state = _AFTER[kind]
        elif kind == "request":
            state = "hooks"
        elif kind == "requested":
            state = "commit" if step_modelled else "ttft"
        elif kind == "model":
            state = "ttft"
        elif kind == "hook":
            state = "hooks"
        elif kind == "hooked":
            state = "tool" if open_calls else "engine"
        elif kind == "checkpoint" and final:
            state = "hooks"  # the session/flush listeners, then agent/settled's
        elif kind == "settled" and final:
            current.ended_ms = now
            out.append(current)
            current = None
    if ended is not None:
        out.append(ended)
    return out


def _add(t: TurnTimes, state: str, ms: int) -> None:
    if state == "hooks":
        t.hooks += ms
    elif state == "ttft":
        t.ttft += ms
    elif state == "stream":
        t.stream += ms
    elif state == "tool":
        t.tool += ms
    elif state == "engine":
        t.engine += ms
    elif state == "commit":
        t.commit += ms
    else:
        t.retry += ms


def breakdown(times: Sequence[TurnTimes], *, live: bool = False) -> Breakdown:
    """The percentiles of ``times``' parts (``commit`` only for a ``live`` run's)."""
    return Breakdown(
        turns=len(times),
        wall=summary([float(t.wall) for t in times]),
        queue=summary([float(t.queue) for t in times]),
        hooks=summary([float(t.hooks) for t in times]),
        ttft=summary([float(t.ttft) for t in times]),
        model=summary([float(t.model) for t in times]),
        tool=summary([float(t.tool) for t in times]),
        engine=summary([float(t.engine) for t in times]),
        retry=summary([float(t.retry) for t in times]),
        commit=summary([float(t.commit) for t in times]) if live else None,
    )


def latency_of(store: Store) -> Breakdown:
    """The breakdown of every ended turn of every session in ``store`` (no commit wait:
    the log does not hold it)."""
    times: list[TurnTimes] = []
    for header in store.sessions():
        times += turn_times(store.read(header.id))
    return breakdown(times)
