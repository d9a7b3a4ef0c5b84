"""Test models with gates the test thread controls (no sleeps to synchronise)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence

from actors.errors import ModelError
from actors.model import ModelRequest
from storage.events import FinishChunk, LlmFailure, StreamChunk, TextDelta, Usage, UsageChunk

WAIT = 10.0


class GateModel:
    """Streams ``before`` chunks, then waits at a gate until released, then ``after``.

    ``reached`` is set when a request is parked at the gate; ``closed`` when its stream
    was closed (cancelled or finished); ``requests`` records every request.
    """

    provider = "test"
    name = "gate"

    def __init__(
        self,
        before: Sequence[StreamChunk] = (TextDelta(text="partial "),),
        after: Sequence[StreamChunk] = (TextDelta(text="rest"), FinishChunk(reason="stop")),
        *,
        fail_after_gate: LlmFailure | None = None,
    ) -> None:
        self.before = list(before)
        self.after = list(after)
        self.fail_after_gate = fail_after_gate
        self.reached = threading.Event()
        self.closed = threading.Event()
        self.cancelled = threading.Event()
        self.requests: list[ModelRequest] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gates: list[asyncio.Event] = []
        self._arrivals = threading.Condition()

    def wait_reached(self, count: int, timeout: float = WAIT) -> bool:
        """Wait until ``count`` requests (in all) have reached the gate."""
        with self._arrivals:
            return self._arrivals.wait_for(lambda: len(self._gates) >= count, timeout)

    def release(self, index: int = -1) -> None:
        """Open the gate of request ``index`` (the latest by default)."""
        with self._arrivals:
            gate = self._gates[index]
        assert self._loop is not None
        self._loop.call_soon_threadsafe(gate.set)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        self._loop = asyncio.get_running_loop()
        gate = asyncio.Event()
        try:
            for chunk in self.before:
                yield chunk
            with self._arrivals:
                self._gates.append(gate)
                self._arrivals.notify_all()
            self.reached.set()
            await gate.wait()
            if self.fail_after_gate is not None:
                raise ModelError(self.fail_after_gate)
            for chunk in self.after:
                yield chunk
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        finally:
            self.closed.set()


class FailingThenOk:
    """Fails the first ``failures`` requests with ``failure``, then answers ``text``."""

    provider = "test"
    name = "flaky"

    def __init__(self, failures: Sequence[LlmFailure], text: str = "ok") -> None:
        self.failures = list(failures)
        self.text = text
        self.requests = 0
        self._lock = threading.Lock()

    def answer_now(self, request: ModelRequest) -> Sequence[StreamChunk] | None:
        with self._lock:
            self.requests += 1
            failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            raise ModelError(failure)
        return [TextDelta(text=self.text), UsageChunk(usage=Usage()), FinishChunk(reason="stop")]

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        answer = self.answer_now(request)
        assert answer is not None
        for chunk in answer:
            yield chunk
