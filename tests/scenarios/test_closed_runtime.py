"""Scenario tests of a closed runtime: every public method of it and of its agents'
handles refuses with one error, ``RuntimeClosedError``, that says so."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pykka import ActorRegistry

from runtime import (
    Agent,
    AgentDisposedError,
    Runtime,
    RuntimeClosedError,
    ScriptedModel,
    ToolCall,
    gctune,
    tool,
    waiting,
)
from runtime.close import CloseStages, Deadline, Stage
from storage.errors import StoreClosedError
from storage.lmdb.writer import LogWriter

from .conftest import WAIT, check_store


def _runtime_calls(rt: Runtime) -> dict[str, Callable[[], Any]]:
    model = ScriptedModel.echo()
    return {
        "spawn": lambda: rt.spawn(model=model),
        "resume": lambda: rt.resume("a", model=model),
        "fork": lambda: rt.fork("a", 0, model=model),
        "get": lambda: rt.get("a"),
        "agents": rt.agents,
        "on": lambda: rt.on("agent/settled", print),
        "passivate_idle": rt.passivate_idle,
        "flush": rt.flush,
        "aflush": lambda: asyncio.run(rt.aflush()),
    }


def _handle_calls(agent: Agent) -> dict[str, Callable[[], Any]]:
    return {
        "followup": lambda: agent.followup("x"),
        "steer": lambda: agent.steer("x"),
        "inject": lambda: agent.inject("x"),
        "remove": lambda: agent.remove("nope"),
        "replace": lambda: agent.replace("nope", "y"),
        "splice": lambda: agent.splice("next-turn", 0, 0, ["z"]),
        "clear": agent.clear,
        "cancel": agent.cancel,
        "passivate": agent.passivate,
        "kill": agent.kill,
        "on": lambda: agent.on("agent/settled", print),
        "inbox": lambda: agent.inbox,
        "session": lambda: agent.session,
    }


@pytest.mark.parametrize("passivated", [False, True], ids=["live", "passivated"])
def test_every_method_of_a_closed_runtime_and_of_its_agents_handles_says_it_is_closed(
    store_path: Path, passivated: bool
) -> None:
    # Before: spawn/resume/fork/on raised RuntimeError, flush StoreClosedError, get a
    # KeyError that did not mention the close, agents() and passivate_idle() answered
    # [] and 0; a handle's sends said "disposed", its cancel returned quietly, its
    # session could be read until its events() failed on the closed store, and a
    # passivated agent's cancel/clear/inbox/session said "closed" while its followup
    # said "disposed".
    rt = Runtime.open(store_path)
    agent = rt.spawn(model=ScriptedModel.echo(), session_id="a")
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    if passivated:
        assert agent.passivate()
    rt.close()
    refused = {}
    for name, call in {**_runtime_calls(rt), **_handle_calls(agent)}.items():
        with pytest.raises(RuntimeClosedError, match="runtime is closed") as raised:
            call()
        refused[name] = raised.value
    # the errors these calls raised before: code that catches them goes on working
    error = refused["flush"]
    assert isinstance(error, RuntimeError)
    assert isinstance(error, StoreClosedError)
    assert isinstance(error, AgentDisposedError)
    # close and dispose are idempotent; a closed runtime's agents are idle for good
    rt.close()
    assert agent.dispose(WAIT)
    assert agent.wait_idle(WAIT)
    assert agent.status == "idle"
    assert agent.disposed
    check_store(store_path)


def test_an_agent_disposed_listener_that_close_triggers_may_still_read_the_session(
    store_path: Path,
) -> None:
    rt = Runtime.open(store_path)
    read: list[int] = []
    rt.on("agent/disposed", lambda event: read.append(len(event.agent.session.messages())))
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    rt.close()
    assert read == [2]
    with pytest.raises(RuntimeClosedError, match="this runtime is closed"):
        _ = agent.session  # once close returned, it is refused
    check_store(store_path)


def _corral_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("corral"))


def test_a_close_that_fails_part_way_closes_the_rest_and_a_second_close_finishes_it(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, a close whose registry stop raised (an OverflowError of a huge timeout)
    # had stopped the agents but left the dispatcher, the I/O loop, the log writer and
    # the store open; a second close() did nothing, and the store could never be
    # opened again in the process.
    before = _corral_threads()
    rt = Runtime.open(store_path)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    run_stage = rt._closing.stages.run_stage
    calls = []

    def fails_once(stage: Stage, deadline: Deadline) -> None:
        if stage.name == "registry":
            calls.append(deadline.timeout)
            if len(calls) == 1:
                raise OverflowError("the registry's stop failed")
        run_stage(stage, deadline)

    monkeypatch.setattr(rt._closing.stages, "run_stage", fails_once)
    with pytest.raises(OverflowError, match="registry's stop failed"):
        rt.close()
    assert agent.disposed
    assert rt._table.registry.is_alive()  # the stage that failed
    with Runtime.open(store_path):  # every stage after it ran: the store was let go of
        pass
    assert _corral_threads() == before
    rt.close()  # finishes what is left: the failed stage, again
    assert len(calls) == 2
    assert not rt._table.registry.is_alive()
    assert rt._table.registry not in ActorRegistry.get_all()
    rt.close()  # and then has nothing left to do
    assert len(calls) == 2
    check_store(store_path)


def test_a_ctrl_c_in_the_store_stage_is_finished_by_a_second_close(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, a Ctrl-C while close() waited for the log's last flush left the store
    # marked closed but its writer thread, environment and writer lock held: the
    # second close() reported success and the store could not be opened again in
    # the process.
    before = _corral_threads()
    rt = Runtime.open(store_path)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    flush = LogWriter.flush
    main = threading.main_thread()

    def interrupted(self: LogWriter, timeout: float | None = None) -> None:
        stages = rt._closing.stages
        if threading.current_thread() is main and "store" in stages.left and stages.running:
            raise KeyboardInterrupt  # what SIGINT does in the flush's wait
        flush(self, timeout)

    monkeypatch.setattr(LogWriter, "flush", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rt.close()
    assert rt._closing.stages.left == ["store"]
    monkeypatch.setattr(LogWriter, "flush", flush)
    rt.close()
    assert rt._closing.stages.left == []
    assert _corral_threads() == before
    with Runtime.open(store_path):  # the store was let go of
        pass
    check_store(store_path)


def test_a_close_whose_starts_stage_failed_disposes_the_agents_and_finishes_later(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, a "starts" stage interrupted before it took the agents to stop (a Ctrl-C
    # while its lock was busy) left the next stages an empty list: "agents" and
    # "stragglers" disposed of nothing and were marked done, so the agents were only
    # stopped by the registry's stop, with no disposal, and no later close disposed of
    # them either.
    rt = Runtime.open(store_path)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    run_stage = CloseStages.run_stage
    calls: list[str] = []

    def interrupted(self: CloseStages, stage: Stage, deadline: Deadline) -> None:
        calls.append(stage.name)
        if stage.name == "starts" and calls.count("starts") == 1:
            raise KeyboardInterrupt  # before it did anything
        run_stage(self, stage, deadline)

    monkeypatch.setattr(CloseStages, "run_stage", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rt.close()
    assert agent.disposed  # disposed of all the same
    assert rt._closing.stages.left == ["starts", "agents", "stragglers"]  # not done: run again
    rt.close()
    assert rt._closing.stages.left == []
    assert calls.count("agents") == 2 and calls.count("registry") == 1
    check_store(store_path)


def test_the_gc_stage_releases_this_runtimes_tuning_once_even_when_run_again(
    store_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, a Ctrl-C after the "gc" stage released the tuning but before close marked
    # it done made the next close release it again: another runtime's tuning (the
    # thresholds went back to the defaults while that runtime ran).
    tuned = gctune._tuner.users
    one, two = Runtime.open(store_path), Runtime.open(tmp_path / "two")
    assert gctune._tuner.users == tuned + 2
    run_stage = CloseStages.run_stage

    def interrupted(self: CloseStages, stage: Stage, deadline: Deadline) -> None:
        run_stage(self, stage, deadline)
        if stage.name == "gc" and self is one._closing.stages and "gc" in self.left:
            raise KeyboardInterrupt  # once it released, before it is marked done

    monkeypatch.setattr(CloseStages, "run_stage", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            one.close()
        assert one._closing.stages.left == ["gc"]
        monkeypatch.undo()
        one.close()
        assert gctune._tuner.users == tuned + 1  # the other runtime's tuning holds
    finally:
        two.close()
    assert gctune._tuner.users == tuned


def test_a_ctrl_c_while_close_waits_for_the_disposals_says_so_as_it_stops_the_agents(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Before, the stage after an interrupted wait stopped every agent at once with the
    # warning "did not stop within 30 s" (after 0.2 s): it said nothing of the Ctrl-C.
    # (What the wait saw of the Ctrl-C is what runtime.waiting raises in its slices.)
    rt = Runtime.open(store_path)
    started, release = threading.Event(), threading.Event()

    @tool
    def stuck() -> str:
        started.set()
        release.wait(WAIT)
        return "late"

    agent = rt.spawn(model=ScriptedModel([[ToolCall(name="stuck")], "after"]), tools=[stuck])
    agent.followup("go")
    assert started.wait(WAIT)

    def interrupted(*_: object) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(waiting, "wait", interrupted)
    try:
        with caplog.at_level(logging.WARNING, logger="corral.runtime"):
            with pytest.raises(KeyboardInterrupt):
                rt.close(timeout=0.5)  # (the I/O stage waits for the tool body by then)
        assert f"agent {agent.id} had not stopped when close was interrupted" in caplog.text
        assert "KeyboardInterrupt" in caplog.text
        assert "did not stop within" not in caplog.text
    finally:
        release.set()
        monkeypatch.undo()
    rt.close()
    assert rt._closing.stages.left == []


def test_the_store_errors_the_readme_names_are_exported_from_runtime() -> None:
    # Before, the README named StoreClosedError and ReentrantAppendError, which only
    # storage exported: `from runtime import StoreClosedError` failed.
    import runtime
    import storage

    assert runtime.StoreClosedError is storage.StoreClosedError
    assert runtime.ReentrantAppendError is storage.ReentrantAppendError
    assert {"StoreClosedError", "ReentrantAppendError"} <= set(runtime.__all__)
    assert issubclass(RuntimeClosedError, runtime.StoreClosedError)
