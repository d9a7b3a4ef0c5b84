"""Steer and cancel agents in the middle of their turns, watching `session/event`.

    corral run examples/steer_and_cancel.py

Three agents share a slow scripted model (0.4 s per request, streamed in 4 chunks):

* **steered** gets a task, and once its first step has started the script steers it:
  the steering message joins the *next step* of the running turn, so the turn takes a
  second step whose request contains it.
* **cancelled** gets a task and is cancelled mid-step: the turn ends
  `aborted {kind: "user"}`.
* **cleared** gets three queued follow-ups and is cancelled during the first: without
  `keep_inbox=True`, cancel also discards the two waiting messages (`outcome: canceled`).

Everything is synchronised on events, never on sleeps: `session/event` listeners set
`threading.Event`s the main thread waits on.
"""

from __future__ import annotations

import threading

from runtime import (
    Agent,
    Event,
    ModelRequest,
    Runtime,
    ScriptedModel,
    SessionEventLive,
    TextBlock,
    UserMessage,
)


def reply(request: ModelRequest) -> str:
    """Answer to every user message the model can see in this turn's request."""
    asks = [
        "".join(b.text for b in m.content if isinstance(b, TextBlock))
        for m in request.messages
        if isinstance(m, UserMessage)
    ]
    return "answering: " + " + ".join(asks[-2:])


def describe(event: Event) -> str:
    data = event.data
    match event.type:
        case "turn/start":
            return f"turn {data.turn} starts ({data.trigger.kind})"
        case "turn/end":
            return f"turn {data.turn} ends: {data.reason.kind}" + (
                f" ({data.reason.reason.kind})" if data.reason.kind == "aborted" else ""
            )
        case "step/start":
            return f"  step {data.step}"
        case "user/message":
            return f"    user: {data.message.content[0].text}"
        case "assistant/message":
            text = "".join(b.text for b in data.message.content if isinstance(b, TextBlock))
            return f"    assistant: {text}" + (" [interrupted]" if data.interrupted else "")
        case "agent/inbox/spliced" if data.outcome == "canceled":
            return f"  inbox: {data.removed_count} queued message(s) canceled"
        case _:
            return ""


def main(rt: Runtime, argv: list[str]) -> int:
    model = ScriptedModel(reply, latency=0.4, chunks=4)
    names: dict[str, str] = {}
    step_started: dict[str, threading.Event] = {}
    print_lock = threading.Lock()

    def watch(live: SessionEventLive) -> None:
        name, event = names.get(live.agent.id), live.event
        if name is None:
            return
        if event.type == "step/start":
            step_started[name].set()
        line = describe(event)
        if line:
            with print_lock:
                print(f"[{name:9}] {line}")

    rt.on("session/event", watch)

    def spawn(name: str) -> Agent:
        agent = rt.spawn(model=model)
        names[agent.id] = name
        step_started[name] = threading.Event()
        return agent

    steered, cancelled, cleared = spawn("steered"), spawn("cancelled"), spawn("cleared")

    # 1. Steer: wait until step 1 is running, then add a message to the next step.
    steered.followup("write the weekly report")
    step_started["steered"].wait(5)
    steered.steer("also mention the outage on Tuesday")

    # 2. Cancel: abort the running turn mid-step.
    cancelled.followup("translate the whole manual")
    step_started["cancelled"].wait(5)
    cancelled.cancel()

    # 3. Cancel with a queue: the active turn is aborted and the queued work discarded.
    for task in ("task one", "task two", "task three"):
        cleared.followup(task)
    step_started["cleared"].wait(5)
    cleared.cancel()  # keep_inbox=False (the default) discards "task two" and "task three"

    for agent in (steered, cancelled, cleared):
        agent.wait_idle(timeout=10)
    rt.flush()

    reasons = {
        names[a.id]: [e.data.reason.kind for e in a.session.events() if e.type == "turn/end"]
        for a in (steered, cancelled, cleared)
    }
    print(f"turn ends: {reasons}")
    ok = reasons == {"steered": ["completed"], "cancelled": ["aborted"], "cleared": ["aborted"]}
    return 0 if ok else 1
