"""Supervised agents: crashed agents are resumed from their durable logs by the runtime.

    corral run examples/restart_crashed.py [AGENTS] [CRASHES]

* `rt.spawn(..., restart=RestartPolicy(...))` puts an agent under the runtime's
  supervisor: when its actor crashes, it is resumed from its log after a backoff (with
  jitter, on the runtime's scheduler), at most `max_restarts` times in `within_s`.
* The crash is real: `agent.kill()` makes the actor fail mid-turn as an unexpected error
  would. `agent/disposed` (with `agent.crash`) says it went down; `agent/restart` says
  it came back (`kind="restarted"`, with the new handle and the turn the crash cut
  short) or stayed down (`kind="gave-up"`).
* The interrupted turn is reported, not re-run (its tools may have run): the script
  re-sends the task to the new handle, which continues the same log.
"""

from __future__ import annotations

import queue
import random

from runtime import AgentRestart, PendingReply, RestartPolicy, Runtime, ScriptedModel, gather


def main(rt: Runtime, argv: list[str]) -> int:
    count = int(argv[0]) if argv else 20
    crashes = int(argv[1]) if len(argv) > 1 else 5
    # Slow enough (0.3 s per request) that the chaos monkey catches agents mid-turn.
    model = ScriptedModel.echo(latency=0.3, chunks=3)
    policy = RestartPolicy(max_restarts=3, within_s=60, backoff_s=0.05)

    resent: queue.Queue[PendingReply] = queue.Queue()

    def on_restart(event: AgentRestart) -> None:  # (on a runtime thread: keep it short)
        print(f"{event.kind} {event.agent.id} (restart #{event.restarts}, after {event.error})")
        if event.kind == "restarted":  # the task did not complete: send it again
            resent.put(event.agent.submit(tasks[event.agent.id]))

    rt.on("agent/restart", on_restart)
    agents = [rt.spawn(model=model, restart=policy) for _ in range(count)]
    tasks = {a.id: f"task {n}: summarise the quarterly numbers" for n, a in enumerate(agents)}
    first = [a.submit(tasks[a.id]) for a in agents]

    # Chaos monkey: crash some agents while their first turn is running.
    for victim in random.Random(3).sample(agents, min(crashes, count)):
        victim.kill("chaos monkey")

    replies = gather(first, timeout=60)
    crashed = [r.agent_id for r in replies if r.status == "crashed"]
    again = gather([resent.get(timeout=30) for _ in crashed], timeout=60)
    done = sum(r.ok for r in replies) + sum(r.ok for r in again)

    for agent_id in crashed:  # the logs tell the story: the crashed turn, then the new one
        ends = [
            f"turn {e.data.turn} {e.data.reason.kind}"
            for e in rt.get(agent_id).session.events()
            if e.type == "turn/end"
        ]
        print(f"log {agent_id}: {' -> '.join(ends)}")
    print(f"{done}/{count} tasks completed, {len(crashed)} restart(s)")
    return 0 if done == count else 1
