"""Fixtures of the actors tests: a dispatcher, an I/O side and a bus over it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pykka import ActorRegistry

from actors import Bus, Dispatcher, IoSide

WAIT = 5.0


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    d = Dispatcher(2, throughput=4, name="test-dispatcher")
    yield d
    ActorRegistry.stop_all(timeout=WAIT)
    d.shutdown(timeout=WAIT)


@pytest.fixture
def io() -> Iterator[IoSide]:
    side = IoSide(blocking_workers=4, name="bus-io")
    yield side
    side.close()


@pytest.fixture
def bus(io: IoSide) -> Bus:
    return Bus(io)
