"""Waits between agents: a sync listener (or a tool body) that waits for another agent
never waits behind itself, and a wait that would close a cycle of waits is refused at
once instead of hanging (``actors.waiting_for``): ``dispose()`` returns False (its
disposal goes on once the cycle unwinds), ``wait_idle()`` raises ``WaitCycleError``, an
inbox edit raises ``EditTimeoutError`` (it stays queued). The first waits of a cycle go
through and end once the refused one returns. RELIABILITY.md section 7."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from actors import LendingLock
from runtime import (
    Agent,
    EditTimeoutError,
    Runtime,
    ScriptedModel,
    ToolCall,
    WaitCycleError,
    tool,
)

from .conftest import WAIT, HeldActor, ScenarioClock, check_store


@pytest.fixture
def rt(threaded_rt: Runtime) -> Runtime:
    return threaded_rt


class Outcomes:
    """What each listener's wait gave (a value or the exception), keyed by a name."""

    def __init__(self, expected: int) -> None:
        self.seen: dict[str, Any] = {}
        self._expected = expected
        self._changed = threading.Condition()

    def record(self, name: str, call: Any) -> None:
        try:
            value = call()
        except Exception as err:  # recorded for the test to look at
            value = err
        with self._changed:
            self.seen[name] = value
            self._changed.notify_all()

    def all_in(self) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: len(self.seen) >= self._expected, WAIT)


@pytest.mark.parametrize("verb", ["wait_idle", "dispose"])
def test_a_listener_waits_for_an_agent_whose_turn_settles_in_the_same_flush(
    rt: Runtime, verb: str
) -> None:
    # Both turns end in one flush group, whose outcome calls each agent back in turn on
    # one worker: B's used to wait behind A's listener, which waited for B.
    a = rt.spawn(model=ScriptedModel.echo(), session_id="A")
    b = rt.spawn(model=ScriptedModel.echo(), session_id="B")
    outcomes = Outcomes(1)

    def wait_for_b(event: Any) -> None:
        outcomes.record(verb, lambda: getattr(b, verb)(WAIT))

    a.on("agent/settled", wait_for_b)
    a.followup("hi")
    b.followup("hi")
    assert outcomes.all_in()
    assert outcomes.seen == {verb: True}


def test_two_agents_whose_listeners_dispose_of_each_other_both_end_disposed(
    rt: Runtime,
) -> None:
    agents = {n: rt.spawn(model=ScriptedModel.echo(), session_id=n) for n in "AB"}
    outcomes = Outcomes(2)

    def dispose_other(event: Any) -> None:
        other = agents["B" if event.agent.id == "A" else "A"]
        outcomes.record(event.agent.id, lambda: other.dispose(WAIT))

    rt.on("agent/settled", dispose_other)
    agents["A"].followup("hi")
    agents["B"].followup("hi")
    assert outcomes.all_in()
    # Whichever waited second would have closed the cycle: it got False at once.
    assert sorted(outcomes.seen.values()) == [False, True]
    for agent in agents.values():
        assert agent.dispose(WAIT)
        assert agent.disposed


def test_a_created_listener_that_disposes_of_the_spawning_agent_lets_the_spawn_return(
    rt: Runtime,
) -> None:
    parent = rt.spawn(model=ScriptedModel.echo(), session_id="parent")
    outcomes = Outcomes(2)

    def spawn_child(event: Any) -> None:
        outcomes.record("spawn", lambda: rt.spawn(model=ScriptedModel.echo(), session_id="c"))

    def dispose_parent(event: Any) -> None:
        if event.agent.id == "c":
            outcomes.record("dispose", lambda: parent.dispose(WAIT))

    parent.on("agent/settled", spawn_child)
    rt.on("agent/created", dispose_parent)
    parent.followup("spawn a child")
    assert outcomes.all_in()
    assert outcomes.seen["dispose"] is False  # it waited for the spawn, which waited for it
    child = outcomes.seen["spawn"]
    assert isinstance(child, Agent) and child.id == "c"
    assert parent.dispose(WAIT) and parent.disposed
    child.followup("still alive")
    assert child.wait_idle(WAIT)


def test_wait_idle_that_would_close_a_cycle_raises_and_the_first_wait_ends(
    rt: Runtime,
) -> None:
    agents = {n: rt.spawn(model=ScriptedModel.echo(), session_id=n) for n in "AB"}
    outcomes = Outcomes(2)

    def wait_for_other(event: Any) -> None:
        other = agents["B" if event.agent.id == "A" else "A"]
        outcomes.record(event.agent.id, lambda: other.wait_idle(WAIT))

    rt.on("agent/settled", wait_for_other)
    agents["A"].followup("hi")
    agents["B"].followup("hi")
    assert outcomes.all_in()
    refused = [v for v in outcomes.seen.values() if isinstance(v, WaitCycleError)]
    assert len(refused) == 1 and [v for v in outcomes.seen.values() if v is True]
    assert "would never end" in str(refused[0])
    for agent in agents.values():
        assert agent.wait_idle(WAIT)


def test_an_inbox_edit_that_would_close_a_cycle_is_refused_and_applied_later(
    rt: Runtime,
) -> None:
    watcher = rt.spawn(model=ScriptedModel.echo(), session_id="watcher")
    other = rt.spawn(model=ScriptedModel.echo(), session_id="other")
    parked = watcher.inject("parked")  # next-step: waits for the watcher's next turn
    outcomes = Outcomes(2)
    waiting = threading.Event()

    def wait_for_other(event: Any) -> None:  # on the watcher's actor
        if event.message.id == parked:
            return
        waiting.set()
        outcomes.record("wait", lambda: other.wait_idle(WAIT))

    def edit_watcher(event: Any) -> None:  # on the other's actor, while the watcher waits
        assert waiting.wait(WAIT)
        outcomes.record("edit", lambda: watcher.remove(parked, timeout=WAIT))

    watcher.on("agent/inbox/inserted", wait_for_other)
    other.on("agent/settled", edit_watcher)
    other.followup("hi")
    watcher.followup("wake")
    assert outcomes.all_in()
    assert outcomes.seen["wait"] is True
    assert isinstance(outcomes.seen["edit"], EditTimeoutError)
    assert "would never end" in str(outcomes.seen["edit"])
    assert watcher.wait_idle(WAIT)
    assert parked not in watcher.inbox.ids()  # the queued edit was applied in order


def test_a_tool_body_that_waits_for_an_agent_waiting_for_its_own_agent_is_refused(
    rt: Runtime,
) -> None:
    # Through an effect: B's turn waits for its tool body, which waits for A to go
    # idle, while A's listener waits for B to go idle.
    outcomes = Outcomes(2)
    a_waits = threading.Event()
    agents: dict[str, Agent] = {}

    @tool
    def wait_for_a() -> str:
        """Wait for agent A."""
        assert a_waits.wait(WAIT)
        outcomes.record("tool", lambda: agents["A"].wait_idle(WAIT))
        return "done"

    agents["A"] = rt.spawn(model=ScriptedModel.echo(), session_id="A")
    model = ScriptedModel([[ToolCall(name="wait_for_a", arguments={})], "ok"])
    agents["B"] = rt.spawn(model=model, tools=[wait_for_a], session_id="B")

    def wait_for_b(event: Any) -> None:
        a_waits.set()
        outcomes.record("listener", lambda: agents["B"].wait_idle(WAIT))

    agents["A"].on("agent/settled", wait_for_b)
    agents["B"].followup("call the tool")
    agents["A"].followup("hi")
    assert outcomes.all_in()
    # Whichever waited second closed the cycle (the tool body, mostly) and was refused.
    values = list(outcomes.seen.values())
    assert len([v for v in values if isinstance(v, WaitCycleError)]) == 1 and True in values
    assert agents["B"].wait_idle(WAIT)


@pytest.mark.parametrize("verb", ["wait_idle", "dispose"])
def test_an_agent_disposed_listener_waiting_for_the_agent_that_disposes_it_is_refused(
    rt: Runtime, verb: str
) -> None:
    # B's disposal ends once its agent/disposed listeners return: the thread running
    # them holds B for a wait on its disposal, as its actor's thread holds it otherwise.
    a = rt.spawn(model=ScriptedModel.echo(), session_id="A")
    b = rt.spawn(model=ScriptedModel.echo(), session_id="B")
    outcomes = Outcomes(2)

    def dispose_b(event: Any) -> None:
        outcomes.record("A disposes B", lambda: b.dispose(WAIT))

    def wait_for_a(event: Any) -> None:
        outcomes.record(verb, lambda: getattr(a, verb)(WAIT))

    a.on("agent/settled", dispose_b)
    b.on("agent/disposed", wait_for_a)
    a.followup("hi")
    assert outcomes.all_in()
    assert outcomes.seen["A disposes B"] is True
    refused = outcomes.seen[verb]
    assert refused is False if verb == "dispose" else isinstance(refused, WaitCycleError)


def test_a_listener_blocked_on_an_agent_being_passivated_lends_its_worker(rt: Runtime) -> None:
    # X's listener passivates Z, holding Z's live lock while it asks Z's actor; Y's
    # listener, run by the worker lent for that, sends to Z and blocks on the lock: it
    # lends a worker too, or nothing was left to run Z's actor (threads=1: passivate
    # waited its whole timeout, or for good without one).
    x, y, z = (rt.spawn(model=ScriptedModel.echo(), session_id=n) for n in "XYZ")
    outcomes = Outcomes(2)
    x.on("agent/settled", lambda event: outcomes.record("passivate", lambda: z.passivate(None)))
    y.on("agent/settled", lambda event: outcomes.record("send", lambda: z.followup("hi Z")))
    x.followup("x")
    y.followup("y")
    assert outcomes.all_in()
    assert isinstance(outcomes.seen["send"], str)  # its MessageId
    assert isinstance(outcomes.seen["passivate"], bool)
    assert z.wait_idle(WAIT)
    assert [m.role for m in z.session.messages()] == ["user", "assistant"]


@pytest.mark.parametrize("threads", [None, 2], ids=lambda t: f"threads={t}")
def test_a_tool_body_past_its_timeout_no_longer_holds_its_idle_agent(
    store_path: Path, threads: int | None, scenario_clock: ScenarioClock
) -> None:
    # A's tool body waits for B and outlives its timeout: A's turn ends without it, A is
    # idle. A wait for A from B's listener closes no cycle (A waits for nothing B does);
    # the body's thread used to count as holding A all the same: WaitCycleError.
    # (Not threads=1: B's listener below waits for A on an Event of its own.)
    agents: dict[str, Agent] = {}
    a_idle = threading.Event()

    @tool(timeout=0.2)
    def wait_for_b() -> str:
        """Wait for agent B."""
        return str(agents["B"].wait_idle(WAIT))

    outcomes = Outcomes(1)
    with Runtime.open(store_path, threads=threads) as rt:
        model = ScriptedModel([[ToolCall(name="wait_for_b", arguments={})], "done"])
        agents["A"] = rt.spawn(model=model, tools=[wait_for_b], session_id="A")
        agents["B"] = rt.spawn(model=ScriptedModel.echo(), session_id="B")
        agents["A"].on(
            "agent/status", lambda event: a_idle.set() if event.status == "idle" else None
        )

        def wait_for_a(event: Any) -> None:
            agents["A"].followup("go")  # A's tool waits for B, busy here
            assert a_idle.wait(WAIT)  # its timeout passed: A's turn ended without it
            outcomes.record("wait", lambda: agents["A"].wait_idle(WAIT))

        agents["B"].on("agent/turn-stopping", wait_for_a)
        agents["B"].followup("hi")
        scenario_clock.elapse(rt, 0.2)  # A's tool times out
        assert outcomes.all_in()
        assert outcomes.seen == {"wait": True}
        assert agents["B"].wait_idle(WAIT) and agents["A"].wait_idle(WAIT)
    check_store(store_path)


def test_a_passivation_yields_to_a_thread_that_blocks_on_the_agents_live_lock(
    rt: Runtime,
) -> None:
    # A passivation holds the agent's live lock while it waits for the actor to say it
    # is idle; a thread that blocks on that lock (a send) may be what the actor waits
    # for (a listener of the actor waiting for an agent whose listener sends to it: a
    # cycle through the lock, which no wait registers), so the passivation gives up
    # (busy) as soon as one does. Before, it held on for its whole timeout (for good
    # with None), and the send with it. Here the actor is simply held busy.
    z = rt.spawn(model=ScriptedModel.echo(), session_id="Z")
    holds, passivator = threading.Event(), []

    class SpyLock(LendingLock):
        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            got = super().acquire(blocking, timeout)
            if got and passivator == [threading.get_ident()]:
                holds.set()  # the passivation holds the lock from here
            return got

    z._slot.lock = SpyLock()
    held = HeldActor(z)
    outcomes = Outcomes(2)

    def passivate() -> None:
        passivator.append(threading.get_ident())
        outcomes.record("passivate", lambda: z.passivate(3 * WAIT))

    threading.Thread(target=passivate, daemon=True).start()
    assert holds.wait(WAIT)
    sender = threading.Thread(
        target=lambda: outcomes.record("send", lambda: z.followup("hi")), daemon=True
    )
    sender.start()
    try:
        assert outcomes.all_in(), outcomes.seen  # both ended while the actor is held
    finally:
        held.release()
    assert outcomes.seen["passivate"] is False  # busy: another thread wanted the agent
    assert isinstance(outcomes.seen["send"], str)
    assert z.wait_idle(WAIT)  # the held message and the send, in one turn
    assert [m.role for m in z.session.messages()] == ["user", "user", "assistant"]
