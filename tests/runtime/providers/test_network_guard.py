"""The suite contacts loopback only: the guard (tests/network_guard.py) refuses the rest."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from runtime.providers import OpenAICompatModel
from tests.network_guard import NetworkGuardError, Passthrough

from .support import KEY, failure_of, request, run


@pytest.fixture
def nothing_passes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Even if the guard let a call through, it would be recorded here, never sent."""
    leaked: list[Any] = []

    def record(*args: Any, **kwargs: Any) -> Any:
        leaked.append(args)
        raise AssertionError(f"the guard let a network call through: {args!r}")

    monkeypatch.setattr(Passthrough, "connect", staticmethod(record))
    monkeypatch.setattr(Passthrough, "connect_ex", staticmethod(record))
    monkeypatch.setattr(Passthrough, "getaddrinfo", staticmethod(record))
    return leaked


def test_the_guard_refuses_a_non_loopback_connect(nothing_passes: list[Any]) -> None:
    with (
        socket.socket() as sock,
        pytest.raises(NetworkGuardError, match="tests may only contact loopback addresses"),
    ):
        sock.connect(("203.0.113.7", 443))
    assert nothing_passes == []


def test_the_guard_refuses_resolving_a_public_name(nothing_passes: list[Any]) -> None:
    with pytest.raises(NetworkGuardError):
        socket.getaddrinfo("api.openai.com", 443)
    assert nothing_passes == []


def test_a_provider_aimed_at_a_real_host_fails_as_transport_without_traffic(
    nothing_passes: list[Any],
) -> None:
    async def body() -> Any:
        async with OpenAICompatModel("m", base_url="https://api.openai.com/v1", api_key=KEY) as m:
            return await failure_of(m, request())

    failure = run(body)
    assert failure.code == "TRANSPORT"
    assert "loopback" in failure.message
    assert nothing_passes == []


def test_loopback_stays_allowed() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.socket() as client:
            client.connect(server.getsockname())
