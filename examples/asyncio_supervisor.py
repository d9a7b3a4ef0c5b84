"""An asyncio supervisor: spawn, ask, fan in and watch events without blocking its loop.

    corral run examples/asyncio_supervisor.py [AGENTS]

`corral run` runs an `async def main(rt, argv)` in its own event loop. `runtime.aio`
has the awaitable form of each verb that waits (`spawn`, `ask`, `gather`,
`as_completed`, `wait_idle`, `dispose`, `flush`, `close`); `await agent.submit(...)`
works too. `aio.events(rt, "agent/settled")` is a bounded async iterator over a live
event (a slow consumer loses the oldest events, counted in `.dropped`). A ticker task
shows the loop stays free while the agents work.
"""

from __future__ import annotations

import asyncio

from runtime import AgentSettled, Runtime, ScriptedModel, aio


async def main(rt: Runtime, argv: list[str]) -> int:
    count = int(argv[0]) if argv else 10
    model = ScriptedModel(lambda r: "ok", latency=ScriptedModel.jittered(0.2, 0.1, seed=5))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    tick_task = asyncio.create_task(ticker())
    agents = await asyncio.gather(*(aio.spawn(rt, model=model) for _ in range(count)))

    settled: list[AgentSettled] = []
    async with aio.events(rt, "agent/settled") as stream:

        async def watch() -> None:
            async for event in stream:
                settled.append(event)

        watcher = asyncio.create_task(watch())
        first = await aio.ask(agents[0], "hello", timeout=30)
        print(f"ask: {first.text!r} in turn {first.turns}")
        async for reply in aio.as_completed([a.submit("task") for a in agents], timeout=30):
            print(f"  {reply.agent_id}: {reply.text}")
        assert await aio.wait_all_idle(agents, timeout=30)
    await watcher  # (the stream's close ended it)
    await aio.flush(rt)
    await asyncio.gather(*(aio.dispose(a, timeout=10) for a in agents))
    tick_task.cancel()
    print(f"{len(settled)} settled events ({stream.dropped} dropped), loop ticked {ticks} times")
    return 0 if len(settled) == count + 1 and ticks > 10 else 1
