"""Concurrency and rate limits: requests wait in FIFO order, never fail, survive cancels."""

from __future__ import annotations

import asyncio
import random

import pytest

from runtime.providers import FairSemaphore, OpenAICompatModel, ProviderLimiter, RateBucket

from .support import KEY, FakeClock, collect, request, run, settle, user
from .wire_formats import openai_frames, openai_text_reply
from .wire_server import Sse, WireServer


async def holder(sem: FairSemaphore, name: str, order: list[str], release: asyncio.Event) -> None:
    await sem.acquire()
    order.append(name)
    try:
        await release.wait()
    finally:
        sem.release()


def test_a_fair_semaphore_grants_in_arrival_order() -> None:
    async def body() -> list[str]:
        sem = FairSemaphore(1)
        order: list[str] = []
        gates = {name: asyncio.Event() for name in "abcde"}
        tasks = []
        for name in "abcde":
            tasks.append(asyncio.create_task(holder(sem, name, order, gates[name])))
            await settle(2)
        assert (sem.in_use, sem.waiting) == (1, 4)
        for name in "abcde":
            gates[name].set()
            await settle()
        await asyncio.gather(*tasks)
        assert (sem.in_use, sem.waiting) == (0, 0)
        return order

    assert run(body) == list("abcde")


def test_a_waiter_cancelled_in_the_queue_is_skipped() -> None:
    async def body() -> list[str]:
        sem = FairSemaphore(1)
        order: list[str] = []
        gate = asyncio.Event()
        gate.set()
        first_gate = asyncio.Event()
        a = asyncio.create_task(holder(sem, "a", order, first_gate))
        await settle(2)
        b = asyncio.create_task(holder(sem, "b", order, gate))
        c = asyncio.create_task(holder(sem, "c", order, gate))
        await settle(2)
        b.cancel()
        await settle()
        assert sem.waiting == 1
        first_gate.set()
        await asyncio.gather(a, c)
        assert b.cancelled()
        assert (sem.in_use, sem.waiting) == (0, 0)
        return order

    assert run(body) == ["a", "c"]


def test_a_waiter_cancelled_after_its_grant_passes_the_slot_on() -> None:
    async def body() -> list[str]:
        sem = FairSemaphore(1)
        order: list[str] = []
        gate = asyncio.Event()
        gate.set()
        await sem.acquire()  # held by the test
        b = asyncio.create_task(holder(sem, "b", order, gate))
        c = asyncio.create_task(holder(sem, "c", order, gate))
        await settle(2)
        sem.release()  # grants b ...
        b.cancel()  # ... which is cancelled before it could run
        await asyncio.gather(c)
        assert b.cancelled()
        assert (sem.in_use, sem.waiting) == (0, 0)
        return order

    assert run(body) == ["c"]


def test_requests_beyond_the_concurrency_limit_wait_and_all_complete() -> None:
    async def body() -> int:
        limiter = ProviderLimiter(max_concurrency=3)
        peak = 0

        async def one() -> None:
            nonlocal peak
            async with limiter.slot():
                peak = max(peak, limiter.statistics().in_flight)
                await asyncio.sleep(0)

        await asyncio.gather(*(one() for _ in range(50)))
        assert limiter.statistics().in_flight == 0
        return peak

    assert run(body) == 3


def test_the_rate_bucket_paces_requests_fifo_on_an_injected_clock() -> None:
    async def body() -> None:
        clock = FakeClock()
        bucket = RateBucket(60, burst=1, clock=clock, sleep=clock.sleep)
        granted: list[int] = []

        async def one(n: int) -> None:
            await bucket.acquire()
            granted.append(n)

        tasks = [asyncio.create_task(one(n)) for n in range(4)]
        await settle()
        assert granted == [0]
        await clock.advance(0.5)
        assert granted == [0]
        await clock.advance(0.5)
        assert granted == [0, 1]
        await clock.advance(2.0)
        assert granted == [0, 1, 2]  # one token a second; no burst beyond the bucket
        await clock.advance(1.0)
        assert granted == [0, 1, 2, 3]
        await asyncio.gather(*tasks)
        assert bucket.waiting == 0

    run(body)


def test_a_rate_waiter_cancelled_in_the_queue_keeps_the_others_in_order() -> None:
    async def body() -> None:
        clock = FakeClock()
        bucket = RateBucket(60, burst=1, clock=clock, sleep=clock.sleep)
        granted: list[int] = []

        async def one(n: int) -> None:
            await bucket.acquire()
            granted.append(n)

        tasks = [asyncio.create_task(one(n)) for n in range(4)]
        await settle()
        tasks[1].cancel()
        await settle()
        assert bucket.waiting == 2
        await clock.advance(1.0)
        await clock.advance(1.0)
        assert granted == [0, 2, 3]
        assert tasks[1].cancelled()

    run(body)


def test_a_rate_token_granted_to_a_cancelled_waiter_is_given_back() -> None:
    async def body() -> None:
        clock = FakeClock()
        bucket = RateBucket(60, burst=1, clock=clock, sleep=clock.sleep)
        await bucket.acquire()  # takes the only token
        waiter = asyncio.create_task(bucket.acquire())
        await settle()
        clock.wake(1.0)  # a token is due: the pump's sleep ends
        await asyncio.sleep(0)  # one loop turn: the pump grants the waiter ...
        assert bucket.waiting == 0
        assert not waiter.done()
        waiter.cancel()  # ... which is cancelled before it resumes
        await settle()
        await asyncio.wait_for(bucket.acquire(), 1)  # the returned token, no time passing

    run(body)


def test_invalid_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FairSemaphore(0)
    with pytest.raises(ValueError, match="positive"):
        RateBucket(0)


def test_a_provider_sends_at_most_max_concurrency_requests_and_queues_the_rest(
    wire: WireServer,
) -> None:
    wire.default = Sse(openai_frames(openai_text_reply("ok")), gate="go")

    async def body() -> None:
        model = OpenAICompatModel("m", base_url=wire.url + "/v1", api_key=KEY, max_concurrency=2)
        async with model:
            tasks = [asyncio.create_task(collect(model, request())) for _ in range(5)]
            await asyncio.to_thread(wire.wait_for_requests, 2)
            stats = model.statistics()
            assert (stats.in_flight, stats.waiting_for_slot) == (2, 3)
            assert len(wire.requests) == 2
            wire.open_gate("go")
            await asyncio.gather(*tasks)
            assert model.statistics().in_flight == 0

    run(body)
    assert len(wire.requests) == 5


def test_queued_requests_go_out_in_the_order_they_were_made(wire: WireServer) -> None:
    wire.default = Sse(openai_frames(openai_text_reply("ok")))

    async def body() -> None:
        model = OpenAICompatModel("m", base_url=wire.url + "/v1", api_key=KEY, max_concurrency=1)
        async with model:
            tasks = []
            for n in range(5):
                tasks.append(asyncio.create_task(collect(model, request(user(f"r{n}")))))
                await settle(2)
            await asyncio.gather(*tasks)

    run(body)
    assert [r.body["messages"][0]["content"] for r in wire.requests] == [f"r{n}" for n in range(5)]


def test_a_pause_holds_every_new_request_until_it_ends_then_spreads_them() -> None:
    async def body() -> None:
        clock = FakeClock()
        rng = random.Random(4)
        limiter = ProviderLimiter(clock=clock, sleep=clock.sleep, pause_jitter=0.5, rng=rng)
        limiter.pause(10.0)
        assert limiter.statistics().paused_for_s == 10.0
        went: list[tuple[int, float]] = []

        async def one(n: int) -> None:
            async with limiter.slot():
                went.append((n, clock.now))

        tasks = [asyncio.create_task(one(n)) for n in range(5)]
        await settle()
        await clock.advance(9.99)
        assert went == []  # nothing goes out while paused
        limiter.pause(0.005)  # one ending sooner never shortens the pause under way
        for _ in range(60):
            await clock.advance(0.1)
        await asyncio.gather(*tasks)
        times = [t for _, t in went]
        assert len(times) == 5 and all(10.0 <= t <= 15.0 + 0.1 for t in times)
        assert len(set(times)) > 1  # spread over the pause's jitter, not one instant
        assert limiter.statistics().pauses == 1

    run(body)


def test_a_token_budget_holds_requests_while_the_replies_used_more_than_it() -> None:
    async def body() -> None:
        clock = FakeClock()
        limiter = ProviderLimiter(tokens_per_minute=600, clock=clock, sleep=clock.sleep)
        async with limiter.slot():
            limiter.spend(900)  # 300 over the minute's budget: 30 s of refill
        went = asyncio.Event()

        async def one() -> None:
            async with limiter.slot():
                went.set()

        task = asyncio.create_task(one())
        await settle()
        await clock.advance(29.0)
        assert not went.is_set()
        await clock.advance(1.5)
        await task
        assert went.is_set()
        assert limiter.statistics().tokens_per_minute == 600

    run(body)
