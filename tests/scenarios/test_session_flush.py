"""``session/flush``, the parallel durability checkpoint (CONTRACT 7, seed 001): once per
settled turn, before ``agent/settled``, with the seq range that became durable; its
listeners run in parallel and are awaited; a failing one is contained."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime, ScriptedModel

from .conftest import WAIT, Timeline
from .models import GateModel


def test_each_settled_turn_passes_one_checkpoint_before_agent_settled_covering_its_turn_end(
    rt: Runtime, store_path: Path
) -> None:
    order: list[tuple[str, Any]] = []
    lock = threading.Lock()

    def on_flush(event: Any) -> None:
        # Another process reads the store: what it sees is on disk.
        code = (
            "import sys; from storage import Store\n"
            "with Store.open(sys.argv[1], readonly=True) as st:\n"
            "    print(st.stats(sys.argv[2]).event_count - 1)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(store_path), event.agent.id],
            capture_output=True,
            text=True,
            timeout=WAIT * 3,
            check=True,
        )
        durable = int(done.stdout)
        with lock:
            order.append(("flush", (event.first_seq, event.last_seq, durable)))

    def on_settled(event: Any) -> None:
        with lock:
            order.append(("settled", event.turn))

    rt.on("session/flush", on_flush)
    rt.on("agent/settled", on_settled)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("one")
    assert agent.wait_idle(WAIT)
    agent.followup("two")
    assert agent.wait_idle(WAIT)
    ends = [e.seq for e in agent.session.events() if e.type == "turn/end"]
    assert [kind for kind, _ in order] == ["flush", "settled", "flush", "settled"]
    (first, last1, durable1), (second, last2, durable2) = order[0][1], order[2][1]
    assert first == 0  # a new session: everything since it went live
    assert last1 == ends[0] and durable1 >= last1
    assert second == last1 + 1 and last2 == ends[1] and durable2 >= last2


def test_async_and_sync_listeners_run_in_parallel_and_are_awaited_before_settled(
    rt: Runtime,
) -> None:
    started = threading.Event()
    finished: list[str] = []
    loop_barrier: list[asyncio.Barrier] = []

    async def first(event: Any) -> None:
        if not loop_barrier:
            loop_barrier.append(asyncio.Barrier(2))
        started.set()
        await asyncio.wait_for(loop_barrier[0].wait(), WAIT)  # both async ones at once
        finished.append("first")

    async def second(event: Any) -> None:
        if not loop_barrier:
            loop_barrier.append(asyncio.Barrier(2))
        await asyncio.wait_for(loop_barrier[0].wait(), WAIT)
        finished.append("second")

    def sync(event: Any) -> None:
        assert started.wait(WAIT)  # runs while an async one is in flight
        finished.append("sync")

    settled: list[list[str]] = []
    rt.on("session/flush", sync)
    rt.on("session/flush", first)
    rt.on("session/flush", second)
    rt.on("agent/settled", lambda e: settled.append(sorted(finished)))
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    assert settled == [["first", "second", "sync"]]


def test_a_failing_listener_is_contained_and_the_others_still_run(
    rt: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []

    def broken(event: Any) -> None:
        raise RuntimeError("exporter down")

    async def broken_async(event: Any) -> None:
        raise RuntimeError("async exporter down")

    rt.on("session/flush", broken)
    rt.on("session/flush", broken_async)
    rt.on("session/flush", lambda e: seen.append("after"))
    timeline = Timeline(rt)
    agent = rt.spawn(model=ScriptedModel.echo())
    with caplog.at_level(logging.ERROR, logger="corral.bus"):
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
    timeline.wait_for("agent/settled", 1)
    assert [s.reason.kind for s in timeline.of("agent/settled")] == ["completed"]
    assert seen == ["after"]
    text = caplog.text
    assert "exporter down" in text and "async exporter down" in text


def test_an_aborted_turn_still_awaits_its_checkpoint(rt: Runtime) -> None:
    model = GateModel()
    done = threading.Event()

    async def slow(event: Any) -> None:
        await asyncio.sleep(0)
        done.set()

    rt.on("session/flush", slow)
    settled: list[tuple[str, bool]] = []
    rt.on("agent/settled", lambda e: settled.append((e.reason.kind, done.is_set())))
    agent = rt.spawn(model=model)
    agent.followup("hi")
    assert model.wait_reached(1)
    agent.cancel()
    assert agent.wait_idle(WAIT)
    assert settled == [("aborted", True)]


def test_a_scoped_listener_sees_only_its_agents_checkpoints(rt: Runtime) -> None:
    a = rt.spawn(model=ScriptedModel.echo())
    b = rt.spawn(model=ScriptedModel.echo())
    seen: list[str] = []
    a.on("session/flush", lambda e: seen.append(e.agent.id))
    a.followup("x")
    b.followup("y")
    assert a.wait_idle(WAIT) and b.wait_idle(WAIT)
    assert seen == [a.id]


def test_without_durability_there_is_no_checkpoint(store_path: Path) -> None:
    with Runtime.open(store_path, durability="none") as rt:
        seen: list[Any] = []
        rt.on("session/flush", seen.append)
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("x")
        assert agent.wait_idle(WAIT)
        assert seen == []
