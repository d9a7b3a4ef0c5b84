"""Fan out: give 1,000 agents one task each. Fan in: wait until every task settled, then
aggregate the answers read back from the agents' session logs.

    corral run examples/fan_out_fan_in.py            # 1,000 agents
    corral run examples/fan_out_fan_in.py 50         # 50 agents

`corral run` hands this script an open runtime and calls `main(rt, argv)`.
"""

from __future__ import annotations

import threading

from runtime import (
    Agent,
    AgentSettled,
    AssistantMessage,
    ModelRequest,
    Runtime,
    ScriptedModel,
    TextBlock,
    UserMessage,
)


def square(request: ModelRequest) -> str:
    """A stand-in for a real model: the task is "square N", the answer is N*N."""
    task = next(m for m in reversed(request.messages) if isinstance(m, UserMessage))
    text = "".join(b.text for b in task.content if isinstance(b, TextBlock))
    number = int(text.split()[-1])
    return str(number * number)


def last_answer(agent: Agent) -> str | None:
    """The text of the agent's last assistant message (its derived model history)."""
    for message in reversed(agent.session.messages()):
        if isinstance(message, AssistantMessage):
            return "".join(b.text for b in message.content if isinstance(b, TextBlock))
    return None


def main(rt: Runtime, argv: list[str]) -> int:
    count = int(argv[0]) if argv else 1000
    # One model instance serves every agent; each request waits 20-80 ms on the event
    # loop (never a thread), so all agents are in flight at once.
    model = ScriptedModel(square, latency=ScriptedModel.jittered(0.05, 0.03, seed=7))

    # Fan-in bookkeeping: count the settled turns of *our* agents. Listeners run on the
    # runtime's threads, so keep them short and thread-safe.
    pending: set[str] = set()
    failed: list[str] = []
    lock = threading.Lock()
    all_settled = threading.Event()

    def on_settled(event: AgentSettled) -> None:
        with lock:
            if event.agent.id not in pending:
                return
            pending.discard(event.agent.id)
            if event.reason.kind != "completed":
                failed.append(f"{event.agent.id}: {event.reason.kind}")
            if not pending:
                all_settled.set()

    stop_listening = rt.on("agent/settled", on_settled)

    # Fan out: spawn, then send each agent its task (followup returns at once).
    agents = [rt.spawn(model=model, system="Answer with the number only.") for _ in range(count)]
    pending.update(a.id for a in agents)
    for n, agent in enumerate(agents, start=1):
        agent.followup(f"square {n}")
    print(f"fan-out: {count} tasks sent")

    if not all_settled.wait(timeout=120):
        print(f"timed out with {len(pending)} tasks still running")
        return 1
    stop_listening()

    # Fan in: read each answer back from the agent's log and aggregate.
    total = sum(int(last_answer(a) or 0) for a in agents)
    expected = sum(n * n for n in range(1, count + 1))
    print(
        f"fan-in: {count - len(failed)} answers, sum of squares = {total:,} "
        f"({'correct' if total == expected else f'expected {expected:,}'})"
    )
    for line in failed[:10]:
        print(f"  failed {line}")
    rt.flush()  # every answer is durable in the store now
    return 0 if total == expected and not failed else 1
