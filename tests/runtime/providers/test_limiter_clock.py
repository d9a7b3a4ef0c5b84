"""A model string spawned on ``Runtime.open(clock=ManualClock())``: its provider's
limiter waits out a 429's pause on that clock, not on real time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime import ManualClock, Retry, Runtime

from .test_failures import OPENAI
from .wire_server import JsonReply, Sse, WireServer

WAIT = 20.0


def test_a_429_pause_of_a_model_string_waits_on_the_runtimes_clock(
    tmp_path: Path, wire: WireServer, monkeypatch: Any
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    wire.script(JsonReply(429, {"error": {"message": "slow down"}}, {"retry-after": "30"}))
    wire.script(Sse(OPENAI.frames()))
    clock = ManualClock()
    with Runtime.open(tmp_path / "store", clock=clock, retry_policy=None) as rt:
        # Retry at once: the request then waits for the provider's 30 s pause.
        rt.on("agent/request-error", lambda event, next_: Retry(delay_s=0))
        agent = rt.spawn(model=f"openai:m@{wire.url}/v1")
        pending = agent.submit("hi")
        assert rt.scheduler.wait_pending(1, WAIT), "the pause armed no timer of the clock"
        assert len(wire.requests) == 1
        clock.advance(30.0)  # the pause is over; the request goes out within its jitter
        assert rt.scheduler.wait_pending(1, WAIT), "the pause's jitter armed no timer"
        assert len(wire.requests) == 1
        clock.advance(3.0)  # the jitter is at most 10% of the pause
        reply = pending.result(WAIT)
        assert reply.ok and reply.text == "Hello there"
        assert len(wire.requests) == 2
