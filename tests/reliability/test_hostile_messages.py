"""Messages and event data too big or not lossless JSON: refused at the verb (or the
turn ends as error) with nothing written; a message just under the limit is taken or
refused, never dropped; plugin event data that is not lossless JSON is refused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from runtime import (
    Agent,
    Enter,
    InvalidMessageError,
    Runtime,
    ScriptedModel,
    TextBlock,
    UserMessage,
)
from storage import (
    InvalidEventError,
    Store,
)

from .conftest import WAIT, check_whole_store
from .hostile_support import LIMIT, Opaque, assert_alive, cycle, facts, nested

# --------------------------------------------------------------------------- verbs


@pytest.mark.parametrize("verb", ["followup", "steer", "inject", "replace"])
def test_a_message_over_the_event_limit_is_refused_at_the_verb_and_nothing_is_written(
    rt: Runtime, verb: str
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    pending = agent.inject("keep me")
    assert agent.wait_idle(WAIT)
    before = agent.session.last_seq
    huge = "x" * LIMIT

    def call() -> Any:
        return agent.replace(pending, huge) if verb == "replace" else getattr(agent, verb)(huge)

    with pytest.raises(InvalidMessageError, match="event limit"):
        call()
    assert agent.wait_idle(WAIT)
    assert agent.session.last_seq == before
    assert agent.inbox.ids() == [pending]
    assert_alive(rt, agent)


SMALL_LIMIT = 4096  # max_event_bytes of the runtimes that probe the band under the limit
MARGIN = 256  # documented: a message this far under the limit is always taken


def _send_near_limit(agent: Agent, verb: str, message: UserMessage) -> str | None:
    """Send ``message`` with ``verb`` so that a turn claims it; the refusal if any."""
    try:
        if verb in ("followup", "steer"):
            getattr(agent, verb)(message)
        elif verb == "inject":
            agent.inject(message)
            agent.followup("go")
        elif verb == "replace":
            pending = agent.inject("to be replaced")
            try:
                agent.replace(pending, message)
            except InvalidMessageError:
                agent.remove(pending)
                raise
            agent.followup("go")
        else:
            agent.splice("next-step", 0, 0, [message])
            agent.followup("go")
    except InvalidMessageError as err:
        return str(err)
    return None


@pytest.mark.parametrize("verb", ["followup", "steer", "inject", "replace", "splice"])
def test_a_message_just_under_the_event_limit_is_refused_at_the_verb_or_logged_never_dropped(
    tmp_path: Path, verb: str
) -> None:
    # The verb measured the bare message; the records that carry it (its insert splice,
    # its user/message) are ~100-140 bytes bigger: a message up to 112 bytes under the
    # limit was accepted and then dropped by the actor (nothing logged), one 116-140
    # bytes under was claimed and crashed the agent on its user/message.
    path = tmp_path / "store"
    empty = len(msgspec.json.encode(UserMessage(id="big00000", content=[TextBlock(text="")])))
    sizes = range(SMALL_LIMIT - 2 * MARGIN, SMALL_LIMIT + 1, 3)  # a message's encoded size
    with Runtime.open(path, max_event_bytes=SMALL_LIMIT) as rt:
        agent = rt.spawn(model=ScriptedModel(lambda request: "ok"))
        accepted: list[int] = []
        for size in sizes:
            message = UserMessage(
                id=f"big{size:05d}", content=[TextBlock(text="x" * (size - empty))]
            )
            assert len(msgspec.json.encode(message)) == size
            refused = _send_near_limit(agent, verb, message)
            if refused is not None:
                assert "event limit" in refused
                continue
            assert agent.wait_idle(WAIT), f"{size}: the agent did not go idle"
            assert agent.crash is None, f"{size}: {agent.crash!r}"
            accepted.append(size)
        logged = [e.message.id for e in facts(agent, "user/message")]
        assert [i for i in logged if i.startswith("big")] == [f"big{s:05d}" for s in accepted]
        ends = facts(agent, "turn/end")
        assert [e.reason.kind for e in ends] == ["completed"] * len(accepted)
        assert agent.inbox.ids() == []
        assert accepted, "every message of the band was refused"
        assert accepted == [s for s in sizes if s <= accepted[-1]], "refused one, took a bigger"
        assert accepted[-1] >= SMALL_LIMIT - MARGIN, f"refused {SMALL_LIMIT - accepted[-1]} under"
    check_whole_store(path)


def test_a_splice_whose_one_record_would_pass_the_event_limit_is_refused_at_the_verb(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    with Runtime.open(path, max_event_bytes=SMALL_LIMIT) as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        before = agent.session.last_seq
        half = "y" * (SMALL_LIMIT // 2)  # each fits alone, their one splice record does not
        with pytest.raises(InvalidMessageError, match="event limit"):
            agent.splice("next-step", 0, 0, [half, half])
        assert agent.wait_idle(WAIT)
        assert agent.session.last_seq == before
        assert agent.inbox.ids() == []
        agent.splice("next-step", 0, 0, [half])  # one alone fits
        assert len(agent.inbox) == 1
    check_whole_store(path)


def test_a_pre_step_batch_too_big_to_log_ends_the_turn_as_error_and_the_agent_lives_on(
    rt: Runtime,
) -> None:
    # A user/message the log refuses (here a listener's rewrite over the event limit; a
    # pending message logged under a larger max_event_bytes is another) crashed the
    # agent's actor and left its turn open.
    huge = UserMessage(id="huge", content=[TextBlock(text="h" * LIMIT)])

    def rewrite(event: Any, next_: Any) -> Any:
        if event.messages and event.messages[0].content[0].text == "go":
            return Enter(messages=[huge])
        return next_()

    agent = rt.spawn(model=ScriptedModel.echo())
    agent.on("agent/pre-step", rewrite)
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    (end,) = facts(agent, "turn/end")
    assert end.reason.kind == "error"
    assert "a user message cannot be logged" in end.reason.error.message
    assert "limit" in end.reason.error.message
    assert facts(agent, "user/message") == []
    assert_alive(rt, agent)


# --------------------------------------------------------------------------- plugin events

PLUGIN_VALUES: dict[str, Any] = {
    "NaN": math.nan,
    "-Infinity": -math.inf,
    "a set": {1, 2},
    "bytes": b"raw",
    "a tuple": (1, 2),
    "a custom object": Opaque(),
    "an int key": {1: "one"},
    "a cycle": cycle(),
    "100,000 deep": nested(100_000),
    "a lone surrogate": "\ud800",
    "5 MiB": "x" * (5 << 20),
}


@pytest.mark.parametrize("name", list(PLUGIN_VALUES))
def test_plugin_event_data_that_is_not_lossless_json_is_refused_and_nothing_is_written(
    tmp_path: Path, name: str
) -> None:
    with Runtime.open(tmp_path / "store") as rt:
        rt.store.register_event_type("plugin/note")
        agent = rt.spawn(model=ScriptedModel.echo(), session_id="plugged")
        session = agent.session
        before = session.last_seq
        with pytest.raises(InvalidEventError) as caught:
            session.append("plugin/note", {"value": PLUGIN_VALUES[name]})
        assert "'plugin/note' event" in str(caught.value)
        assert session.last_seq == before
        session.append("plugin/note", {"value": "fine"})  # good data is still taken
        assert_alive(rt, agent)
    with Store.open(tmp_path / "store", readonly=True) as store:
        store.register_event_type("plugin/note")
        assert [e.data["value"] for e in store.read("plugged") if e.type == "plugin/note"] == [
            "fine"
        ]
