"""The per-turn shortcuts keep the contract: sends checked exactly, payloads built only
for listeners yet seen by a listener added at any time, turn numbers and headers kept
across turns, and an unexpected fault still crashes the agent through pykka's path."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from actors.events import InboxClaimed, InboxInserted
from actors.inbox import Inbox
from actors.turn.request import HeaderLog
from runtime import InvalidMessageError, Runtime, ScriptedModel
from storage.errors import StorageError
from storage.events import AgentInboxSpliced, TextBlock, UserMessage

from .conftest import WAIT, check_store


class _Agent:
    id = "a"


def _message(message_id: str) -> UserMessage:
    return UserMessage(id=message_id, content=(TextBlock(text=message_id),))


def test_text_sends_are_checked_exactly_around_the_event_limit(store_path: Path) -> None:
    limit = 4096
    with Runtime.open(store_path, max_event_bytes=limit) as rt:
        agent = rt.spawn(model=ScriptedModel(lambda r: "ok"))
        accepted = [
            "short",
            "a" * 1000,  # over the 6-bytes-a-character bound, well under the limit
            "\x01" * 600,  # ASCII control characters: 6 bytes each once encoded
            "h\u00e9llo",  # not ASCII: the full check
        ]
        for text in accepted:
            agent.followup(text)
            assert agent.wait_idle(WAIT)
            assert agent.session.messages()[-2].content[0].text == text
        for text in ("a" * 5000, "\x01" * 700, "\ud800"):
            with pytest.raises(
                InvalidMessageError, match="over the 4096-byte event limit|surrogates not allowed"
            ):
                agent.followup(text)
        assert agent.crash is None
    check_store(store_path)


def test_inbox_payloads_are_built_only_when_a_listener_may_see_them() -> None:
    facts: list[Any] = []
    emitted: list[tuple[str, Any]] = []
    listening: set[str] = set()
    inbox = Inbox(
        append_fact=facts.append,
        emit=lambda name, payload: emitted.append((name, payload)),
        agent=_Agent(),
        listened=listening.__contains__,
    )
    for message_id in ("m1", "m2"):
        inbox.reserve(message_id)
    inbox.insert("next-turn", _message("m1"))
    assert emitted == []
    listening.update({"agent/inbox/inserted", "agent/inbox/claimed"})
    inbox.insert("next-step", _message("m2"))
    assert [name for name, _ in emitted] == ["agent/inbox/inserted"]
    assert isinstance(emitted[0][1], InboxInserted) and emitted[0][1].target == "next-step"
    batch = inbox.claim(1, new_turn=True)
    assert [m.id for m in batch] == ["m1", "m2"]
    claimed = [p for name, p in emitted if name == "agent/inbox/claimed"]
    assert [(type(p), p.message.id, p.turn) for p in claimed] == [
        (InboxClaimed, "m1", 1),
        (InboxClaimed, "m2", 1),
    ]
    # the same durable splices as the general splice writes
    assert facts == [
        AgentInboxSpliced(target="next-turn", start=0, inserted=(_message("m1"),)),
        AgentInboxSpliced(target="next-step", start=0, inserted=(_message("m2"),)),
        AgentInboxSpliced(target="next-turn", start=0, removed_count=1),
        AgentInboxSpliced(target="next-step", start=0, removed_count=1),
    ]
    assert len(inbox) == 0
    inbox.reserve("m1")  # claimed ids are released


def test_listeners_added_after_quiet_turns_see_the_next_turn(store_path: Path) -> None:
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=ScriptedModel(lambda r: "ok"))
        agent.followup("quiet")
        assert agent.wait_idle(WAIT)
        seen: list[str] = []
        lock = threading.Lock()

        def record(name: str) -> Any:
            def listener(_event: Any) -> None:
                with lock:
                    seen.append(name)

            return listener

        for name in ("agent/inbox/inserted", "agent/inbox/claimed", "agent/status"):
            agent.on(name, record(name))
        agent.followup("heard")
        assert agent.wait_idle(WAIT)
        with lock:
            assert seen == [
                "agent/inbox/inserted",
                "agent/status",
                "agent/inbox/claimed",
                "agent/status",
            ]
    check_store(store_path)


def test_turn_numbers_and_headers_continue_across_turns_and_resume(store_path: Path) -> None:
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=ScriptedModel(lambda r: "ok"), session_id="counted")
        for text in ("one", "two", "three"):
            agent.followup(text)
            assert agent.wait_idle(WAIT)
        agent.dispose(WAIT)
        revived = rt.resume("counted", model=ScriptedModel(lambda r: "ok"))
        revived.followup("four")
        assert revived.wait_idle(WAIT)
        events = revived.session.events()
        assert [e.data.turn for e in events if e.type == "turn/start"] == [1, 2, 3, 4]
        # one header for the first session run, none again while the config is unchanged
        assert [e.data.turn for e in events if e.type == "request/header"] == [1]
    check_store(store_path)


def test_an_unexpected_fault_in_a_turn_crashes_the_agent(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any) -> None:
        raise RuntimeError("bug in the turn")

    monkeypatch.setattr(HeaderLog, "write", broken)
    with Runtime.open(store_path) as rt:
        disposed = threading.Event()
        rt.on("agent/disposed", lambda _e: disposed.set())
        agent = rt.spawn(model=ScriptedModel(lambda r: "ok"), session_id="faulty")
        agent.followup("go")
        assert disposed.wait(WAIT)
        assert isinstance(agent.crash, RuntimeError) and "bug in the turn" in str(agent.crash)
        monkeypatch.undo()
        rt.flush()
        revived = rt.resume("faulty", model=ScriptedModel(lambda r: "ok"))
        ends = [e.data.reason.kind for e in revived.session.events() if e.type == "turn/end"]
        assert ends == ["interrupted"]
    check_store(store_path)


def test_a_flush_that_fails_reaches_the_turn_and_crashes_the_agent_before_the_request(
    store_path: Path,
) -> None:
    requests: list[Any] = []

    def reply(request: Any) -> str:
        requests.append(request)
        return "ok"

    with Runtime.open(store_path) as rt:
        disposed = threading.Event()
        rt.on("agent/disposed", lambda _e: disposed.set())
        agent = rt.spawn(model=ScriptedModel(reply), session_id="unflushable")
        for text in ("one", "two", "three"):  # successive flushes answer the right wait
            agent.followup(text)
            assert agent.wait_idle(WAIT)
        assert len(requests) == 3

        def failing(callback: Any) -> None:
            callback(StorageError("the disk is gone"))

        rt.store.flush_async = failing  # type: ignore[method-assign]  # the agents' flushes
        agent.followup("four")
        assert disposed.wait(WAIT)
        # write-ahead: the request of turn 4 was never sent, its facts not being durable
        assert len(requests) == 3
        assert isinstance(agent.crash, StorageError) and "the disk is gone" in str(agent.crash)
        rt.flush()
        revived = rt.resume("unflushable", model=ScriptedModel(lambda r: "ok"))
        ends = [e.data.reason.kind for e in revived.session.events() if e.type == "turn/end"]
        assert ends == ["completed", "completed", "completed", "interrupted"]
    check_store(store_path)
