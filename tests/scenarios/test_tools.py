"""Scenario tests of the tool pipeline (CONTRACT section 6)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from runtime import Allow, Deny, Runtime, ScriptedModel, ToolCall, conclude, tool
from storage.events import TextBlock

from .conftest import WAIT, ScenarioClock, Timeline, check_store
from .models import GateModel


def results(agent: Any) -> list[Any]:
    return [e.data for e in agent.session.events() if e.type == "tool/result"]


def test_results_are_committed_in_model_order_while_safe_calls_run_in_parallel(
    rt: Runtime,
) -> None:
    both_running = threading.Barrier(2, timeout=WAIT)
    order: list[str] = []

    @tool(concurrency_safe=True)
    def slow(name: str) -> str:
        both_running.wait()  # proves the two calls were in flight together
        order.append(name)
        return name

    calls = [
        ToolCall(name="slow", arguments={"name": "a"}),
        ToolCall(name="slow", arguments={"name": "b"}),
    ]
    agent = rt.spawn(model=ScriptedModel([calls, "done"]), tools=[slow])
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert [r.message.content[0].text for r in results(agent)] == ["a", "b"]
    call_seqs = [e.seq for e in agent.session.events() if e.type == "tool/call"]
    assert [r.source_event_seqs for r in results(agent)] == [(s,) for s in call_seqs]


def test_unsafe_calls_run_alone(rt: Runtime) -> None:
    active = 0
    peak = 0
    lock = threading.Lock()

    @tool
    def exclusive(n: int) -> int:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        with lock:
            active -= 1
        return n

    calls = [ToolCall(name="exclusive", arguments={"n": i}) for i in range(4)]
    agent = rt.spawn(model=ScriptedModel([calls, "done"]), tools=[exclusive])
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert peak == 1
    assert [r.message.content[0].text for r in results(agent)] == ["0", "1", "2", "3"]


def test_tool_faults_become_error_results_and_the_turn_goes_on(rt: Runtime) -> None:
    @tool
    def boom() -> str:
        raise ValueError("broken tool")

    @tool
    def weird() -> object:
        return object()

    @tool
    def typed(n: int) -> int:
        return n

    calls = [
        ToolCall(name="boom"),
        ToolCall(name="weird"),
        ToolCall(name="typed", raw_arguments="{not json"),
        ToolCall(name="typed", arguments={"n": "seven"}),
        ToolCall(name="missing"),
    ]
    agent = rt.spawn(model=ScriptedModel([calls, "recovered"]), tools=[boom, weird, typed])
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    codes = [r.error.code for r in results(agent)]
    assert codes == [
        "TOOL_FAILED",
        "TOOL_FAILED",
        "INVALID_ARGUMENTS",
        "INVALID_ARGUMENTS",
        "UNKNOWN_TOOL",
    ]
    assert all(r.message.is_error for r in results(agent))
    assert "broken tool" in results(agent)[0].message.content[0].text
    end = next(e.data for e in agent.session.events() if e.type == "turn/end")
    assert end.reason.kind == "completed"


def test_pre_execute_can_deny_and_post_execute_can_replace_the_output(rt: Runtime) -> None:
    @tool
    def echo(text: str) -> str:
        return text

    def gate(event: Any, next_: Any) -> Any:
        return Deny(reason="not today") if event.arguments["text"] == "no" else next_()

    rt.on("tools/pre-execute", gate)
    rt.on("tools/post-execute", lambda event, next_: f"[{next_()}]")
    calls = [
        ToolCall(name="echo", arguments={"text": "no"}),
        ToolCall(name="echo", arguments={"text": "yes"}),
    ]
    agent = rt.spawn(model=ScriptedModel([calls, "ok"]), tools=[echo])
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    first, second = results(agent)
    assert first.error.code == "TOOL_DENIED" and "not today" in first.message.content[0].text
    assert second.error is None and second.message.content == (TextBlock(text="[yes]"),)


async def _async_none(event: Any, next_: Any) -> Any:
    return None


@pytest.mark.parametrize(
    ("listener", "shown"),
    [
        (lambda event, next_: None, "None"),
        (lambda event, next_: "deny", "'deny'"),
        (lambda event, next_: {"kind": "deny", "reason": "no"}, "{'kind': 'deny'"),
        (lambda event, next_: False, "False"),
        (lambda event, next_: Allow, "<class"),
        (_async_none, "None"),
    ],
    ids=["None", "a string", "a dict", "False", "the Allow class", "None from an async listener"],
)
def test_a_pre_execute_decision_that_is_neither_allow_nor_deny_does_not_run_the_tool(
    rt: Runtime, listener: Any, shown: str
) -> None:
    ran = threading.Event()

    @tool
    def destroy() -> str:
        ran.set()
        return "destroyed"

    rt.on("tools/pre-execute", listener)
    agent = rt.spawn(model=ScriptedModel([[ToolCall(name="destroy")], "ok"]), tools=[destroy])
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert not ran.is_set()
    (result,) = results(agent)
    assert result.error.code == "TOOL_DENIED" and result.message.is_error
    assert "must return Allow or Deny" in result.error.message
    assert shown in result.error.message
    end = next(e.data for e in agent.session.events() if e.type == "turn/end")
    assert end.reason.kind == "completed"


def test_pre_execute_listeners_that_delegate_or_return_allow_let_the_tool_run(
    rt: Runtime,
) -> None:
    @tool
    def echo(text: str) -> str:
        return text

    async def delegating(event: Any, next_: Any) -> Any:
        return await next_()

    rt.on("tools/pre-execute", lambda event, next_: next_())
    rt.on("tools/pre-execute", delegating)
    rt.on("tools/pre-execute", lambda event, next_: Allow())
    agent = rt.spawn(
        model=ScriptedModel([[ToolCall(name="echo", arguments={"text": "hi"})], "ok"]),
        tools=[echo],
    )
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    (result,) = results(agent)
    assert result.error is None and result.message.content == (TextBlock(text="hi"),)


def test_a_concluding_tool_result_ends_the_tool_loop_at_its_step(rt: Runtime) -> None:
    @tool
    def finish(answer: str) -> Any:
        return conclude(answer)

    model = ScriptedModel([[ToolCall(name="finish", arguments={"answer": "42"})], "never asked"])
    agent = rt.spawn(model=model, tools=[finish])
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert model.requests == 1
    assert results(agent)[0].concludes_turn is True
    end = next(e.data for e in agent.session.events() if e.type == "turn/end")
    assert end.reason.kind == "completed"


def test_async_tools_and_execute_middleware_run_off_the_dispatcher(rt: Runtime) -> None:
    threads: list[str] = []

    @tool
    async def fetch(key: str) -> str:
        threads.append(threading.current_thread().name)
        return key.upper()

    async def wrap(event: Any, next_: Any) -> Any:
        return "<" + (await next_()) + ">"

    rt.on("tools/execute", wrap)
    agent = rt.spawn(
        model=ScriptedModel([[ToolCall(name="fetch", arguments={"key": "k"})], "ok"]), tools=[fetch]
    )
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert results(agent)[0].message.content == (TextBlock(text="<K>"),)
    assert threads and "dispatcher" not in threads[0]


def test_an_object_with_an_async_call_method_wraps_the_body_as_async_execute_middleware(
    rt: Runtime,
) -> None:
    class Wrap:
        async def __call__(self, event: Any, next_: Any) -> Any:
            return "<" + (await next_()) + ">"

    @tool
    def shout(key: str) -> str:
        return key.upper()

    rt.on("tools/execute", Wrap())
    agent = rt.spawn(
        model=ScriptedModel([[ToolCall(name="shout", arguments={"key": "k"})], "ok"]), tools=[shout]
    )
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    (result,) = results(agent)
    assert result.error is None and result.message.content == (TextBlock(text="<K>"),)


def test_a_tool_timeout_is_an_error_result(rt: Runtime, scenario_clock: ScenarioClock) -> None:
    release = threading.Event()

    @tool(timeout=0.05)
    def stuck() -> str:
        release.wait(WAIT)
        return "late"

    agent = rt.spawn(model=ScriptedModel([[ToolCall(name="stuck")], "ok"]), tools=[stuck])
    agent.followup("go")
    try:
        scenario_clock.elapse(rt, 0.05)
        assert agent.wait_idle(WAIT)
    finally:
        release.set()
    assert results(agent)[0].error.code == "TOOL_TIMEOUT"


@pytest.mark.parametrize("middleware", ["none", "sync"])
def test_sync_bodies_that_time_out_and_never_return_do_not_take_the_pool_from_other_tools(
    store_path: Any, middleware: str, scenario_clock: ScenarioClock
) -> None:
    # A pool of two threads; two calls whose bodies never return (until the test ends)
    # time out, and the next sync tool still runs: the pool starts a thread in place of
    # each one that a timed-out body keeps, and gives it back when that body returns.
    release = threading.Event()
    both_stuck = threading.Barrier(3, timeout=WAIT)

    @tool(timeout=0.05, concurrency_safe=True)
    def stuck() -> str:
        both_stuck.wait()
        release.wait()  # set by the test's finally
        return "late"

    @tool(timeout=WAIT)
    def fine() -> str:
        return "fine"

    rt = Runtime.open(store_path, blocking_workers=2)
    try:
        if middleware == "sync":
            rt.on("tools/execute", lambda event, next_: next_())
        calls = [[ToolCall(name="stuck"), ToolCall(name="stuck")], [ToolCall(name="fine")], "ok"]
        agent = rt.spawn(model=ScriptedModel(calls), tools=[stuck, fine])
        agent.followup("go")
        both_stuck.wait()  # both pool threads are held by bodies that will time out
        try:
            scenario_clock.elapse(rt, 0.05, timers=2)
            assert agent.wait_idle(WAIT)
            assert rt.io.statistics().abandoned_blocking == 2
        finally:
            release.set()
        first, second, third = results(agent)
        assert first.error.code == second.error.code == "TOOL_TIMEOUT"
        assert third.error is None and third.message.content == (TextBlock(text="fine"),)
        assert rt.io.blocking_pool.wait_idle(WAIT) == 0
        assert rt.io.statistics().abandoned_blocking == 0
    finally:
        release.set()
        rt.close()
    check_store(store_path)


@pytest.mark.parametrize(
    ("chain", "body"),
    [
        ("sync", "sync"),
        ("sync", "sync with a timeout"),
        ("sync", "async"),
        ("sync, async", "sync"),
        ("sync, async", "sync with a timeout"),
        ("async, sync", "sync"),
        ("sync, async, sync", "sync"),
    ],
)
def test_sync_execute_middleware_holding_every_pool_thread_does_not_starve_the_bodies(
    rt: Runtime, chain: str, body: str
) -> None:
    # Twice as many calls as the blocking pool has threads; the first sync listener of
    # every chain waits until a whole pool's worth of them hold a thread each, so the
    # bodies can only run if they need no other pool thread.
    workers = rt.io.blocking_workers
    all_holding = threading.Barrier(workers, timeout=WAIT)
    body_threads: list[str] = []

    def holding(event: Any, next_: Any) -> Any:
        all_holding.wait()
        return next_()

    def passing(event: Any, next_: Any) -> Any:
        return next_()

    async def awaiting(event: Any, next_: Any) -> Any:
        return await next_()

    kinds = chain.split(", ")
    for index, kind in enumerate(kinds):
        first_sync = kind == "sync" and "sync" not in kinds[:index]
        rt.on("tools/execute", awaiting if kind == "async" else holding if first_sync else passing)

    if body == "async":

        @tool(name="work", concurrency_safe=True)
        async def work_async(i: int) -> int:
            body_threads.append(threading.current_thread().name)
            return i

        work: Any = work_async
    else:

        @tool(name="work", concurrency_safe=True, timeout=WAIT if "timeout" in body else None)
        def work_sync(i: int) -> int:
            body_threads.append(threading.current_thread().name)
            return i

        work = work_sync
    per_agent = 8
    agents = [
        rt.spawn(
            model=ScriptedModel(
                [[ToolCall(name="work", arguments={"i": i}) for i in range(per_agent)], "done"]
            ),
            tools=[work],
        )
        for _ in range(2 * workers // per_agent)
    ]
    for agent in agents:
        agent.followup("go")
    for agent in agents:
        assert agent.wait_idle(WAIT)
    for agent in agents:
        assert [r.message.content[0].text for r in results(agent)] == [
            str(i) for i in range(per_agent)
        ]
    assert len(body_threads) == 2 * workers
    assert not any("dispatcher" in name for name in body_threads)


def test_a_sync_body_that_times_out_under_sync_execute_middleware_ends_its_call_at_the_timeout(
    rt: Runtime, scenario_clock: ScenarioClock
) -> None:
    release = threading.Event()
    listener_saw_it = threading.Event()

    @tool(timeout=0.05)
    def stuck() -> str:
        release.wait(WAIT)
        return "late"

    def wrap(event: Any, next_: Any) -> Any:
        try:
            return next_()
        except Exception as err:
            if "timed out" in str(err) or "Timeout" in type(err).__name__:
                listener_saw_it.set()
            raise

    rt.on("tools/execute", wrap)
    agent = rt.spawn(model=ScriptedModel([[ToolCall(name="stuck")], "ok"]), tools=[stuck])
    agent.followup("go")
    try:
        scenario_clock.elapse(rt, 0.05)
        assert agent.wait_idle(WAIT)  # while the body still runs
        assert not release.is_set()
    finally:
        release.set()
    assert results(agent)[0].error.code == "TOOL_TIMEOUT"
    assert listener_saw_it.wait(WAIT)  # its next() raised the timeout once the body returned


def test_after_abort_unstarted_calls_get_synthetic_results(rt: Runtime, timeline: Timeline) -> None:
    started = threading.Event()
    release = threading.Event()

    @tool
    def first() -> str:
        started.set()
        release.wait(WAIT)
        return "finished anyway"

    @tool
    def second() -> str:
        return "never runs"

    agent = rt.spawn(
        model=ScriptedModel([[ToolCall(name="first"), ToolCall(name="second")]]),
        tools=[first, second],
    )
    agent.followup("go")
    assert started.wait(WAIT)
    agent.cancel()
    release.set()
    assert agent.wait_idle(WAIT)
    done, skipped = results(agent)
    assert done.error is None and done.message.content[0].text == "finished anyway"
    assert skipped.error.code == "ABORTED_BEFORE_DISPATCH"
    end = next(e.data for e in agent.session.events() if e.type == "turn/end")
    assert end.reason.kind == "aborted"


def test_tool_call_facts_are_durable_before_the_body_runs(rt: Runtime) -> None:
    durable: list[list[str]] = []

    @tool
    def probe() -> str:
        durable.append([e.type for e in rt.store.read(agent_id)])
        return "ok"

    agent = rt.spawn(model=ScriptedModel([[ToolCall(name="probe")], "ok"]), tools=[probe])
    agent_id = agent.id
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert durable[0][-1] == "tool/call"


def test_a_model_request_is_sent_only_after_its_facts_are_durable(rt: Runtime) -> None:
    durable: list[list[str]] = []
    ids: list[str] = []

    def reply(request: Any) -> str:
        durable.append([e.type for e in rt.store.read(ids[0])])
        return "ok"

    agent = rt.spawn(model=ScriptedModel(reply))
    ids.append(agent.id)
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert durable[0][-2:] == ["user/message", "request/header"]


def test_settled_fires_after_the_terminal_turn_end_is_durable(rt: Runtime) -> None:
    durable: list[str] = []

    def on_settled(event: Any) -> None:
        durable.append(rt.store.read(event.agent.id)[-1].type)

    rt.on("agent/settled", on_settled)
    agent = rt.spawn(model=GateModel(before=(), after=()))
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert durable == ["turn/end"]


class _Escape(BaseException):
    """Not an Exception: what a careless listener might raise."""


@pytest.mark.parametrize("kind", ["sync KeyboardInterrupt", "async BaseException", "body"])
def test_a_base_exception_in_the_tool_pipeline_is_that_calls_failure_and_the_io_loop_runs_on(
    store_path: Any, kind: str
) -> None:
    # Before, it was re-raised out of the I/O loop, whose thread ended: no model stream,
    # async listener or tool of the runtime ran again, and close raised.
    @tool(timeout=WAIT)
    async def probe() -> str:
        if kind == "body":
            raise _Escape("from the body")
        return "fine"

    def sync_listener(event: Any, next_: Any) -> Any:
        raise KeyboardInterrupt

    async def async_listener(event: Any, next_: Any) -> Any:
        raise _Escape("from a listener")

    rt = Runtime.open(store_path)
    try:
        if kind != "body":
            dispose = rt.on(
                "tools/execute", sync_listener if kind.startswith("sync") else async_listener
            )
        agent = rt.spawn(model=ScriptedModel([[ToolCall(name="probe")], "ok"]), tools=[probe])
        agent.followup("go")
        assert agent.wait_idle(WAIT)
        (result,) = results(agent)
        assert result.error is not None and result.error.code == "TOOL_FAILED"
        if kind != "body":
            dispose()
        again = rt.spawn(model=ScriptedModel([[ToolCall(name="probe")], "ok"]), tools=[probe])
        again.followup("go")  # the loop still runs: a model stream and a tool call
        assert again.wait_idle(WAIT)
        assert kind == "body" or results(again)[0].error is None
    finally:
        rt.close()
    check_store(store_path)


def test_a_queued_safe_call_starts_as_soon_as_any_in_flight_call_ends(rt: Runtime) -> None:
    # CONTRACT 6: at most 10 in flight. Before, the 11th and 12th calls waited for the
    # first call, however long it ran, although nine others had ended.
    last_started = threading.Event()
    waited: list[bool] = []

    @tool(concurrency_safe=True)
    def work(i: int) -> int:
        if i == 0:
            waited.append(last_started.wait(WAIT / 2))  # ends only once call 11 started
        elif i == 11:
            last_started.set()
        return i

    calls = [ToolCall(name="work", arguments={"i": i}) for i in range(12)]
    agent = rt.spawn(model=ScriptedModel([calls, "done"]), tools=[work])
    agent.followup("go")
    assert agent.wait_idle(WAIT)
    assert waited == [True]
    assert [r.message.content[0].text for r in results(agent)] == [str(i) for i in range(12)]
