"""Listener and observer faults: raising, slow or re-entrant listeners never break other
listeners, other agents, or the loop's outcome beyond what CONTRACT says.

CONTRACT 8: ``emit`` listeners' failures are contained and logged, none can veto;
``serial`` and ``waterfall`` listeners' failures end their turn as CONTRACT 4-6 say
(pre-step / turn-stopping / request: ``error``; tools/pre-execute: the call is denied;
tools/post-execute: the call failed). CONTRACT 7: a ``session/event`` observer's failure
is contained and an observer cannot re-enter ``append``.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.errors import AgentStateError
from runtime import Agent, RequestConfig, Runtime, ScriptedModel, ToolCall, tool
from storage import ReentrantAppendError, check_invariants
from storage.events import TextBlock, UserMessage

from .conftest import WAIT, Recorder

EMITTED = (
    "agent/created",
    "agent/session-start",
    "agent/status",
    "agent/inbox/inserted",
    "agent/inbox/claimed",
    "agent/inbox/discarded",
    "agent/settled",
    "agent/error",
    "tools/result",
    "session/event",
)


@tool(concurrency_safe=True)
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value-of-{key}"


def tool_script() -> ScriptedModel:
    return ScriptedModel([[ToolCall(name="lookup", arguments={"key": "k"})], "done"])


def types(agent: Agent) -> list[str]:
    return [e.type for e in agent.session.events()]


def ends(agent: Agent) -> list[str]:
    return [e.data.reason.kind for e in agent.session.events() if e.type == "turn/end"]


def clean_run_types(tmp_path: Path) -> list[str]:
    """The fact types of one tool turn with no extra listeners: the baseline."""
    with Runtime.open(tmp_path / "baseline") as rt:
        agent = rt.spawn(model=tool_script(), tools=[lookup])
        agent.inject("context")
        agent.followup("go")
        assert agent.wait_idle(WAIT)
        return types(agent)


def boom(*_args: Any) -> Any:
    raise RuntimeError("listener bug")


async def async_boom(*_args: Any) -> Any:
    raise RuntimeError("async listener bug")


def exits(*_args: Any) -> Any:
    raise SystemExit(5)  # a supervisor's sys.exit() in a callback


async def async_exits(*_args: Any) -> Any:
    raise SystemExit(5)


# A listener's sys.exit() is a failure of that listener: it went past the bus, ended
# the agent's actor, and pykka then stopped every actor of the process (other agents,
# the registry, other runtimes' actors); an async one ended the I/O loop's thread.
RAISING = {"sync": boom, "async": async_boom, "sys.exit": exits, "async sys.exit": async_exits}


def run_bystander(rt: Runtime) -> Agent:
    """Another agent that must be unaffected by the faulty agent's listeners."""
    other = rt.spawn(model=tool_script(), tools=[lookup])
    other.followup("unrelated work")
    return other


def assert_bystander_fine(other: Agent) -> None:
    assert other.wait_idle(WAIT)
    assert ends(other) == ["completed"]
    assert check_invariants(other.session.events()) == []


# --------------------------------------------------------------------------- emit


@pytest.mark.parametrize("kind", list(RAISING))
def test_raising_listeners_on_every_emitted_event_change_nothing_and_others_still_hear(
    rt: Runtime, tmp_path: Path, kind: str
) -> None:
    baseline = clean_run_types(tmp_path)
    agent = rt.spawn(model=tool_script(), tools=[lookup], session_id="faulty")
    before = Recorder(agent, *EMITTED)
    for name in EMITTED:
        agent.on(name, RAISING[kind])
    after = Recorder(agent, *EMITTED)
    other = run_bystander(rt)
    agent.inject("context")
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert types(agent) == baseline  # the outcome is the clean run's, fact for fact
    after.wait_for("agent/settled")
    for name in ("agent/status", "agent/inbox/claimed", "agent/settled", "tools/result"):
        assert len(before.of(name)) == len(after.of(name)) > 0, name
    assert_bystander_fine(other)


@pytest.mark.parametrize("kind", list(RAISING))
def test_raising_global_listeners_do_not_disturb_any_agent(rt: Runtime, kind: str) -> None:
    for name in EMITTED:
        rt.on(name, RAISING[kind])
    settled = Recorder(rt, "agent/settled")
    agents = [rt.spawn(model=tool_script(), tools=[lookup]) for _ in range(5)]
    for agent in agents:
        agent.followup("go")
    settled.wait_for("agent/settled", 5)
    for agent in agents:
        assert agent.wait_idle(WAIT)
        assert ends(agent) == ["completed"]


# --------------------------------------------------------------------------- waterfalls, serial

FAULTS: dict[str, tuple[str, Callable[..., Any], str, str | None]] = {
    # event: (listener event, listener, expected turn end, expected tool result code)
    "pre-step raises": ("agent/pre-step", boom, "error", None),
    "pre-step returns junk": ("agent/pre-step", lambda e, n: "junk", "error", None),
    "pre-step enters non-messages": (
        "agent/pre-step",
        lambda e, n: type(n())(messages=["not a message"]),
        "error",
        None,
    ),
    "request raises": ("agent/request", boom, "error", None),
    "request returns junk": ("agent/request", lambda e, n: {"model": 1}, "error", None),
    "request returns an ill-typed config": (
        "agent/request",
        lambda e, n: RequestConfig(provider=1, model=None),  # type: ignore[arg-type]
        "error",
        None,
    ),
    "turn-stopping raises": ("agent/turn-stopping", boom, "error", None),
    "tools/pre-execute raises": ("tools/pre-execute", boom, "completed", "TOOL_DENIED"),
    "tools/execute raises": ("tools/execute", boom, "completed", "TOOL_FAILED"),
    "tools/post-execute raises": ("tools/post-execute", boom, "completed", "TOOL_FAILED"),
    "async pre-step raises": ("agent/pre-step", async_boom, "error", None),
    "async turn-stopping raises": ("agent/turn-stopping", async_boom, "error", None),
    "pre-step calls sys.exit": ("agent/pre-step", exits, "error", None),
    "async request calls sys.exit": ("agent/request", async_exits, "error", None),
    "turn-stopping calls sys.exit": ("agent/turn-stopping", exits, "error", None),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_faulty_hook_ends_only_its_own_turn_as_the_contract_says(rt: Runtime, fault: str) -> None:
    name, listener, end, code = FAULTS[fault]
    offered = Recorder(rt, "agent/request-error")
    agent = rt.spawn(model=tool_script(), tools=[lookup])
    agent.on(name, listener)
    other = run_bystander(rt)
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert agent.crash is None
    assert ends(agent) == [end]
    results = [e.data for e in agent.session.events() if e.type == "tool/result"]
    if code is not None:
        assert [r.error.code for r in results] == [code]
    if name == "agent/request":
        assert offered.of("agent/request-error") == []  # request listener faults are not offered
    assert check_invariants(agent.session.events()) == []
    assert_bystander_fine(other)
    agent.followup("again")  # the agent itself is still usable
    assert agent.wait_idle(WAIT)
    # the rt fixture reads every log back from the store: nothing unreadable was written


def test_a_raising_request_error_listener_ends_the_turn_as_error_without_a_retry(
    tmp_path: Path,
) -> None:
    from runtime import LlmFailure

    failure = LlmFailure(message="overloaded", code="SERVER", status=503)
    with Runtime.open(tmp_path / "store", retry_policy=None) as rt:
        rt.on("agent/request-error", boom)
        agent = rt.spawn(model=ScriptedModel([failure, "never reached"]))
        agent.followup("go")
        assert agent.wait_idle(WAIT)
        assert ends(agent) == ["error"]
        assert [e.type for e in agent.session.events()].count("turn/start") == 1


# --------------------------------------------------------------------------- slow listeners


def test_a_slow_async_listener_holds_up_neither_its_agent_nor_others(rt: Runtime) -> None:
    gate = asyncio.Event()
    entered = threading.Semaphore(0)
    finished: list[int] = []

    async def slow(event: Any) -> None:
        entered.release()
        await gate.wait()
        finished.append(event.turn)

    agent = rt.spawn(model=tool_script(), tools=[lookup])
    agent.on("agent/settled", slow)
    other = run_bystander(rt)
    for text in ("one", "two", "three"):
        agent.followup(text)
    assert agent.wait_idle(WAIT)  # three turns settled while every listener call waits
    assert ends(agent) == ["completed"] * 3
    for _ in range(3):
        assert entered.acquire(timeout=WAIT)
    assert finished == []
    assert_bystander_fine(other)
    rt.io.loop.call_soon_threadsafe(gate.set)
    done = threading.Event()
    rt.io.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(_when(gate, done)))
    assert done.wait(WAIT)


async def _when(gate: asyncio.Event, done: threading.Event) -> None:
    await gate.wait()
    await asyncio.sleep(0)
    done.set()


def test_a_slow_sync_listener_blocks_only_the_dispatcher_thread_it_runs_on(
    tmp_path: Path,
) -> None:
    gate = threading.Event()
    blocked = threading.Event()

    def slow(_event: Any) -> None:
        blocked.set()
        assert gate.wait(WAIT)

    with Runtime.open(tmp_path / "store", threads=2) as rt:
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.on("agent/settled", slow)
        agent.followup("one")
        assert blocked.wait(WAIT)
        other = run_bystander(rt)  # runs on the other dispatcher worker meanwhile
        assert_bystander_fine(other)
        gate.set()
        assert agent.wait_idle(WAIT)


def test_cancel_interrupts_a_slow_async_turn_stopping_listener(rt: Runtime) -> None:
    reached = threading.Event()
    cancelled = threading.Event()

    async def stall(_event: Any) -> None:
        reached.set()
        try:
            await asyncio.Event().wait()  # never set: only a cancel ends it
        except asyncio.CancelledError:
            cancelled.set()
            raise

    agent = rt.spawn(model=ScriptedModel.echo())
    agent.on("agent/turn-stopping", stall)
    agent.followup("go")
    assert reached.wait(WAIT)
    agent.cancel()
    assert agent.wait_idle(WAIT)
    assert ends(agent) == ["aborted"]
    assert cancelled.wait(WAIT)


# --------------------------------------------------------------------------- re-entrant


def test_a_settled_listener_may_send_its_own_agent_more_work(rt: Runtime) -> None:
    statuses = Recorder(rt, "agent/status", "agent/settled")
    agent = rt.spawn(model=tool_script(), tools=[lookup])
    sent = [0]

    def more(event: Any) -> None:
        if sent[0] < 4:
            sent[0] += 1
            event.agent.followup(f"more {sent[0]}")

    agent.on("agent/settled", more)
    agent.followup("start")
    statuses.wait_for("agent/settled", 5)
    assert agent.wait_idle(WAIT)
    assert len(ends(agent)) == 5
    values = [e.status for e in statuses.of("agent/status")]
    assert all(a != b for a, b in itertools.pairwise(values)), values
    assert values[-1] == "idle"


def test_an_inserted_listener_may_cancel_its_own_agent(rt: Runtime) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())

    def stop(event: Any) -> None:
        if event.message.content[0].text == "stop":
            event.agent.cancel()

    agent.on("agent/inbox/inserted", stop)
    agent.followup("work")
    agent.followup("stop")
    assert agent.wait_idle(WAIT)
    assert agent.inbox.ids() == []
    assert check_invariants(agent.session.events()) == []


def test_a_listener_may_spawn_and_drive_another_agent(rt: Runtime) -> None:
    children: list[Agent] = []

    def spawn_child(event: Any) -> None:
        if event.status == "running" and not children:
            child = rt.spawn(model=ScriptedModel.echo())
            child.followup("from a listener")
            children.append(child)

    parent = rt.spawn(model=ScriptedModel.echo())
    parent.on("agent/status", spawn_child)
    parent.followup("go")
    assert parent.wait_idle(WAIT)
    assert len(children) == 1
    assert children[0].wait_idle(WAIT)
    assert ends(children[0]) == ["completed"]


def test_a_session_observer_that_appends_is_refused_and_the_turn_is_unchanged(
    rt: Runtime, tmp_path: Path
) -> None:
    baseline = clean_run_types(tmp_path)
    refused: list[BaseException] = []
    agent = rt.spawn(model=tool_script(), tools=[lookup])

    def observer(event: Any) -> None:
        try:
            agent.session.append("turn/start", {"turn": 99, "trigger": {"kind": "message"}})
        except ReentrantAppendError as err:
            refused.append(err)
            raise

    agent.session.on_event(observer)
    agent.on("session/event", lambda live: observer(live.event))
    agent.inject("context")
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert types(agent) == baseline
    assert len(refused) == 2 * len(baseline)  # both observers refused on every fact


def test_an_inbox_edit_from_the_agents_own_listener_is_applied_at_once_in_order(
    rt: Runtime,
) -> None:
    outcome: list[BaseException | None] = []
    agent = rt.spawn(model=ScriptedModel.echo())

    def remove_it(event: Any) -> None:
        if event.message.content[0].text != "drop me":
            return
        try:
            event.agent.remove(event.message.id, timeout=0.5)
            outcome.append(None)
        except Exception as err:
            outcome.append(err)

    agent.on("agent/inbox/inserted", remove_it)
    kept = agent.inject("keep me")
    dropped = agent.inject("drop me")
    assert agent.wait_idle(WAIT)
    assert outcome == [None], "the edit ran inline on the actor's thread, without waiting"
    assert agent.inbox.ids() == [kept]
    splices = [e.data for e in agent.session.events() if e.type == "agent/inbox/spliced"]
    assert [(s.removed_count, s.outcome) for s in splices] == [
        (0, None),
        (0, None),
        (1, "canceled"),
    ]
    assert splices[1].inserted[0].id == dropped


def test_a_send_then_an_edit_from_the_agents_own_listener_apply_in_the_order_they_were_made(
    rt: Runtime,
) -> None:
    # The edit is applied at once (above); the send before it used to wait in the
    # mailbox behind the listener, so the edit did not find it: remove() raised
    # UnknownMessageError, clear() missed it and the "cleared" message ran.
    outcome: list[object] = []
    agent = rt.spawn(model=ScriptedModel.echo())

    def on_settled(event: Any) -> None:
        if event.turn != 1:
            return
        try:
            retracted = event.agent.followup("retract me", id="retracted")
            outcome.append(event.agent.remove(retracted).id)
            event.agent.steer("cleared", id="cleared")
            event.agent.inject("cleared too", id="cleared-too")
            outcome.append(event.agent.inbox.ids())
            outcome.append([m.id for m in event.agent.clear()])
            event.agent.followup("kept", id="kept")
        except Exception as err:
            outcome.append(err)

    agent.on("agent/settled", on_settled)
    agent.followup("first", id="first")
    assert agent.wait_idle(WAIT)
    assert outcome == ["retracted", ["cleared", "cleared-too"], ["cleared", "cleared-too"]]
    entered = [m.id for m in agent.session.messages() if m.role == "user"]
    assert entered == ["first", "kept"]
    statuses = [e for e in agent.session.events() if e.type == "turn/end"]
    assert len(statuses) == 2
    assert check_invariants(agent.session.events()) == []


def test_sends_from_the_agents_own_inbox_listeners_are_queued_in_log_order_and_never_nest(
    rt: Runtime,
) -> None:
    # A send from an agent/inbox/* listener is queued, not inserted at once: inserted at
    # once, its agent/inbox/inserted came before the rest of the splice's live events,
    # and a chain of such sends nested until RecursionError (~140 deep), the sends
    # that raised being logged and run all the same.
    agent = rt.spawn(model=ScriptedModel.echo())
    chain = 400
    sent: list[str] = []
    errors: list[BaseException] = []

    def chained(event: Any) -> None:
        if event.message.id.startswith("c") and len(sent) < chain:
            try:
                sent.append(agent.inject("more", id=f"c{len(sent) + 1}"))
            except BaseException as err:
                errors.append(err)
                raise

    agent.on("agent/inbox/inserted", chained)
    live: list[str] = []
    agent.on(
        "agent/inbox/discarded",
        lambda event: agent.inject("Z", id="Z") if event.message.id == "A" else None,
    )
    for name in ("inserted", "discarded"):
        agent.on(f"agent/inbox/{name}", lambda e, n=name: live.append(f"{n} {e.message.id}"))
    agent.inject("start", id="c0")
    agent.inject("A", id="A")
    agent.replace("A", UserMessage(id="A2", content=[TextBlock(text="A2")]))
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert errors == [] and len(sent) == chain
    inbox_live = [entry for entry in live if entry.split()[1] in ("A", "A2", "Z")]
    assert inbox_live == ["inserted A", "discarded A", "inserted A2", "inserted Z"]
    entered = [m.id for m in agent.session.messages() if m.role == "user"]
    assert set(sent) <= set(entered)
    assert check_invariants(agent.session.events()) == []


def test_dispose_from_the_agents_own_listener_starts_the_disposal_without_waiting_for_itself(
    rt: Runtime,
) -> None:
    outcome: list[object] = []
    agent = rt.spawn(model=ScriptedModel.echo())

    def dispose_me(event: Any) -> None:
        try:
            outcome.append(event.agent.dispose(timeout=30.0))
        except Exception as err:
            outcome.append(err)

    agent.on("agent/settled", dispose_me)
    agent.followup("go")
    assert agent.dispose(WAIT)  # shares the disposal the listener started
    assert outcome == [False], "it returned at once: the disposal needs the listener's actor"
    assert agent.disposed


def test_wait_idle_from_the_agents_own_listener_is_refused_instead_of_waiting_for_itself(
    rt: Runtime,
) -> None:
    outcome: list[object] = []
    agent = rt.spawn(model=ScriptedModel.echo())

    def wait_for_me(event: Any) -> None:
        try:
            outcome.append(event.agent.wait_idle(timeout=30.0))
        except Exception as err:
            outcome.append(err)

    agent.on("agent/settled", wait_for_me)
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert len(outcome) == 1
    assert isinstance(outcome[0], AgentStateError)
    assert "wait for itself" in str(outcome[0])
