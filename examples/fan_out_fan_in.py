"""Fan out: give 1,000 agents one task each. Fan in: collect each answer as it comes.

    corral run examples/fan_out_fan_in.py            # 1,000 agents
    corral run examples/fan_out_fan_in.py 50         # 50 agents

`corral run` hands this script an open runtime and calls `main(rt, argv)`.
`agent.submit(task)` sends the task and returns a pending reply at once; `gather` waits
for all of them (in the order given) and each `Reply` carries the final text.
"""

from __future__ import annotations

from runtime import ModelRequest, Runtime, ScriptedModel, TextBlock, UserMessage, gather


def square(request: ModelRequest) -> str:
    """A stand-in for a real model: the task is "square N", the answer is N*N."""
    task = next(m for m in reversed(request.messages) if isinstance(m, UserMessage))
    text = "".join(b.text for b in task.content if isinstance(b, TextBlock))
    return str(int(text.split()[-1]) ** 2)


def main(rt: Runtime, argv: list[str]) -> int:
    count = int(argv[0]) if argv else 1000
    # One model instance serves every agent; each request waits 20-80 ms on the event
    # loop (never a thread), so all agents are in flight at once.
    model = ScriptedModel(square, latency=ScriptedModel.jittered(0.05, 0.03, seed=7))
    agents = [rt.spawn(model=model, system="Answer with the number only.") for _ in range(count)]

    pending = [agent.submit(f"square {n}") for n, agent in enumerate(agents, start=1)]
    print(f"fan-out: {count} tasks sent")
    replies = gather(pending, timeout=120)  # ReplyTimeoutError if they are not all in

    failed = [f"{r.agent_id}: {r.status} {r.reason}" for r in replies if not r.ok]
    total = sum(int(r.text or 0) for r in replies)
    expected = sum(n * n for n in range(1, count + 1))
    print(
        f"fan-in: {count - len(failed)} answers, sum of squares = {total:,} "
        f"({'correct' if total == expected else f'expected {expected:,}'})"
    )
    for line in failed[:10]:
        print(f"  failed {line}")
    rt.flush()  # every answer is durable in the store now
    return 0 if total == expected and not failed else 1
