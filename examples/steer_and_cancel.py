"""Steer and cancel agents in the middle of their turns, reading what each send came to.

    corral run examples/steer_and_cancel.py

Three agents share a slow scripted model (0.4 s per request, streamed in 4 chunks):

* **steered** gets a task, and once its first step has started the script steers it
  (`submit(..., steer=True)`): the steering message joins the *next step* of the
  running turn, so the turn takes a second step whose request contains it; the steer's
  reply is that turn's.
* **cancelled** gets a task and is cancelled mid-step: its reply settles `aborted`.
* **cleared** gets three queued follow-ups and is cancelled during the first: without
  `keep_inbox=True`, cancel also discards the two waiting messages (their replies say
  `discarded`).

Synchronised on events, never on sleeps: an `agent/inbox/claimed` listener sets a
`threading.Event` once the agent's turn has claimed its task.
"""

from __future__ import annotations

import threading

from runtime import (
    Agent,
    InboxClaimed,
    ModelRequest,
    Reply,
    Runtime,
    ScriptedModel,
    TextBlock,
    UserMessage,
    gather,
)


def reply(request: ModelRequest) -> str:
    """Answer to every user message the model can see in this turn's request."""
    asks = [
        "".join(b.text for b in m.content if isinstance(b, TextBlock))
        for m in request.messages
        if isinstance(m, UserMessage)
    ]
    return "answering: " + " + ".join(asks[-2:])


def outcome(r: Reply) -> str:
    return r.reason.kind if r.reason is not None else r.status


def main(rt: Runtime, argv: list[str]) -> int:
    model = ScriptedModel(reply, latency=0.4, chunks=4)

    def spawn() -> tuple[Agent, threading.Event]:
        agent, claimed = rt.spawn(model=model), threading.Event()

        def on_claimed(_event: InboxClaimed) -> None:
            claimed.set()

        agent.on("agent/inbox/claimed", on_claimed)
        return agent, claimed

    (steered, steered_running), (cancelled, cancelled_running), (cleared, cleared_running) = (
        spawn(),
        spawn(),
        spawn(),
    )

    # 1. Steer: once the turn runs, add a message to its next step.
    task = steered.submit("write the weekly report")
    steered_running.wait(5)
    steer = steered.submit("also mention the outage on Tuesday", steer=True)

    # 2. Cancel: abort the running turn mid-step.
    translate = cancelled.submit("translate the whole manual")
    cancelled_running.wait(5)
    cancelled.cancel()

    # 3. Cancel with a queue: the active turn is aborted and the queued work discarded.
    queued = [cleared.submit(t) for t in ("task one", "task two", "task three")]
    cleared_running.wait(5)
    cleared.cancel()  # keep_inbox=False (the default) discards "task two" and "task three"

    replies = gather([task, steer, translate, *queued], timeout=20)
    for name, r in zip(
        ["task", "steer", "translate", "task one", "task two", "task three"], replies, strict=True
    ):
        print(f"{name:10} -> {outcome(r):9} turns={list(r.turns)} {r.text!r}")
    outcomes = [outcome(r) for r in replies]
    ok = outcomes == ["completed", "completed", "aborted", "aborted", "discarded", "discarded"]
    ok = ok and replies[0].turns == replies[1].turns and "outage" in replies[1].text
    return 0 if ok else 1
