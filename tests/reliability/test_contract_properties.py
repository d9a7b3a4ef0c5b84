"""The contract under random schedules: a Hypothesis state machine drives 1-3 agents on
a real runtime (real LMDB store) with random interleavings of followup / steer /
inject / remove / replace / clear / cancel (with and without ``keep_inbox``) / dispose
/ resume / passivate (rehydrated by the next use), scripted model failures (retried and terminal), slow (gated) and failing
tools, and faulty listeners, and checks CONTRACT after every step.

After every step (while agents run): no MessageId is claimed or discarded twice, or
both; ``agent/status`` never repeats a value; no turn settles twice; every log keeps
the session invariants (an open tail allowed); every model request's messages equal
the session's derived history when it was sent.

At quiescence (the ``settle`` rule and the end; every wait bounded, so nothing hangs):
each inserted id is exactly one of claimed, discarded, pending; the live inbox equals
the inbox replayed from the durable splices; a successful ``remove``/``replace``/
``clear`` discarded its ids; ``cancel()`` left nothing sent before it pending; a
pending followup/steer means the chain stopped on error/aborted/blocked;
``agent/settled`` fired exactly once per chain (per ``turn/start`` with a message
trigger), for the chain's terminal turn; the durable log equals the in-memory one; each
request's messages equal ``derive_messages`` over the durable log as of that request.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from runtime import (
    AgentDisposedError,
    LlmFailure,
    RetryPolicy,
    Runtime,
    ScriptedModel,
    ToolCall,
    UnknownMessageError,
    tool,
)
from runtime.scripted import ScriptItem
from storage import check_invariants, derive_messages

from .conftest import WAIT, Recorder, check_whole_store

PLANS: dict[str, ScriptItem] = {
    "text": "plain answer",
    "tool": [ToolCall(name="quick", arguments={"n": 1})],
    "two tools": [ToolCall(name="quick", arguments={"n": 1}), ToolCall(name="quick")],
    "slow tool": [ToolCall(name="slow")],
    "failing tool": [ToolCall(name="broken")],
    "bad json": [ToolCall(name="quick", raw_arguments="{oops")],
    "server failure": LlmFailure(message="overloaded", code="SERVER", status=503),
    "auth failure": LlmFailure(message="bad key", code="AUTH", status=401),
}
LISTENERS = ("raising settled", "raising status", "slow async status", "raising post-execute")
NORMAL_ENDS = ("completed", "max-tokens")
EXPLORED: Counter[str] = Counter()  # what the examples of this run did, for the report
NAMES = (
    "agent/status",
    "agent/inbox/inserted",
    "agent/inbox/claimed",
    "agent/inbox/discarded",
    "agent/settled",
)


def _boom(*_args: Any) -> Any:
    raise RuntimeError("listener fault")


async def _slow_async(_event: Any) -> None:
    await _yield_a_few()


async def _yield_a_few() -> None:
    import asyncio

    for _ in range(3):
        await asyncio.sleep(0)


class Driven:
    """One agent as the state machine knows it: its handle, model plan and what was sent."""

    def __init__(self, machine: ContractMachine, agent_id: str) -> None:
        self.id = agent_id
        self.plan: deque[ScriptItem] = deque()
        self.latency = 0.0
        self.requests: list[tuple[int, list[Any], bool]] = []
        self.sent: dict[str, str] = {}  # id -> verb
        self.removed: set[str] = set()  # discarded by a successful remove/replace/clear
        self.cancelled: set[str] = set()  # sent before a cancel(keep_inbox=False)
        self.disposed = False
        self.machine = machine
        self.agent = machine.start(self)

    def reply(self, request: Any) -> ScriptItem:
        session = self.agent.session
        messages = list(request.messages)
        self.requests.append((session.last_seq, messages, messages == session.derive_messages()))
        return self.plan.popleft() if self.plan else "echo"


class ContractMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="corral-contract-"))
        policy = RetryPolicy(max_retries=2, base_s=0.001, cap_s=0.002)
        self.rt = Runtime.open(self.dir / "store", retry_policy=policy)
        self.rec = Recorder(self.rt, *NAMES)
        self.gate = threading.Event()
        self.agents: list[Driven] = []
        self.listeners: set[str] = set()

        @tool(concurrency_safe=True)
        def quick(n: int = 0) -> str:
            """Answer at once."""
            return f"quick {n}"

        @tool
        def slow() -> str:
            """Answer once the test opens the gate."""
            gate = self.gate
            return "slow done" if gate.wait(WAIT) else "gate timed out"

        @tool
        def broken() -> str:
            """Fail."""
            raise ValueError("the tool broke")

        self.tools = [quick, slow, broken]

    # ------------------------------------------------------------------ plumbing

    def start(self, driven: Driven, *, resume: bool = False) -> Any:
        model = ScriptedModel(driven.reply, latency=lambda: driven.latency, chunks=2)
        if resume:
            return self.rt.resume(driven.id, model=model, tools=self.tools)
        return self.rt.spawn(model=model, tools=self.tools, session_id=driven.id)

    def live(self) -> list[Driven]:
        return [d for d in self.agents if not d.disposed]

    def pick(self, data: st.DataObject, *, disposed: bool = False) -> Driven:
        pool = [d for d in self.agents if d.disposed == disposed]
        return data.draw(st.sampled_from(pool), label="agent")

    def has_live(self) -> bool:
        return bool(self.live())

    def has_disposed(self) -> bool:
        return any(d.disposed for d in self.agents)

    def send(self, driven: Driven, verb: str) -> None:
        message_id = getattr(driven.agent, verb)(f"{verb} #{len(driven.sent)}")
        driven.sent[message_id] = verb
        EXPLORED[verb] += 1

    # ------------------------------------------------------------------ rules

    @initialize(count=st.integers(1, 3))
    def spawn_agents(self, count: int) -> None:
        self.agents = [Driven(self, f"agent-{index}") for index in range(count)]

    VERBS = st.lists(st.sampled_from(["followup", "steer", "inject"]), min_size=1, max_size=3)

    @precondition(has_live)
    @rule(data=st.data(), verbs=VERBS)
    def send_messages(self, data: st.DataObject, verbs: list[str]) -> None:
        driven = self.pick(data)
        for verb in verbs:
            self.send(driven, verb)

    @precondition(has_live)
    @rule(data=st.data(), verbs=VERBS)
    def send_more_messages(self, data: st.DataObject, verbs: list[str]) -> None:
        self.send_messages(data, verbs)

    @precondition(has_live)
    @rule(data=st.data(), item=st.sampled_from(sorted(PLANS)), times=st.integers(1, 3))
    def plan_replies(self, data: st.DataObject, item: str, times: int) -> None:
        self.pick(data).plan.extend([PLANS[item]] * times)

    @precondition(has_live)
    @rule(
        data=st.data(),
        change=st.sampled_from(
            ["latency 0", "latency 1", "latency 4", "close gate", "open gate", *LISTENERS]
        ),
    )
    def change_environment(self, data: st.DataObject, change: str) -> None:
        if change.startswith("latency"):
            self.pick(data).latency = int(change.split()[1]) / 1000
        elif change == "close gate":
            if self.gate.is_set():
                self.gate = threading.Event()
        elif change == "open gate":
            self.gate.set()
        else:
            self.add_listener(change)

    @precondition(has_live)
    @rule(data=st.data(), op=st.sampled_from(["remove", "replace", "clear"]))
    def edit_inbox(self, data: st.DataObject, op: str) -> None:
        driven = self.pick(data)
        if op == "clear":
            driven.removed.update(m.id for m in driven.agent.clear(timeout=WAIT))
            EXPLORED["clear"] += 1
        elif driven.sent:
            # the draw must not depend on the runtime's progress (Hypothesis replays it):
            # draw an index, then prefer a message that is pending right now
            index = data.draw(st.integers(0, 1 << 16), label="index")
            candidates = sorted(set(driven.agent.inbox.ids()) & set(driven.sent))
            candidates = candidates or sorted(driven.sent)
            getattr(self, op)(driven, candidates[index % len(candidates)])

    def remove(self, driven: Driven, target: str) -> None:
        try:
            driven.agent.remove(target, timeout=WAIT)
        except UnknownMessageError:
            return
        driven.removed.add(target)
        EXPLORED["remove"] += 1

    def replace(self, driven: Driven, target: str) -> None:
        try:
            new_id = driven.agent.replace(target, f"replacement for {target}", timeout=WAIT)
        except UnknownMessageError:
            return
        driven.removed.add(target)
        driven.sent[new_id] = "replace"
        EXPLORED["replace"] += 1

    @precondition(has_live)
    @rule(data=st.data(), keep_inbox=st.booleans())
    def cancel(self, data: st.DataObject, keep_inbox: bool) -> None:
        driven = self.pick(data)
        driven.agent.cancel(keep_inbox=keep_inbox)
        EXPLORED["cancel (keep inbox)" if keep_inbox else "cancel"] += 1
        if not keep_inbox:
            driven.cancelled.update(driven.sent)

    @precondition(has_live)
    @rule(data=st.data())
    def dispose(self, data: st.DataObject) -> None:
        driven = self.pick(data)
        self.gate.set()  # a gated tool in flight would hold dispose up
        assert driven.agent.dispose(WAIT), f"{driven.id} did not dispose"
        driven.disposed = True
        EXPLORED["dispose"] += 1
        with pytest.raises(AgentDisposedError, match="is disposed"):
            driven.agent.followup("too late")
        with pytest.raises(AgentDisposedError, match="is disposed"):
            driven.agent.inject("too late")
        self.check_disposed(driven)

    @precondition(has_live)
    @rule(data=st.data())
    def passivate(self, data: st.DataObject) -> None:
        driven = self.pick(data)
        if driven.agent.passivate(timeout=WAIT):  # False (a no-op) while it is busy
            EXPLORED["passivate"] += 1
            assert driven.agent.passive

    @precondition(has_disposed)
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        driven = self.pick(data, disposed=True)
        driven.agent = self.start(driven, resume=True)
        driven.disposed = False
        EXPLORED["resume"] += 1
        assert driven.agent.inbox.ids() == [], "dispose cleared the inbox durably"
        assert driven.agent.status == "idle"
        assert check_invariants(driven.agent.session.events()) == []

    def add_listener(self, kind: str) -> None:
        if kind in self.listeners:
            return
        self.listeners.add(kind)
        if kind == "raising settled":
            self.rt.on("agent/settled", _boom)
        elif kind == "raising status":
            self.rt.on("agent/status", _boom)
        elif kind == "slow async status":
            self.rt.on("agent/status", _slow_async)
        else:
            self.rt.on("tools/post-execute", _boom)

    @rule()
    def settle(self) -> None:
        self.gate.set()
        for driven in self.live():
            assert driven.agent.wait_idle(WAIT), f"{driven.id} did not become idle"
        self.rt.flush(WAIT)
        for driven in self.live():
            self.check_quiescent(driven)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def ids_resolve_at_most_once(self) -> None:
        for driven in self.agents:
            claimed = [e.message.id for e in self.rec.of("agent/inbox/claimed", driven.id)]
            discarded = [e.message.id for e in self.rec.of("agent/inbox/discarded", driven.id)]
            resolved = claimed + discarded
            assert len(resolved) == len(set(resolved)), "an id was claimed/discarded twice"

    @invariant()
    def status_never_repeats(self) -> None:
        for driven in self.agents:
            values = [e.status for e in self.rec.of("agent/status", driven.id)]
            repeats = [a for a, b in itertools.pairwise(values) if a == b]
            assert not repeats, f"{driven.id}: agent/status repeated: {values}"

    @invariant()
    def no_turn_settles_twice(self) -> None:
        for driven in self.agents:
            turns = [e.turn for e in self.rec.of("agent/settled", driven.id)]
            assert len(turns) == len(set(turns)), f"{driven.id}: settled twice: {turns}"

    @invariant()
    def logs_stay_sound_and_requests_match_history(self) -> None:
        for driven in self.agents:
            if driven.agent.passive:
                continue  # reading its session would rehydrate it
            events = driven.agent.session.events()
            assert check_invariants(events, allow_open_tail=True) == [], driven.id
            assert all(same for _, _, same in driven.requests), "a request differed from history"

    # ------------------------------------------------------------------ quiescent checks

    def check_disposed(self, driven: Driven) -> None:
        inserted = {e.message.id for e in self.rec.of("agent/inbox/inserted", driven.id)}
        resolved = {
            e.message.id
            for name in ("agent/inbox/claimed", "agent/inbox/discarded")
            for e in self.rec.of(name, driven.id)
        }
        assert inserted == resolved, "a disposed agent left messages unresolved"
        assert driven.agent.session.pending_inbox() == ([], [])
        assert check_invariants(driven.agent.session.events()) == []

    def check_quiescent(self, driven: Driven) -> None:
        agent, aid = driven.agent, driven.id
        events = agent.session.events()
        assert check_invariants(events) == [], aid
        pending = agent.inbox.ids()
        next_turn, next_step = agent.session.pending_inbox()
        assert [m.id for m in (*next_turn, *next_step)] == pending, "durable inbox differs"
        inserted = [e.message.id for e in self.rec.of("agent/inbox/inserted", aid)]
        claimed = {e.message.id for e in self.rec.of("agent/inbox/claimed", aid)}
        discarded = {e.message.id for e in self.rec.of("agent/inbox/discarded", aid)}
        for message_id in inserted:
            states = [message_id in claimed, message_id in discarded, message_id in pending]
            assert sum(states) == 1, f"{message_id}: claimed/discarded/pending = {states}"
        assert set(driven.sent) <= set(inserted), "a sent message was never inserted"
        assert driven.removed <= discarded and not driven.removed & claimed
        assert not driven.cancelled & set(pending), "cancel() left earlier messages pending"
        ends = [e.data for e in events if e.type == "turn/end"]
        starts = [e.data for e in events if e.type == "turn/start"]
        waking = [m for m in pending if driven.sent.get(m) in ("followup", "steer")]
        if waking:
            assert ends and ends[-1].reason.kind not in NORMAL_ENDS, (
                f"{aid}: {waking} pending at idle after a {ends[-1].reason.kind} turn"
            )
        retried = {s.trigger.previous_turn for s in starts if s.trigger.kind == "retry"}
        terminal = [end.turn for end in ends if end.turn not in retried]
        settled = [e.turn for e in self.rec.of("agent/settled", aid)]
        assert sorted(settled) == terminal, f"{aid}: settled {settled}, terminal {terminal}"
        chains = sum(1 for s in starts if s.trigger.kind == "message")
        assert len(settled) == chains, f"{aid}: {len(settled)} settled for {chains} chains"
        statuses = [e.status for e in self.rec.of("agent/status", aid)]
        assert not statuses or statuses[-1] == "idle", f"{aid}: last status {statuses[-1:]}"
        durable = self.rt.store.read(aid)
        assert durable == events, f"{aid}: the durable log differs from the session"
        for last_seq, messages, _ in driven.requests:
            assert derive_messages(durable[: last_seq + 1]) == messages, "request != history"

    def teardown(self) -> None:
        try:
            self.settle()
            EXPLORED["examples"] += 1
            for driven in self.agents:
                events = driven.agent.session.events()
                EXPLORED["turns"] += sum(1 for e in events if e.type == "turn/start")
                EXPLORED["model requests"] += len(driven.requests)
                EXPLORED["facts"] += len(events)
        finally:
            self.gate.set()
            self.rt.close(timeout=WAIT)
            try:
                check_whole_store(self.dir / "store")
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def report_exploration() -> Iterator[None]:
    EXPLORED.clear()
    yield
    figures = ", ".join(f"{k} {v}" for k, v in sorted(EXPLORED.items()))
    print(f"\ncontract state machine explored: {figures}")


CI = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SOAK = settings(CI, max_examples=2_000, stateful_step_count=50)

TestContractUnderRandomSchedules = ContractMachine.TestCase
TestContractUnderRandomSchedules.settings = CI


class TestContractUnderRandomSchedulesSoak(ContractMachine.TestCase):  # type: ignore[misc,valid-type]
    settings = SOAK
    pytestmark = [pytest.mark.soak, pytest.mark.timeout(6 * 3600)]
