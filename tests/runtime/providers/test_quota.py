"""A provider instance is one client of its quota: 36 agents share a key with a 30
requests-per-window quota (the 30 rpm scenario, its window shortened to 1 s); a 429's
retry-after pauses the whole provider, and its retries are spread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

from runtime import Runtime, as_completed
from runtime.providers import OpenAICompatModel, ProviderLimiter

from .support import KEY
from .wire_formats import openai_frames, openai_text_reply
from .wire_server import JsonReply, Recorded, Reply, Sse, WireServer

WINDOW_S = 1.0
QUOTA = 30
AGENTS = 36


class QuotaServer:
    """At most QUOTA requests per WINDOW_S window (a window opens at its first request);
    one over it gets a 429 with ``retry-after: 1``. Records every arrival's time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.window_start = -1e9
        self.in_window = 0
        self.arrivals: list[float] = []
        self.limited: list[float] = []

    def __call__(self, rec: Recorded) -> Reply:
        now = time.monotonic()
        with self.lock:
            self.arrivals.append(now)
            if now - self.window_start >= WINDOW_S:
                self.window_start, self.in_window = now, 0
            self.in_window += 1
            if self.in_window > QUOTA:
                self.limited.append(now)
                return JsonReply(
                    429,
                    {"error": {"message": "rate limit reached", "type": "requests"}},
                    {"retry-after": "1"},
                )
        return Sse(openai_frames(openai_text_reply("done")))


class RecordingLimiter(ProviderLimiter):
    """The provider's limiter, recording when each request went out and each pause."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[float] = []
        self.pauses: list[tuple[float, float]] = []

    def pause(self, seconds: float) -> None:
        super().pause(seconds)
        now = time.monotonic()
        self.pauses.append((now, now + seconds))

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        async with super().slot():
            self.sent.append(time.monotonic())
            yield


def test_36_agents_on_a_30_per_window_quota_all_complete_and_none_sends_while_paused(
    tmp_path: Path, wire: WireServer
) -> None:
    server = QuotaServer()
    wire.default = server
    limiter = RecordingLimiter()
    model = OpenAICompatModel("m", base_url=wire.url + "/v1", api_key=KEY, limiter=limiter)
    with Runtime.open(tmp_path / "store") as rt:
        agents = [rt.spawn(model=model) for _ in range(AGENTS)]
        # round 2 goes out as each round-1 answer comes in: some of it while paused
        round_1 = [a.submit("go") for a in agents]
        by_id = {a.id: a for a in agents}
        round_2 = []
        for reply in as_completed(round_1, timeout=60):
            assert reply.ok, reply
            round_2.append(by_id[reply.agent_id].submit("again"))
        replies = list(as_completed(round_2, timeout=60))
        assert len(replies) == AGENTS and all(r.ok for r in replies)
        retries = [r.retries for r in replies]
        delays = [
            e.data.delay_s for a in agents for e in a.session.events() if e.type == "llm/retry"
        ]
    assert server.limited, "the quota was never hit: the scenario did not run"
    assert limiter.pauses
    # No request went out while the provider was paused ...
    for start, end in limiter.pauses:
        assert not [t for t in limiter.sent if start < t < end], (start, end)
    # ... and every request that reached the server before a pause ended had been sent
    # before that pause began (none that the pause held arrived early).
    assert len(server.arrivals) == len(limiter.sent)
    for start, end in limiter.pauses:
        arrived = sum(1 for t in server.arrivals if t < end)
        sent_before = sum(1 for t in limiter.sent if t <= start)
        assert arrived <= sent_before, (start, end, arrived, sent_before)
    # the retries honour the 1 s retry-after and are spread, not at one instant
    assert delays and all(1.0 <= d <= 1.1 for d in delays)
    assert len(set(delays)) == len(delays)
    assert max(retries) <= 2, retries  # (6 attempts used to fail a turn)
    print(f"429s={len(server.limited)} pauses={len(limiter.pauses)} retries={sum(retries)}")
