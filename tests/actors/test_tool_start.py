"""A sync tool's body with no tools/execute listener and no timeout runs straight on a
pool thread (``IoSide.call_blocking``): it reports as its blocking effect did."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

import pytest

from actors import IoSide, IoSideClosedError
from actors.streams import ToolHandle, start_tool
from actors.toolphase import ToolPlan
from actors.tools import ToolTimeout

WAIT = 5.0


class _NoListeners:
    def listeners(self, _name: str, *, scope: str | None = None) -> tuple[Any, ...]:
        return ()


class _Tool:
    is_async = False
    timeout_s = None

    def __init__(self, body: Any) -> None:
        self.body = body
        self.ran = threading.Event()

    def run(self, prepared: Any) -> Any:
        self.ran.set()
        return self.body(prepared)


def _start(io: IoSide, tool: _Tool, done: queue.Queue[ToolHandle]) -> ToolHandle:
    plan = ToolPlan(tool=tool, prepared="args", event=None)
    return start_tool(plan, io, _NoListeners(), "agent", done.put)


def _raise(error: BaseException) -> Any:
    def body(_prepared: Any) -> Any:
        raise error

    return body


def test_call_blocking_runs_on_a_pool_thread_and_is_refused_once_closed() -> None:
    io = IoSide(blocking_workers=1, name="call-io")
    ran: queue.Queue[tuple[str, str]] = queue.Queue()
    io.call_blocking(lambda a, b: ran.put((threading.current_thread().name, a + b)), "x", "y")
    name, value = ran.get(timeout=WAIT)
    assert name.startswith("call-io-pool") and value == "xy"
    io.close()
    assert io.closed
    with pytest.raises(IoSideClosedError):
        io.call_blocking(ran.put, "late")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (lambda prepared: f"ran {prepared}", {"output": "ran args"}),
        (_raise(ValueError("bad")), {"error": ValueError}),
        (_raise(KeyboardInterrupt()), {"error": KeyboardInterrupt}),  # never lost in the pool
        (_raise(ToolTimeout()), {"timed_out": True}),  # as the effect's outcome mapped it
    ],
    ids=["value", "raise", "base-exception", "tool-timeout"],
)
def test_a_sync_tool_reports_its_value_or_what_it_raised(
    body: Any, expected: dict[str, Any]
) -> None:
    io = IoSide(blocking_workers=1, name="tool-io")
    done: queue.Queue[ToolHandle] = queue.Queue()
    try:
        handle = _start(io, _Tool(body), done)
        assert done.get(timeout=WAIT) is handle
        assert handle.done and handle.run is not None
        run = handle.run
        assert run.output == expected.get("output")
        assert run.timed_out is expected.get("timed_out", False)
        if "error" in expected:
            assert isinstance(run.error, expected["error"])
        else:
            assert run.error is None
    finally:
        io.close()


def test_a_sync_tool_not_started_when_the_io_side_closes_never_runs() -> None:
    io = IoSide(blocking_workers=1, name="tool-io")
    done: queue.Queue[ToolHandle] = queue.Queue()
    entered, waiting, release = threading.Event(), threading.Event(), threading.Event()

    def busy(_prepared: Any) -> str:  # holds the only pool thread until close began
        entered.set()
        assert release.wait(WAIT)
        return "busy"

    async def release_when_cancelled() -> None:
        try:
            waiting.set()
            await asyncio.Event().wait()
        finally:
            release.set()  # only close cancels this: _closed is set by then

    first = _start(io, _Tool(busy), done)
    assert entered.wait(WAIT)
    queued_tool = _Tool(lambda _prepared: "ran")
    queued = _start(io, queued_tool, done)  # waits behind the busy body
    io.start(release_when_cancelled, on_done=lambda _outcome: None)
    assert waiting.wait(WAIT)
    io.close(timeout=WAIT)
    handles = {done.get(timeout=WAIT), done.get(timeout=WAIT)}
    assert handles == {first, queued}
    assert first.run is not None and first.run.output == "busy"  # it had started: it ends
    assert queued.run is not None and not queued_tool.ran.is_set()
    assert isinstance(queued.run.error, RuntimeError)
    assert "cancelled by shutdown" in str(queued.run.error)
