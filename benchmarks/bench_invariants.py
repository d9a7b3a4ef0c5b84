"""The invariant checker (``check_invariants``, ``corral log check``) over a session with
many pending inbox messages: the time per message must stay flat as the inbox grows.

Two logs per size N: ``pending`` (N followups inserted and never claimed: an agent that
was sent N messages while busy) and ``drained`` (the same N, then N one-message turns,
each claiming the front of the lane). The baseline, measured in the same run, is the
checker's own time per message at the smallest size; each row's ``x base`` is its time per
message over that one (1.0: linear). ``--naive`` also times, at the sizes up to 20,000,
the pending-set rebuild per splice that the checker did before (for the ratio it had:
it grew with N).

Run: ``python benchmarks/bench_invariants.py [--sizes 10000,20000,100000] [--repeats 3]
[--naive] [--json PATH]``
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from functools import partial

from _common import median, parser, print_table, timed, write_json

from storage import (
    AgentInboxSpliced,
    Completed,
    Event,
    MessageTrigger,
    TextBlock,
    TurnEnd,
    TurnStart,
    UserMessage,
    check_invariants,
)


def pending_log(n: int) -> list[Event]:
    """N followups inserted at the end of ``next-turn``, none claimed."""
    return [
        Event(
            "agent/inbox/spliced",
            seq,
            seq,
            AgentInboxSpliced(
                target="next-turn",
                start=seq,
                inserted=(UserMessage(id=f"m{seq}", content=(TextBlock(text="hi"),)),),
            ),
        )
        for seq in range(n)
    ]


def drained_log(n: int) -> list[Event]:
    """The pending log, then N turns, each claiming the front message of the lane."""
    events = pending_log(n)
    seq = n
    for turn in range(1, n + 1):
        for data in (
            TurnStart(turn=turn, trigger=MessageTrigger()),
            AgentInboxSpliced(target="next-turn", start=0, removed_count=1),
            TurnEnd(turn=turn, reason=Completed()),
        ):
            kind = {TurnStart: "turn/start", TurnEnd: "turn/end"}.get(
                type(data), "agent/inbox/spliced"
            )
            events.append(Event(kind, seq, seq, data))
            seq += 1
    return events


def naive_pending(events: list[Event]) -> None:
    """What the checker did per splice before: rebuild the set of every pending id."""
    lanes: dict[str, list[str]] = {"next-turn": [], "next-step": []}
    for event in events:
        data = event.data
        if type(data) is not AgentInboxSpliced:
            continue
        lane = lanes[data.target]
        pending = {*lanes["next-turn"], *lanes["next-step"]}
        pending.difference_update(lane[data.start : data.start + data.removed_count])
        ids = [m.id for m in data.inserted]
        lane[data.start : data.start + data.removed_count] = ids


def measure(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        times.append(timed(fn))
    return median(times)


def main() -> None:
    p = parser("check_invariants over many pending inbox messages", repeats=3)
    p.add_argument("--sizes", default="10000,20000,100000")
    p.add_argument("--naive", action="store_true", help="also time the old per-splice rebuild")
    opts = p.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",")]
    rows = []
    results: dict[str, object] = {"sizes": sizes, "cases": []}
    base: float | None = None
    for n in sizes:
        for name, build in (("pending", pending_log), ("drained", drained_log)):
            events = build(n)
            found = check_invariants(events, allow_open_tail=True)
            assert found == [], found[:3]
            seconds = measure(partial(check_invariants, events, allow_open_tail=True), opts.repeats)
            per = seconds / n * 1e6
            if base is None:
                base = per
            rows.append([name, n, len(events), seconds, per, per / base])
            results["cases"].append(  # type: ignore[attr-defined]
                {
                    "log": name,
                    "messages": n,
                    "events": len(events),
                    "s": seconds,
                    "us_per_message": per,
                    "x_base": per / base,
                }
            )
        if opts.naive and n <= 20000:
            events = pending_log(n)
            seconds = measure(partial(naive_pending, events), 1)
            per = seconds / n * 1e6
            rows.append(["pending, old rebuild", n, len(events), seconds, per, per / base])
            results["cases"].append(  # type: ignore[attr-defined]
                {
                    "log": "pending-naive",
                    "messages": n,
                    "s": seconds,
                    "us_per_message": per,
                    "x_base": per / base,
                }
            )
    print_table(["log", "messages", "events", "check s", "us/message", "x base"], rows)
    write_json(opts.json, "bench_invariants", results)


if __name__ == "__main__":
    main()
