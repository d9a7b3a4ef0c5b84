"""Scenario tests of the inbox and steering (CONTRACT sections 3 and 4)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import (
    AgentDisposedError,
    DuplicateMessageError,
    EditTimeoutError,
    Enter,
    InvalidMessageError,
    LlmFailure,
    Reject,
    Runtime,
    ScriptedModel,
    ToolCall,
    UnknownMessageError,
    UserMessage,
    tool,
)
from storage import StorageError, check_invariants
from storage.events import TextBlock

from .conftest import WAIT, HeldActor, Timeline, check_store
from .models import GateModel


def user_texts(agent: Any) -> list[str]:
    return [m.content[0].text for m in agent.session.messages() if isinstance(m, UserMessage)]


def test_a_duplicate_pending_message_id_is_refused_in_the_callers_thread(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.inject("a", id="m1")
    with pytest.raises(DuplicateMessageError, match="message id 'm1' is already pending"):
        agent.followup("b", id="m1")
    assert agent.wait_idle(WAIT)
    assert agent.inbox.ids() == ["m1"]


def test_wrong_types_to_the_verbs_get_a_clear_error(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    for bad in (42, None, b"bytes", [], {"text": "x"}):
        with pytest.raises(
            InvalidMessageError,
            match="a message is a str, a UserMessage or a non-empty list of content blocks",
        ):
            agent.followup(bad)  # type: ignore[arg-type]
    assert len(agent.inbox) == 0


def test_inject_does_not_wake_an_idle_agent_and_joins_the_next_turn(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.inject("context")
    assert agent.wait_idle(WAIT)
    assert agent.status == "idle" and len(agent.inbox) == 1
    agent.followup("question")
    assert agent.wait_idle(WAIT)
    assert user_texts(agent) == ["question", "context"]
    assert len([e for e in agent.session.events() if e.type == "turn/start"]) == 1


@pytest.mark.parametrize("attempt", range(5))  # the race it pins showed up 1 run in ~5
def test_a_steer_during_a_running_turn_joins_the_next_step(rt: Runtime, attempt: int) -> None:
    model = GateModel()
    agent = rt.spawn(model=model)
    agent.followup("first")
    assert model.reached.wait(WAIT)
    agent.steer("and also this")
    model.release(0)
    assert model.wait_reached(2)
    model.release(1)
    assert agent.wait_idle(WAIT)
    steps = [e.data.step for e in agent.session.events() if e.type == "step/start"]
    assert steps == [1, 2]
    assert user_texts(agent) == ["first", "and also this"]
    user_steps = [e.data.step for e in agent.session.events() if e.type == "user/message"]
    assert user_steps == [1, 2]


def test_turn_stopping_steer_asks_for_another_step(rt: Runtime) -> None:
    asked: list[int] = []

    def more(event: Any) -> None:
        if not asked:
            asked.append(event.step)
            event.agent.steer("one more thing")

    rt.on("agent/turn-stopping", more)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("start")
    assert agent.wait_idle(WAIT)
    assert [e.data.step for e in agent.session.events() if e.type == "step/start"] == [1, 2]
    assert [e.data.turn for e in agent.session.events() if e.type == "turn/start"] == [1]


def test_a_throwing_turn_stopping_listener_ends_the_turn_as_error(rt: Runtime) -> None:
    def broken(event: Any) -> None:
        raise RuntimeError("listener bug")

    rt.on("agent/turn-stopping", broken)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("start")
    assert agent.wait_idle(WAIT)
    end = next(e.data for e in agent.session.events() if e.type == "turn/end")
    assert end.reason.kind == "error" and "listener bug" in end.reason.error.message


def test_pre_step_runs_before_every_step_and_its_batch_is_authoritative(rt: Runtime) -> None:
    seen: list[tuple[int, int]] = []

    def rewrite(event: Any, next_: Any) -> Any:
        seen.append((event.turn, event.step))
        if event.step == 1:
            extra = UserMessage(id="extra", content=[TextBlock(text="added")], source="plugin")
            return Enter(messages=[*event.messages, extra])
        return next_()

    rt.on("agent/pre-step", rewrite)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    assert seen == [(1, 1)]
    assert user_texts(agent) == ["hi", "added"]


def test_a_pre_step_batch_that_holds_a_message_twice_ends_the_turn_as_error(rt: Runtime) -> None:
    # Before, it was logged twice, and the checker rejected the log (entered twice).
    rt.on("agent/pre-step", lambda event, next_: Enter(messages=[*event.messages, *event.messages]))
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    end = next(e.data for e in agent.session.events() if e.type == "turn/end")
    assert end.reason.kind == "error" and "more than once" in end.reason.error.message
    assert user_texts(agent) == []
    # the rt fixture checks the log when the test ends


def test_a_pre_step_batch_entering_a_message_the_inbox_still_holds_ends_the_turn_as_error(
    rt: Runtime,
) -> None:
    # Before, "X" was entered unclaimed, stayed pending and ran again in turn 2: the
    # history held it twice and the checker rejected the log.
    pending = UserMessage(id="X", content=[TextBlock(text="pulled forward")])

    def pull(event: Any, next_: Any) -> Any:
        if event.turn == 1:
            return Enter(messages=[*event.messages, pending])
        return next_()

    agent = rt.spawn(model=ScriptedModel.echo())
    agent.on("agent/pre-step", pull)
    agent.followup("first", id="A")
    agent.followup("second", id="X")
    assert agent.wait_idle(WAIT)
    end = next(e.data for e in agent.session.events() if e.type == "turn/end")
    assert end.reason.kind == "error"
    assert "'X'" in end.reason.error.message and "still pending" in end.reason.error.message
    assert user_texts(agent) == []
    assert agent.inbox.ids() == ["X"]  # it stays pending, to run once claimed
    agent.followup("third", id="B")
    assert agent.wait_idle(WAIT)
    assert user_texts(agent) == ["second", "third"]
    assert check_invariants(agent.session.events()) == []


@pytest.mark.parametrize("before", ["entered", "discarded"])
def test_a_pre_step_batch_entering_a_message_that_went_through_the_inbox_before_ends_the_turn_as_error(
    rt: Runtime, before: str
) -> None:
    # Before, the message was entered again ("entered twice") or a discarded one entered
    # without a claim ("entered unclaimed"): the checker rejected the log.
    kept: list[UserMessage] = []
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.on("agent/inbox/inserted", lambda e: e.message.id == "A" and kept.append(e.message))
    if before == "entered":
        agent.followup("first", id="A")
        assert agent.wait_idle(WAIT)
    else:
        agent.inject("first", id="A")
        assert agent.remove("A").id == "A"
    assert len(kept) == 1
    agent.on(
        "agent/pre-step",
        lambda event, next_: Enter(messages=[*event.messages, kept[0]]),
    )
    agent.followup("second", id="B")
    assert agent.wait_idle(WAIT)
    end = [e.data for e in agent.session.events() if e.type == "turn/end"][-1]
    assert end.reason.kind == "error"
    assert "'A'" in end.reason.error.message and "not claimed" in end.reason.error.message
    assert user_texts(agent) == (["first"] if before == "entered" else [])
    assert check_invariants(agent.session.events()) == []


def test_a_claimed_message_a_pre_step_listener_held_back_may_enter_a_later_step_of_its_turn(
    rt: Runtime,
) -> None:
    # The log's rule is "entered once per claim in its turn", not "in its step".
    held: list[UserMessage] = []

    def defer(event: Any, next_: Any) -> Any:
        if event.step == 1:
            held.extend(m for m in event.messages if m.id == "S")
            return Enter(messages=[m for m in event.messages if m.id != "S"])
        if event.step == 2:
            return Enter(messages=[*event.messages, *held])
        return next_()

    @tool
    def noop() -> str:
        """Do nothing."""
        return "done"

    agent = rt.spawn(
        model=ScriptedModel([[ToolCall(name="noop", arguments={})], "ok"]), tools=[noop]
    )
    agent.on("agent/pre-step", defer)
    agent.inject("steered", id="S")
    agent.followup("go", id="G")
    assert agent.wait_idle(WAIT)
    end = next(e.data for e in agent.session.events() if e.type == "turn/end")
    assert end.reason.kind == "completed"
    assert user_texts(agent) == ["go", "steered"]
    assert check_invariants(agent.session.events()) == []


def test_a_plugin_message_of_its_own_id_may_enter_every_turn(rt: Runtime) -> None:
    # Only messages that went through the inbox are entered once per claim.
    def remind(event: Any, next_: Any) -> Any:
        note = UserMessage(id="reminder", content=[TextBlock(text="be brief")], source="plugin")
        return Enter(messages=[*event.messages, note])

    agent = rt.spawn(model=ScriptedModel.echo())
    agent.on("agent/pre-step", remind)
    agent.followup("one")
    assert agent.wait_idle(WAIT)
    agent.followup("two")
    assert agent.wait_idle(WAIT)
    assert user_texts(agent) == ["one", "be brief", "two", "be brief"]
    assert check_invariants(agent.session.events()) == []


def test_a_content_block_given_as_a_dict_by_pre_step_is_entered_as_the_block_it_reads_back_as(
    rt: Runtime,
) -> None:
    def rewrite(event: Any, next_: Any) -> Any:
        extra = UserMessage(id="extra", content=[{"type": "text", "text": "added"}])  # type: ignore[list-item]
        return Enter(messages=[*event.messages, extra])

    rt.on("agent/pre-step", rewrite)
    model = ScriptedModel.echo()
    agent = rt.spawn(model=model)
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    entered = agent.session.messages()[1]
    assert entered.content == (TextBlock(text="added"),)
    assert model.requests == 1


def test_a_message_id_may_be_used_again_once_its_message_left_the_inbox(rt: Runtime) -> None:
    # CONTRACT 3: ids are unique while pending. Before, the checker (and `corral log
    # check`) rejected such a log: "message 'task-1' entered twice".
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("one", id="task-1")
    assert agent.wait_idle(WAIT)
    agent.followup("two", id="task-1")
    assert agent.wait_idle(WAIT)
    assert user_texts(agent) == ["one", "two"]
    assert check_invariants(agent.session.events()) == []


def test_an_empty_enter_on_the_first_step_closes_a_no_step_completed_turn(rt: Runtime) -> None:
    rt.on("agent/pre-step", lambda event, next_: Enter(messages=[]))
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    types = [e.type for e in agent.session.events()]
    assert "step/start" not in types
    end = next(e.data for e in agent.session.events() if e.type == "turn/end")
    assert end.reason.kind == "completed"


def test_async_listeners_run_on_the_io_side(rt: Runtime) -> None:

    threads: list[str] = []

    async def gate(event: Any, next_: Any) -> Any:
        threads.append(threading.current_thread().name)
        return await next_()

    rt.on("agent/pre-step", gate)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    assert threads and all("io" in name for name in threads)
    assert user_texts(agent) == ["hi"]


def test_remove_and_replace_edit_pending_messages_with_canceled_splices(
    rt: Runtime, timeline: Timeline
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    a = agent.inject("a")
    b = agent.inject("b")
    removed = agent.remove(a)
    assert removed.id == a
    c = agent.replace(b, "c")
    assert agent.inbox.ids() == [c]
    with pytest.raises(UnknownMessageError, match="no pending message 'nope'"):
        agent.remove("nope")
    assert [d.message.id for d in timeline.of("agent/inbox/discarded")] == [a, b]
    splices = [e.data for e in agent.session.events() if e.type == "agent/inbox/spliced"]
    assert [(s.start, s.removed_count, s.outcome) for s in splices] == [
        (0, 0, None),
        (1, 0, None),
        (0, 1, "canceled"),
        (0, 1, "canceled"),
    ]


def _message(message_id: str, text: str) -> UserMessage:
    return UserMessage(id=message_id, content=[TextBlock(text=text)])


def test_replacing_a_pending_message_by_one_with_the_same_id_keeps_the_id_and_the_place(
    store_path: Path,
) -> None:
    with Runtime.open(store_path, inbox_limit=2) as rt:
        timeline = Timeline(rt)
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.inject("a", id="m1")
        agent.inject("b", id="m2")
        # (the inbox is full: a replace discards what it inserts in place of)
        assert agent.replace("m1", _message("m1", "a2")) == "m1"
        assert [(m.id, m.content[0].text) for m in agent.inbox.next_step] == [
            ("m1", "a2"),
            ("m2", "b"),
        ]
        with pytest.raises(
            DuplicateMessageError, match="message id 'm1' is already pending"
        ):  # it is pending once, and still taken
            agent.inject("a3", id="m1")
        timeline.wait_for("agent/inbox/inserted", 3)
        labels = [n for n in timeline.labels() if n.startswith("agent/inbox/")]
        assert labels[-2:] == ["agent/inbox/discarded", "agent/inbox/inserted"]
        assert [e.message.id for e in timeline.of("agent/inbox/discarded")] == ["m1"]
        agent.remove("m2")
        agent.followup("go")
        assert agent.wait_idle(WAIT)
        assert user_texts(agent) == ["go", "a2"]
    check_store(store_path)


def test_a_splice_that_removes_messages_and_inserts_them_again_keeps_each_id_pending_once(
    store_path: Path,
) -> None:
    with Runtime.open(store_path) as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        for message_id in ("a", "b", "c"):
            agent.inject(message_id, id=message_id)
        removed = agent.splice("next-step", 0, 2, [_message("b", "B"), _message("a", "A")])
        assert [m.id for m in removed] == ["a", "b"]
        assert agent.inbox.ids() == ["b", "a", "c"]
        # still refused: an id pending outside what the splice removes, or one inserted twice
        with pytest.raises(DuplicateMessageError, match="'c'"):
            agent.splice("next-step", 0, 1, [_message("c", "C")])
        with pytest.raises(DuplicateMessageError, match="'b'"):
            agent.splice("next-step", 0, 2, [_message("b", "1"), _message("b", "2")])
        assert [m.content[0].text for m in agent.inbox.next_step] == ["B", "A", "c"]
        session = agent.id
    with Runtime.open(store_path) as rt:  # the log replays to the same inbox
        agent = rt.resume(session, model=ScriptedModel.echo())
        assert [m.content[0].text for m in agent.inbox.next_step] == ["B", "A", "c"]
        agent.followup("go")
        assert agent.wait_idle(WAIT)
        assert user_texts(agent) == ["go", "B", "A", "c"]
    check_store(store_path)


def test_a_wake_while_an_aborted_turn_unwinds_is_latched_and_runs_next(rt: Runtime) -> None:
    unwinding = GateModel()
    seen: list[Any] = []

    def during_abort(event: Any) -> None:
        # runs while the aborted turn is still open: a steer now is forced to next-turn
        if event.turn == 1 and not seen:
            seen.append(event.agent.steer("after abort"))

    rt.on("agent/turn-stopping", during_abort)
    agent = rt.spawn(model=unwinding)
    agent.followup("first")
    assert unwinding.reached.wait(WAIT)
    agent.cancel()
    mid = agent.steer("latched")
    assert unwinding.wait_reached(2)
    unwinding.release(1)
    assert agent.wait_idle(WAIT)
    claimed = [e.data for e in agent.session.events() if e.type == "turn/start"]
    assert [c.turn for c in claimed] == [1, 2]
    assert "latched" in user_texts(agent)
    assert mid not in agent.inbox.ids()


def test_the_general_splice_edits_a_lane_like_list_slicing(rt: Runtime, timeline: Timeline) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    ids = [agent.inject(text) for text in ("a", "b", "c")]
    removed = agent.splice("next-step", -2, 1, ["x", "y"])
    assert [m.id for m in removed] == [ids[1]]
    texts = [m.content[0].text for m in agent.inbox.next_step]
    assert texts == ["a", "x", "y", "c"]
    last = [e.data for e in agent.session.events() if e.type == "agent/inbox/spliced"][-1]
    assert (last.target, last.start, last.removed_count, last.outcome) == (
        "next-step",
        1,
        1,
        "canceled",
    )
    assert [d.message.id for d in timeline.of("agent/inbox/discarded")] == [ids[1]]
    assert agent.splice("next-turn", 5, 3) == []  # a no-op writes nothing
    assert [e.type for e in agent.session.events()].count("agent/inbox/spliced") == 4


@pytest.mark.parametrize("edit", ["splice", "replace"])
def test_an_edit_that_times_out_stays_queued_and_keeps_its_message_ids(
    rt: Runtime, edit: str
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    hold = HeldActor(agent)
    held = hold.message_id
    mine = UserMessage(id="mine", content=[TextBlock(text="mine")])

    def send_edit() -> object:
        if edit == "splice":
            return agent.splice("next-step", 1, 0, [mine], timeout=0.05)
        return agent.replace(held, mine, timeout=0.05)

    with pytest.raises(EditTimeoutError, match="stays queued"):
        send_edit()
    # The edit will still insert "mine": until then the id stays taken (it used to be
    # released here, and this send was accepted: the same id pending twice in the log).
    with pytest.raises(DuplicateMessageError, match="message id 'mine' is already pending"):
        agent.inject(UserMessage(id="mine", content=[TextBlock(text="again")]))
    hold.release()
    assert agent.wait_idle(WAIT)
    assert agent.inbox.ids() == ([held, "mine"] if edit == "splice" else ["mine"])


@pytest.mark.parametrize("ending", ["error", "blocked"])
def test_a_followup_sent_after_a_turn_ended_while_its_chain_settles_starts_the_next_turn(
    rt: Runtime, timeline: Timeline, ending: str
) -> None:
    # Sent from an observer of the turn/end: the agent handles it while the chain waits
    # for that turn/end to be durable. The chain then stopped (queued work stays parked
    # after an error or a block), and the agent went idle with this wake pending.
    failure = LlmFailure(message="bad request", code="INVALID_REQUEST", status=400)
    replies = [failure, "ok"] if ending == "error" else ["ok"]
    agent = rt.spawn(model=ScriptedModel(replies))
    if ending == "blocked":
        agent.on("agent/pre-step", lambda event, next_: Reject() if event.turn == 1 else next_())
    sent: list[str] = []

    def on_event(event: Any) -> None:
        if event.event.type == "turn/end" and not sent:
            sent.append(agent.followup("again"))

    agent.on("session/event", on_event)
    agent.followup("first")
    settled = timeline.wait_for("agent/settled", 2)
    assert [(s.turn, s.reason.kind) for s in settled] == [(1, ending), (2, "completed")]
    claimed = timeline.of("agent/inbox/claimed")
    assert (claimed[-1].message.id, claimed[-1].turn) == (sent[0], 2)
    assert agent.wait_idle(WAIT)
    assert agent.inbox.next_turn == ()


def test_content_blocks_given_as_dicts_reach_the_model_and_the_history_as_block_structs(
    rt: Runtime,
) -> None:
    # The verb checked a round trip of such a message but kept the original: the model
    # request and the in-memory history held plain dicts (which providers drop), while
    # the log read back TextBlocks after a rehydrate.
    seen: list[Any] = []

    def reply(request: Any) -> str:
        seen.append(request.messages[-1])
        return "ok"

    def as_dicts(message_id: str, text: str) -> UserMessage:
        return UserMessage(id=message_id, content=[{"type": "text", "text": text}])  # type: ignore[list-item]

    def typed(message_id: str, text: str) -> UserMessage:
        return UserMessage(id=message_id, content=(TextBlock(text=text),))

    agent = rt.spawn(model=ScriptedModel(reply))
    agent.followup(as_dicts("u", "hi"))
    assert agent.wait_idle(WAIT)
    assert seen == [typed("u", "hi")]
    history = [m for m in agent.session.messages() if isinstance(m, UserMessage)]
    assert history == [typed("u", "hi")]
    pending = agent.inject("p")
    agent.replace(pending, as_dicts("r", "replaced"))
    agent.splice("next-step", 1, 0, [as_dicts("s", "spliced")])
    assert agent.inbox.next_step == (typed("r", "replaced"), typed("s", "spliced"))
    assert agent.passivate()
    assert [m for m in agent.session.messages() if isinstance(m, UserMessage)] == history


def test_a_send_whose_insert_cannot_be_logged_fails_the_agent_instead_of_dropping_it(
    rt: Runtime,
) -> None:
    # The actor logged the failed insert and went on: the caller held an id for a
    # message that was nowhere, and nothing told it so.
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("first")
    assert agent.wait_idle(WAIT)
    gone = threading.Event()
    agent.on("agent/disposed", lambda event: gone.set())
    rt.store.open_session(agent.id)  # opened again: the agent's session may append no more
    sent = agent.followup("second")
    assert gone.wait(WAIT), "the agent went on although its message was not logged"
    assert isinstance(agent.crash, StorageError)
    assert any(sent in note for note in getattr(agent.crash, "__notes__", ()))
    with pytest.raises(AgentDisposedError, match="is disposed"):
        agent.followup("third")


@pytest.mark.parametrize("on_fact", ["assistant/message", "tool/result"])
def test_a_steer_from_the_agents_own_fact_observer_joins_the_next_step_of_the_same_turn(
    rt: Runtime, on_fact: str
) -> None:
    # Before, it was still queued when the step ended: with a text reply the turn ended
    # and the steer started the next one; after a tool step, step 2 went out without it.
    @tool
    def noop() -> str:
        return "ok"

    replies: list[Any] = ["reply", "after the steer"]
    if on_fact == "tool/result":
        replies.insert(0, [ToolCall(name="noop")])
    agent = rt.spawn(model=ScriptedModel(replies), tools=[noop])
    steered: list[str] = []

    def on_event(event: Any) -> None:
        if event.event.type == on_fact and not steered:
            steered.append(agent.steer("from the observer"))

    agent.on("session/event", on_event)
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    starts = [e.data for e in agent.session.events() if e.type == "turn/start"]
    assert len(starts) == 1  # one turn
    entered = [e.data for e in agent.session.events() if e.type == "user/message"]
    assert [(m.message.id, m.step) for m in entered][-1] == (steered[0], 2)
