"""The bus (CONTRACT section 8): emit, listener registration and scopes."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any

import pytest

from actors import Bus

from .bus_support import WAIT

# -- emit ------------------------------------------------------------------------------


def test_emit_calls_every_listener_in_registration_order(bus: Bus) -> None:
    calls: list[tuple[str, Any]] = []
    bus.on("agent/status", lambda e: calls.append(("first", e)))
    bus.on("agent/status", lambda e: calls.append(("second", e)))
    bus.on("agent/other", lambda e: calls.append(("other", e)))
    bus.emit("agent/status", "running")
    assert calls == [("first", "running"), ("second", "running")]


def test_a_failing_listener_is_logged_and_cannot_stop_the_others(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def broken(_event: object) -> None:
        raise RuntimeError("listener bug")

    bus.on("e", broken)
    bus.on("e", lambda _e: calls.append("after"))
    with caplog.at_level(logging.ERROR, logger="corral.bus"):
        bus.emit("e", 1)
    assert calls == ["after"]
    assert any(r.name == "corral.bus" and "broken" in r.getMessage() for r in caplog.records)


def test_scoped_listeners_see_only_their_agent_and_global_ones_see_all(bus: Bus) -> None:
    calls: list[str] = []
    bus.on("e", lambda e: calls.append(f"global:{e}"))
    bus.on("e", lambda e: calls.append(f"a:{e}"), scope="a")
    bus.on("e", lambda e: calls.append(f"b:{e}"), scope="b")
    bus.on("e", lambda e: calls.append(f"global2:{e}"))
    bus.emit("e", 1, scope="a")
    bus.emit("e", 2, scope="b")
    bus.emit("e", 3)
    bus.emit("e", 4, scope="nobody")
    assert calls == [
        "global:1", "a:1", "global2:1",
        "global:2", "b:2", "global2:2",
        "global:3", "global2:3",
        "global:4", "global2:4",
    ]  # fmt: skip


def test_a_disposer_unregisters_once_and_is_idempotent(bus: Bus) -> None:
    calls: list[str] = []
    dispose = bus.on("e", lambda _e: calls.append("x"), scope="a")
    keep = bus.on("e", lambda _e: calls.append("y"))
    dispose()
    dispose()
    bus.emit("e", None, scope="a")
    keep()
    keep()
    bus.emit("e", None, scope="a")
    assert calls == ["y"]
    assert not bus.has_listeners("e")
    assert bus.listener_count("e", scope="a") == 0


def test_an_async_listener_runs_on_the_loop_and_its_failure_is_logged(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    seen: queue.Queue[str] = queue.Queue()
    failed = threading.Event()

    async def on_loop(event: str) -> None:
        await asyncio.sleep(0)
        seen.put(f"{event} on {threading.current_thread().name}")

    async def broken(_event: str) -> None:
        failed.set()
        raise RuntimeError("async listener bug")

    bus.on("e", on_loop)
    bus.on("e", broken)
    with caplog.at_level(logging.ERROR, logger="corral.bus"):
        bus.emit("e", "hello")
        assert seen.get(timeout=WAIT) == "hello on bus-io-loop"
        assert failed.wait(WAIT)
        bus._io.close()  # drain: the failure has been reported once close returns
    assert any("async listener" in r.getMessage() for r in caplog.records)
