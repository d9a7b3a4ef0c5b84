"""The suite-wide guard: tests may contact loopback addresses only.

:func:`install` patches ``socket.socket.connect``/``connect_ex`` and
``socket.getaddrinfo`` so that any non-loopback address raises
:class:`NetworkGuardError` before a packet leaves (``tests/conftest.py`` installs it for
every test). A real vendor can never be reached by accident, whatever a test configures.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

__all__ = ["NetworkGuardError", "Passthrough", "install", "is_loopback"]


class NetworkGuardError(ConnectionRefusedError):
    """A test tried to reach an address outside the loopback range."""


class Passthrough:
    """What the guard calls for an allowed address; a test may swap these out."""

    connect = staticmethod(socket.socket.connect)
    connect_ex = staticmethod(socket.socket.connect_ex)
    getaddrinfo = staticmethod(socket.getaddrinfo)


def is_loopback(host: object) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode()
    if not isinstance(host, str):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _check(host: object) -> None:
    if not is_loopback(host):
        raise NetworkGuardError(f"tests may only contact loopback addresses, not {host!r}")


def _connect(self: socket.socket, address: Any) -> None:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _check(address[0])
    Passthrough.connect(self, address)


def _connect_ex(self: socket.socket, address: Any) -> int:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _check(address[0])
    return Passthrough.connect_ex(self, address)


def _getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    _check(host)
    return Passthrough.getaddrinfo(host, *args, **kwargs)


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard the sockets for as long as ``monkeypatch`` lives (one test)."""
    monkeypatch.setattr(socket.socket, "connect", _connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", _getaddrinfo)
