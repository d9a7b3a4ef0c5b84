"""Fixtures for the provider tests: the loopback wire server and a clean environment.

The suite-wide ``loopback_only`` guard (``tests/conftest.py``) refuses any non-loopback
address; here, vendor variables from the developer's environment are removed too, so a
test never picks up a real key or endpoint.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .wire_server import WireServer

_VENDOR_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "OPENAI_ADMIN_KEY",
    "OPENAI_CUSTOM_HEADERS",
    "DEEPSEEK_API_KEY",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_PROFILE",
    "ANTHROPIC_CUSTOM_HEADERS",
)


@pytest.fixture(autouse=True)
def no_vendor_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VENDOR_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def wire() -> Iterator[WireServer]:
    server = WireServer().start()
    try:
        yield server
    finally:
        server.close()
