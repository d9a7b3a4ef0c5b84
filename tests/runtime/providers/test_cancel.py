"""Cancelling the task that iterates a stream closes its HTTP connection promptly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from storage.events import StreamChunk

from .support import request, run
from .test_failures import VENDORS, Vendor
from .wire_server import Sse, WireServer


@pytest.mark.parametrize("vendor", VENDORS)
def test_cancelling_mid_stream_closes_the_connection_the_server_sees_it(
    wire: WireServer, vendor: Vendor
) -> None:
    wire.script(Sse(vendor.frames()[:4], then="stall"))

    async def body() -> dict[str, Any]:
        async with vendor.model(wire.url) as model:
            received: list[StreamChunk] = []
            first = asyncio.Event()

            async def consume() -> None:
                async for chunk in model.stream(request()):
                    received.append(chunk)
                    first.set()

            task = asyncio.create_task(consume())
            await asyncio.wait_for(first.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            seen = await asyncio.to_thread(wire.requests[0].disconnected.wait, 10)
            return {"seen": seen, "received": received, "stats": model.statistics()}

    outcome = run(body)
    assert outcome["seen"], "the server did not see the connection close"
    assert outcome["received"], "no chunk arrived before the cancel"
    assert outcome["stats"].in_flight == 0


@pytest.mark.parametrize("vendor", VENDORS)
def test_cancelling_before_the_response_starts_closes_the_connection(
    wire: WireServer, vendor: Vendor
) -> None:
    wire.script(Sse(vendor.frames(), gate="never"))

    async def body() -> bool:
        async with vendor.model(wire.url) as model:
            task = asyncio.create_task(anext(aiter(model.stream(request()))))
            await asyncio.to_thread(wire.wait_for_requests, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        wire.open_gate("never")  # the server writes into the closed connection
        return await asyncio.to_thread(wire.requests[0].disconnected.wait, 10)

    assert run(body)
