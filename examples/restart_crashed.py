"""A supervisor that restarts crashed agents and resumes them from their durable logs.

    corral run examples/restart_crashed.py [AGENTS] [CRASHES]

What is real here and what is simulated:

* corral offers no public way yet to crash an agent *actor* on purpose: a tool or a
  listener cannot (their faults are contained by the contract), and the runtime exposes
  no actor-failure hook. So the "chaos monkey" below **simulates** a crash by disposing
  the agent abruptly in the middle of its turn: the turn ends ``aborted {disposed}`` and
  the actor is gone, exactly what a supervisor sees after a crash (``agent/disposed``
  for an agent it did not stop itself).
* The recovery is real: ``rt.resume(session_id, model=...)`` rebuilds the agent from
  its session log (turn numbers continue; an open tail turn - after a process crash -
  is closed durably as ``interrupted``), and the supervisor re-sends the unfinished task.

Listeners run on the runtime's threads and must not block, so the ``agent/disposed``
listener only queues the id; the supervisor loop (this script's main thread) does the
restarts, within a restart limit per agent.
"""

from __future__ import annotations

import queue
import random
import threading
import time

from actors.live import AgentDisposed, AgentSettled
from runtime import Runtime, ScriptedModel

MAX_RESTARTS = 3


def main(rt: Runtime, argv: list[str]) -> int:
    count = int(argv[0]) if argv else 20
    crashes = int(argv[1]) if len(argv) > 1 else 5
    # Slow enough (0.3 s per request) that the chaos monkey catches agents mid-turn.
    model = ScriptedModel.echo(latency=0.3, chunks=3)

    tasks: dict[str, str] = {}
    completed: set[str] = set()
    restarts: dict[str, int] = {}
    crashed: queue.Queue[str] = queue.Queue()
    lock = threading.Lock()
    all_done = threading.Event()

    def on_settled(event: AgentSettled) -> None:
        if event.reason.kind == "completed":
            with lock:
                completed.add(event.agent.id)
                if len(completed) == len(tasks):
                    all_done.set()

    def on_disposed(event: AgentDisposed) -> None:
        if event.agent.id in tasks and event.agent.id not in completed:
            crashed.put(event.agent.id)  # hand over; never block a listener

    rt.on("agent/settled", on_settled)
    rt.on("agent/disposed", on_disposed)

    agents = [rt.spawn(model=model) for _ in range(count)]
    for n, agent in enumerate(agents, start=1):
        tasks[agent.id] = f"task {n}: summarise the quarterly numbers"
        agent.followup(tasks[agent.id])

    # Chaos monkey: "crash" some agents while their first turn is running (simulated).
    victims = random.Random(3).sample(agents, min(crashes, count))
    time.sleep(0.1)
    for victim in victims:
        print(f"crash  {victim.id} (status {victim.status})")
        victim.dispose(timeout=5)

    # Supervisor loop: restart each crashed agent from its log, re-send its task.
    deadline = time.monotonic() + 60
    while not all_done.is_set():
        if time.monotonic() > deadline:
            print(f"timed out: {len(completed)}/{len(tasks)} tasks completed")
            return 1
        try:
            agent_id = crashed.get(timeout=0.1)
        except queue.Empty:
            continue
        restarts[agent_id] = restarts.get(agent_id, 0) + 1
        if restarts[agent_id] > MAX_RESTARTS:
            print(f"give up {agent_id} after {MAX_RESTARTS} restarts")
            return 1
        agent = rt.resume(agent_id, model=model)  # rebuilt from its durable log
        print(
            f"resume {agent_id} (restart #{restarts[agent_id]}; its log ends after turn "
            f"{agent.session.state.last_turn})"
        )
        agent.followup(tasks[agent_id])  # the task did not complete: send it again

    # The logs tell the story: the crashed turn, then the resumed one.
    for victim in victims:
        agent = rt.get(victim.id)
        ends = [
            f"turn {e.data.turn} {e.data.reason.kind}"
            for e in agent.session.events()
            if e.type == "turn/end"
        ]
        print(f"log    {victim.id}: {' -> '.join(ends)}")
    print(f"{len(completed)}/{len(tasks)} tasks completed, {sum(restarts.values())} restart(s)")
    return 0 if len(completed) == len(tasks) else 1
