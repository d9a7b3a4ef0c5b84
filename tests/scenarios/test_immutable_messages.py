"""Messages and facts are immutable wherever the runtime hands them out (CONTRACT 3: a
message is immutable; CONTRACT 4: the request messages are exactly the logged history).

Before, a message's ``content`` (and a fact's ``sourceEventSeqs``, a splice's
``inserted``, a header's ``tools``) was a plain list shared by the inbox, the in-memory
log, the model request and every listener: a listener changing it in place made the log
unreadable (an int in a content list), entered a message twice, or made the model see
content the log does not hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from runtime import Runtime, ScriptedModel, TextBlock, UserMessage, tool
from storage import check_invariants
from storage.events import ToolSpec
from storage.projections import derive_messages

from .conftest import WAIT

EXTRA = TextBlock(text="EXTRA")

# Where a listener is handed a message or a fact, and what it tries to change there.
Attempt = Callable[[Callable[[], object]], None]
PLACES: dict[str, tuple[str, Callable[[Any, Attempt], Any]]] = {
    "the pre-step batch": (
        "agent/pre-step",
        lambda e, attempt: attempt(lambda: e.messages.append(e.messages[0])),
    ),
    "an inserted message": (
        "agent/inbox/inserted",
        lambda e, attempt: attempt(lambda: e.message.content.__setitem__(0, 5)),
    ),
    "a claimed message": (
        "agent/inbox/claimed",
        lambda e, attempt: attempt(lambda: e.message.content.append(EXTRA)),
    ),
    "the inbox view": (
        "agent/inbox/inserted",
        lambda e, attempt: attempt(lambda: e.agent.inbox.next_turn[-1].content.append(EXTRA)),
    ),
    "a logged user message": (
        "session/event",
        lambda e, attempt: (
            e.event.type == "user/message"
            and attempt(lambda: e.event.data.message.content.append(EXTRA))
        ),
    ),
    "a logged splice": (
        "session/event",
        lambda e, attempt: (
            e.event.type == "agent/inbox/spliced"
            and e.event.data.inserted
            and attempt(lambda: e.event.data.inserted[0].content.append(EXTRA))
        ),
    ),
    "a logged assistant message": (
        "session/event",
        lambda e, attempt: (
            e.event.type == "assistant/message"
            and attempt(lambda: e.event.data.message.content.append(EXTRA))
        ),
    ),
    "a logged citation list": (
        "session/event",
        lambda e, attempt: (
            e.event.type == "assistant/message"
            and attempt(lambda: e.event.data.source_event_seqs.append(10**9))
        ),
    ),
    "the history": (
        "agent/settled",
        lambda e, attempt: attempt(lambda: e.agent.session.messages()[0].content.append(EXTRA)),
    ),
}


@pytest.mark.parametrize("place", list(PLACES))
def test_a_listener_cannot_change_a_message_in_place_and_the_model_sees_what_the_log_holds(
    rt: Runtime, place: str
) -> None:
    name, listener = PLACES[place]
    outcomes: list[bool] = []  # per attempt: was the change refused?
    lock = threading.Lock()

    def attempt(change: Callable[[], object]) -> None:
        try:
            change()
        except (TypeError, AttributeError):
            refused = True
        else:
            refused = False
        with lock:
            outcomes.append(refused)

    seen: list[list[bytes]] = []  # each request's messages, encoded when it was made

    def reply(request: Any) -> str:
        seen.append([msgspec.json.encode(m) for m in request.messages])
        return "ok"

    agent = rt.spawn(model=ScriptedModel(reply))
    if name == "agent/pre-step":
        agent.on(name, lambda e, next_: (listener(e, attempt), next_())[1])
    else:
        agent.on(name, lambda e: listener(e, attempt))
    agent.followup("one")
    assert agent.wait_idle(WAIT)
    agent.followup("two")
    assert agent.wait_idle(WAIT)

    assert outcomes and all(outcomes), f"changed in place: {outcomes}"
    events = list(rt.store.read(agent.id))  # reads back: nothing unreadable was logged
    assert check_invariants(events) == []
    logged = [msgspec.json.encode(m) for m in derive_messages(events)]
    assert len(seen) == 2
    for request in seen:  # model-visible means logged
        assert request == logged[: len(request)]
    assert b"EXTRA" not in b"".join(logged)


def test_a_message_sent_with_a_content_list_is_kept_as_an_immutable_copy(rt: Runtime) -> None:
    content = [TextBlock(text="as sent")]
    agent = rt.spawn(model=ScriptedModel(["ok"]))
    agent.followup(UserMessage(id="u", content=content))  # type: ignore[arg-type]
    assert agent.wait_idle(WAIT)
    content.append(EXTRA)  # the caller's list stays the caller's
    (entered,) = [m for m in agent.session.messages() if isinstance(m, UserMessage)]
    assert entered.content == (TextBlock(text="as sent"),)
    assert type(entered.content) is tuple


def test_a_logged_request_header_cannot_change_the_tools_the_model_is_sent(rt: Runtime) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    outcomes: list[bool] = []

    def observe(e: Any) -> None:
        if e.event.type != "request/header":
            return
        try:
            e.event.data.tools.append(ToolSpec(name="ghost"))
        except AttributeError:
            outcomes.append(True)
        else:
            outcomes.append(False)
        # a header holds its own copy of the specs: changing it changes no request
        e.event.data.tools[0].parameters["properties"]["ghost"] = {"type": "string"}

    sent: list[list[bytes]] = []

    def reply(request: Any) -> str:
        sent.append([msgspec.json.encode(spec) for spec in request.tools])
        return "ok"

    agent = rt.spawn(model=ScriptedModel(reply), tools=[add])
    agent.on("session/event", observe)
    agent.followup("one")
    assert agent.wait_idle(WAIT)
    agent.followup("two")
    assert agent.wait_idle(WAIT)

    assert outcomes == [True]
    headers = [e.data for e in rt.store.read(agent.id) if e.type == "request/header"]
    assert len(headers) == 1
    logged = [msgspec.json.encode(spec) for spec in headers[0].tools]
    assert sent == [logged, logged]
    assert b"ghost" not in b"".join(logged)
