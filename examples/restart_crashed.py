"""A supervisor that restarts crashed agents and resumes them from their durable logs.

    corral run examples/restart_crashed.py [AGENTS] [CRASHES]

* The crash is real: ``agent.kill()`` makes the agent's actor fail through pykka's
  failure path in the middle of its turn, as an unexpected error would (a tool or a
  listener cannot crash it: their faults are contained by the contract). The runtime
  sees the death, ends the agent's registration (``agent/disposed``) and records why
  in ``agent.crash``; the open turn stays open in the log.
* The recovery is real: ``rt.resume(session_id, model=...)`` rebuilds the agent from
  its session log (the interrupted tail turn is closed durably as ``interrupted``, turn
  numbers continue), and the supervisor re-sends the unfinished task.

Listeners run on the runtime's threads and must not block, so the ``agent/disposed``
listener only queues the id; the supervisor loop (this script's main thread) does the
restarts, within a restart limit per agent.
"""

from __future__ import annotations

import queue
import random
import threading
import time

from runtime import AgentDisposed, AgentSettled, AgentStatusChanged, Runtime, ScriptedModel

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
        if event.agent.crash is not None:  # type: ignore[attr-defined]
            crashed.put(event.agent.id)  # hand over; never block a listener

    running: set[str] = set()
    victims_running = threading.Event()

    def on_status(event: AgentStatusChanged) -> None:
        if event.status == "running":
            with lock:
                running.add(event.agent.id)
                if victim_ids <= running:
                    victims_running.set()

    rt.on("agent/settled", on_settled)
    rt.on("agent/disposed", on_disposed)
    rt.on("agent/status", on_status)

    agents = [rt.spawn(model=model) for _ in range(count)]
    victims = random.Random(3).sample(agents, min(crashes, count))
    victim_ids = {v.id for v in victims}
    for n, agent in enumerate(agents, start=1):
        tasks[agent.id] = f"task {n}: summarise the quarterly numbers"
        agent.followup(tasks[agent.id])

    # Chaos monkey: crash some agents while their first turn is running.
    if not victims_running.wait(30):
        print("the victims never started running")
        return 1
    for victim in victims:
        print(f"crash  {victim.id} (status {victim.status})")
        victim.kill("chaos monkey")

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
