"""A tree of agents: a planner delegates to worker agents through `agent_tool`.

    corral run examples/tree_of_agents.py [SUBTASKS]

`agent_tool(rt, name="worker", model=...)` is a tool whose every call a fresh child
agent answers: the planner's model calls it once per subtask (the calls run in
parallel), each child's reply comes back as the call's result together with the child's
session id, and the planner's last step sums the answers. The parent's `tool/result`
names each child's session (`corral log show <id>` reads it); cancelling the planner's
turn would cancel every child's (`ParentCause`).
"""

from __future__ import annotations

import json

from runtime import (
    ModelRequest,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolCall,
    ToolMessage,
    UserMessage,
    agent_tool,
)


def last_user_text(request: ModelRequest) -> str:
    task = next(m for m in reversed(request.messages) if isinstance(m, UserMessage))
    return "".join(b.text for b in task.content if isinstance(b, TextBlock))


def worker_model(request: ModelRequest) -> str:
    """A worker: "count the letters of WORD" -> the count."""
    return str(len(last_user_text(request).split()[-1]))


def planner_model(subtasks: list[str]) -> ScriptedModel:
    def plan(request: ModelRequest) -> str | list[ToolCall]:
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not results:  # step 1: delegate every subtask
            return [ToolCall("worker", {"task": f"count the letters of {w}"}) for w in subtasks]
        answers = [json.loads(r.content[0].text)["reply"] for r in results]  # step 2
        return f"total letters: {sum(int(a) for a in answers)}"

    return ScriptedModel(plan, latency=0.05)


def main(rt: Runtime, argv: list[str]) -> int:
    words = ["planner", "worker", "delegation", "tree", "corral"][: int(argv[0]) if argv else 5]
    worker = agent_tool(
        rt,
        name="worker",
        model=ScriptedModel(worker_model, latency=0.05),
        description=("Give one subtask to a worker agent; returns its answer and its session id."),
    )
    planner = rt.spawn(model=planner_model(words), tools=[worker])
    reply = planner.ask("How many letters in all these words?", timeout=30)
    print(f"planner ({planner.id}): {reply.text}")
    for event in planner.session.events():
        if event.type == "tool/result":
            result = json.loads(event.data.message.content[0].text)
            print(f"  worker {result['session']}: {result['reply']} ({result['reason']})")
    expected = f"total letters: {sum(len(w) for w in words)}"
    return 0 if reply.ok and reply.text == expected else 1
