"""Where a turn's time goes, read from a session log's own facts.

A *turn* here is what a sender waits for: from the insertion of its message into the
inbox (``agent/inbox/spliced``) to the ``turn/end`` of the last turn of its retry chain.
Every interval between two consecutive facts of that span is given to one part, by
what the loop was doing after the earlier fact:

- ``queue``: insertion to the first ``turn/start`` (the agent was busy, or not yet
  scheduled);
- ``hooks``: ``turn/start`` or ``step/end`` to the next ``step/start`` or ``turn/end``
  (the claim, ``agent/pre-step`` and ``agent/turn-stopping`` listeners, the loop);
- ``ttft``: ``step/start`` to the step's first ``assistant/chunk`` (the request's
  preparation, ``agent/request`` listeners, the write-ahead flush, the model's time to
  first token);
- ``model``: ``ttft`` plus first chunk to ``assistant/message`` (streaming);
- ``tool``: while a ``tool/call`` has no ``tool/result`` yet;
- ``engine``: the rest inside a step (``assistant/message`` to ``tool/call``, the last
  ``tool/result`` to ``step/end``);
- ``retry``: a failed turn's end to its retry's first step (the back-off).

So the parts add up to the logged span exactly; what the log cannot show is the wait
for the final ``turn/end`` to be durable before ``agent/settled`` (a live run measures
it as ``commit``). Fact times are epoch milliseconds, so each part is exact to 1 ms per
fact. Works on any store, during or after a run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from storage import AgentInboxSpliced, Event, Store, TurnStart

from .report import Breakdown, summary

__all__ = ["PARTS", "TurnTimes", "breakdown", "latency_of", "turn_times"]

PARTS: Final = ("queue", "hooks", "ttft", "model", "tool", "engine", "retry")


class TurnTimes(msgspec.Struct, kw_only=True):
    """One turn (a retry chain) of one session, in milliseconds."""

    turn: int  # the chain's last turn number (agent/settled's ``turn``)
    inserted_ms: int  # epoch ms
    ended_ms: int  # epoch ms of the last turn/end
    queue: int = 0
    hooks: int = 0
    ttft: int = 0
    stream: int = 0
    tool: int = 0
    engine: int = 0
    retry: int = 0
    retries: int = 0

    @property
    def model(self) -> int:
        return self.ttft + self.stream

    @property
    def wall(self) -> int:
        return self.ended_ms - self.inserted_ms

    def parts_ms(self) -> int:
        """queue + hooks + model + tool + engine + retry (== ``wall``)."""
        return self.queue + self.hooks + self.model + self.tool + self.engine + self.retry


_AFTER: Final = {
    "turn/start": "hooks",
    "step/start": "ttft",
    "assistant/message": "engine",
    "step/end": "hooks",
    "llm/retry": "retry",
}


def turn_times(events: Iterable[Event]) -> list[TurnTimes]:
    """The turns of one session's log that ended, in order (an open tail is left out)."""
    out: list[TurnTimes] = []
    waiting: deque[int] = deque()  # insertion times of next-turn messages not yet claimed
    current: TurnTimes | None = None
    ended: TurnTimes | None = None  # the last chain, until the next turn/start says
    state, prev, open_calls = "hooks", 0, 0
    for event in events:
        kind, now = event.type, event.time
        if kind == "agent/inbox/spliced":
            data = event.data
            if isinstance(data, AgentInboxSpliced) and data.target == "next-turn":
                waiting.extend([now] * len(data.inserted))
        if current is None:
            if kind != "turn/start":
                continue
            data = event.data
            if ended is not None and isinstance(data, TurnStart) and data.trigger.kind == "retry":
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
            prev, open_calls = now, 0
            continue
        _add(current, state, now - prev)
        prev = now
        if kind == "assistant/chunk":
            if state == "ttft":
                state = "stream"
        elif kind == "tool/call":
            open_calls += 1
            state = "tool"
        elif kind == "tool/result":
            open_calls = max(0, open_calls - 1)
            state = "tool" if open_calls else "engine"
        elif kind == "turn/end":
            current.turn = event.data.turn
            current.ended_ms = now
            ended, current = current, None
        elif kind in _AFTER:
            state = _AFTER[kind]
    if ended is not None:
        out.append(ended)
    return out


def _add(t: TurnTimes, state: str, ms: int) -> None:
    if state == "queue":
        t.queue += ms
    elif state == "hooks":
        t.hooks += ms
    elif state == "ttft":
        t.ttft += ms
    elif state == "stream":
        t.stream += ms
    elif state == "tool":
        t.tool += ms
    elif state == "engine":
        t.engine += ms
    else:
        t.retry += ms


def breakdown(times: Sequence[TurnTimes], commit_ms: Sequence[float] | None = None) -> Breakdown:
    """The percentiles of ``times``' parts, and of ``commit_ms`` (a live run's)."""
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
        commit=summary(commit_ms) if commit_ms else None,
    )


def latency_of(store: Store) -> Breakdown:
    """The breakdown of every ended turn of every session in ``store``."""
    times: list[TurnTimes] = []
    for header in store.sessions():
        times += turn_times(store.read(header.id))
    return breakdown(times)
