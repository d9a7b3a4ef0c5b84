"""runtime.aio: the waiting verbs awaited under a running loop, which they never block."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from runtime import (
    AgentDisposedError,
    AgentSettled,
    Completed,
    ReplyTimeoutError,
    Runtime,
    ScriptedModel,
    aio,
)

from .conftest import WAIT, check_store
from .models import GateModel


async def _ticks_while(awaitable: object, period: float = 0.005) -> tuple[object, int]:
    """Await ``awaitable`` while a ticker counts how often the loop ran it: a blocked
    loop would count (almost) none."""
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(period)

    task = asyncio.create_task(ticker())
    try:
        result = await awaitable  # type: ignore[misc]
    finally:
        stop.set()
        await task
    return result, ticks


def test_the_awaitable_verbs_run_under_a_loop_without_blocking_it(store_path: Path) -> None:
    async def main() -> None:
        rt = Runtime.open(store_path)
        agent = await aio.spawn(rt, model=ScriptedModel(["hi", "again"], latency=0.2))
        reply, ticks = await _ticks_while(aio.ask(agent, "hello", timeout=WAIT))
        assert isinstance(reply, object) and getattr(reply, "text", None) == "hi"
        assert ticks >= 5  # the loop ran the ticker through the 0.2 s reply
        pending = agent.submit("more")
        assert (await pending).text == "again"
        assert await aio.wait_idle(agent, WAIT)
        await aio.flush(rt)
        assert await aio.dispose(agent, WAIT)  # its agent/disposed was emitted
        with pytest.raises(AgentDisposedError, match="is disposed; a wake sent to it is refused"):
            agent.followup("too late")
        await aio.close(rt)

    asyncio.run(main())
    check_store(store_path)


def test_async_fan_in_gathers_and_yields_as_completed(store_path: Path) -> None:
    async def main() -> None:
        rt = Runtime.open(store_path)
        try:
            model = ScriptedModel(lambda r: "ok", latency=ScriptedModel.jittered(0.02, 0.01))
            agents = [await aio.spawn(rt, model=model) for _ in range(10)]
            replies = await aio.gather([a.submit("x") for a in agents], timeout=WAIT)
            assert [r.agent_id for r in replies] == [a.id for a in agents]
            seen = [r.agent_id async for r in aio.as_completed([a.submit("y") for a in agents])]
            assert sorted(seen) == sorted(a.id for a in agents)
            assert await aio.wait_all_idle(agents, WAIT)
        finally:
            await aio.close(rt)

    asyncio.run(main())


def test_async_ask_times_out_and_the_turn_goes_on(store_path: Path) -> None:
    async def main() -> None:
        rt = Runtime.open(store_path)
        try:
            model = GateModel()
            agent = rt.spawn(model=model)
            with pytest.raises(ReplyTimeoutError, match="no reply to message .* within 0.05 s"):
                await aio.ask(agent, "stuck", timeout=0.05)
            assert not await aio.wait_idle(agent, 0.05)
            assert await asyncio.to_thread(model.wait_reached, 1)
            model.release()
            assert await aio.wait_idle(agent, WAIT)
        finally:
            await aio.close(rt)

    asyncio.run(main())


def test_the_event_stream_delivers_settled_events_in_order(store_path: Path) -> None:
    async def main() -> None:
        rt = Runtime.open(store_path)
        try:
            agent = rt.spawn(model=ScriptedModel(["a", "b", "c"]))
            async with aio.events(rt, "agent/settled") as settled:
                for text in ("1", "2", "3"):
                    agent.followup(text)
                turns = []
                async for event in settled:
                    assert isinstance(event, AgentSettled)
                    assert isinstance(event.reason, Completed)
                    turns.append(event.turn)
                    if len(turns) == 3:
                        break
            assert turns == [1, 2, 3] and settled.dropped == 0
        finally:
            await aio.close(rt)

    asyncio.run(main())


def test_a_slow_consumer_loses_the_oldest_events_and_is_told_how_many(store_path: Path) -> None:
    async def main() -> None:
        rt = Runtime.open(store_path)
        try:
            agent = rt.spawn(model=ScriptedModel.echo())
            stream = aio.events(rt, "agent/settled", buffer=2)
            for i in range(5):  # the loop does not run the consumer meanwhile
                agent.followup(str(i))
            await asyncio.to_thread(agent.wait_idle, WAIT)
            await stream.aclose()
            kept = [event.turn async for event in stream]
            assert kept == [4, 5] and stream.dropped == 3
        finally:
            await aio.close(rt)

    asyncio.run(main())


def test_an_event_stream_refuses_a_buffer_under_one(store_path: Path) -> None:
    async def main() -> None:
        rt = Runtime.open(store_path)
        try:
            with pytest.raises(ValueError, match="buffer is an int >= 1"):
                aio.events(rt, "agent/settled", buffer=0)
        finally:
            await aio.close(rt)

    asyncio.run(main())


def test_spawn_under_a_loop_leaves_the_loop_free(store_path: Path) -> None:
    async def main() -> None:
        rt = Runtime.open(store_path)
        try:
            start = time.perf_counter()
            agents = await asyncio.gather(
                *(aio.spawn(rt, model=ScriptedModel.echo()) for _ in range(5))
            )
            assert len({a.id for a in agents}) == 5 and time.perf_counter() - start < WAIT
        finally:
            await aio.close(rt)

    asyncio.run(main())
