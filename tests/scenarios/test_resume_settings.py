"""Scenario tests of what a resume or a fork takes from the log (the session log is the
single source of truth) and of the handle it returns (a new one: README, ``.on``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from actors.model import ModelRequest
from runtime import AgentDisposedError, Runtime, ScriptedModel
from storage.errors import UnknownSessionError

from .conftest import WAIT, check_store


def _recording(seen: list[str | None]) -> ScriptedModel:
    """An echo-like model that records the system prompt of every request."""

    def reply(request: ModelRequest) -> str:
        seen.append(request.system)
        return "ok"

    return ScriptedModel(reply)


def _logged_systems(rt: Runtime, session_id: str) -> list[str | None]:
    return [e.data.system for e in rt.store.read(session_id) if e.type == "request/header"]


def test_a_resumed_agent_keeps_the_system_prompt_its_log_recorded(store_path: Path) -> None:
    seen: list[str | None] = []
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=_recording(seen), system="You are a pirate.", session_id="p")
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
    with Runtime.open(store_path) as rt:  # a new process would know only the log
        agent = rt.resume("p", model=_recording(seen))
        agent.followup("again")
        assert agent.wait_idle(WAIT)
        rt.flush()
        # the same prompt: no second request/header was needed for it
        assert _logged_systems(rt, "p") == ["You are a pirate."]
    assert seen == ["You are a pirate.", "You are a pirate."]
    check_store(store_path)


def test_a_fork_child_keeps_the_system_prompt_of_the_prefix_it_was_seeded_with(
    rt: Runtime,
) -> None:
    seen: list[str | None] = []
    parent = rt.spawn(model=_recording(seen), system="SYS", session_id="parent")
    parent.followup("x")
    assert parent.wait_idle(WAIT)
    child = rt.fork("parent", parent.session.last_seq, model=_recording(seen))
    child.followup("y")
    assert child.wait_idle(WAIT)
    assert seen == ["SYS", "SYS"]


def test_a_system_prompt_given_to_resume_replaces_the_logged_one_and_the_log_records_it(
    store_path: Path,
) -> None:
    seen: list[str | None] = []
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=_recording(seen), system="old", session_id="s")
        agent.followup("one")
        assert agent.wait_idle(WAIT)
        agent.dispose(WAIT)
        agent = rt.resume("s", model=_recording(seen), system="new")
        agent.followup("two")
        assert agent.wait_idle(WAIT)
        agent.dispose(WAIT)
        agent = rt.resume("s", model=_recording(seen))  # the log says "new" now
        agent.followup("three")
        assert agent.wait_idle(WAIT)
        rt.flush()
        assert _logged_systems(rt, "s") == ["old", "new"]
    assert seen == ["old", "new", "new"]
    check_store(store_path)


def test_listening_through_a_disposed_agents_handle_is_refused_after_its_session_was_resumed(
    rt: Runtime,
) -> None:
    old = rt.spawn(model=ScriptedModel.echo(), session_id="a")
    assert old.dispose(WAIT)
    new = rt.resume("a", model=ScriptedModel.echo())
    with pytest.raises(AgentDisposedError, match="resumed"):
        old.on("agent/settled", lambda event: None)
    with pytest.raises(AgentDisposedError, match="is disposed"):
        old.followup("x")  # as sends through it are
    seen: list[bool] = []
    new.on("agent/settled", lambda event: seen.append(event.agent is new))
    new.followup("hi")
    assert new.wait_idle(WAIT)
    assert seen == [True]


@pytest.mark.parametrize("verb", ["resume", "fork"])
def test_resuming_or_forking_a_session_that_does_not_exist_says_how_a_runtime_starts_one(
    rt: Runtime, verb: str
) -> None:
    start: Callable[[], object]
    if verb == "resume":
        start = partial(rt.resume, "nope", model=ScriptedModel.echo())
    else:
        start = partial(rt.fork, "nope", 0, model=ScriptedModel.echo())
    with pytest.raises(UnknownSessionError) as raised:
        start()
    message = str(raised.value)
    assert "rt.spawn(session_id='nope'" in message
    assert "create_session" not in message  # a Store method: not the runtime's way
    with pytest.raises(UnknownSessionError, match="create_session"):
        rt.store.open_session("nope")  # the store's own message is for Store users
