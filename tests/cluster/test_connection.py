"""The direct verb connection over real loopback TCP, with no Ray: requests pipelined and
answered by id, applied in the order written; when the shard's listener goes away with
requests in flight, the driver reconnects to the new address and writes again those
safe to repeat (a send with ``retry=True``), while an inbox edit fails with
``VerbInterruptedError``. (The address comes from a stand-in for the Ray actor handle;
tests/cluster/test_faults.py runs the same path with a real SIGKILL on a Ray cluster.)"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from runtime.cluster import VerbInterruptedError
from runtime.cluster.connection import ShardConnection
from runtime.cluster.listener import VerbListener
from runtime.cluster.wire import Remove, Send, SendMany, Status, Verb


class Addresses:
    """What the connection asks of its ``ShardLink``: the shard's current address."""

    def __init__(self) -> None:
        self.index = 0
        self.verb_timeout = 10.0
        self.restarts_seen = 0
        self.local_host = "127.0.0.1"
        self.address = ""

    def call(self, method: str) -> str:
        assert method == "address"
        return self.address


def _send(n: int) -> SendMany:
    return SendMany([Send(agent="a", message=f"m{n}", id=f"id-{n}", lane="next-turn", wake=True)])


def test_pipelined_requests_are_applied_in_order_and_answered_by_id() -> None:
    applied: list[str] = []

    def apply(verb: Verb) -> object:
        if isinstance(verb, SendMany):
            applied.extend(s.id for s in verb.sends)
            return [None]
        if isinstance(verb, Status):
            raise KeyError(verb.agent)  # an error comes back as itself
        return None

    listener = VerbListener("127.0.0.1", apply, "test")
    link = Addresses()
    link.address = listener.address
    connection = ShardConnection(link)  # type: ignore[arg-type]
    try:
        pendings = [connection.submit(_send(n)) for n in range(500)]  # none waited yet
        assert all(p.result(10) == [None] for p in pendings)
        assert applied == [f"id-{n}" for n in range(500)]
        with pytest.raises(KeyError, match="ghost"):
            connection.submit(Status("ghost")).result(10)
    finally:
        connection.close()
        listener.close()


def test_a_broken_connection_resends_sends_with_retry_and_fails_an_edit_in_flight() -> None:
    release = threading.Event()
    first_seen: list[Verb] = []
    again: list[Any] = []

    def stuck(verb: Verb) -> object:  # the old process: takes requests, never answers
        first_seen.append(verb)
        release.wait(10)
        return None

    def fresh(verb: Verb) -> object:  # the restarted one
        again.append(verb)
        return [None] if isinstance(verb, SendMany) else "idle"

    old = VerbListener("127.0.0.1", stuck, "old")
    link = Addresses()
    link.address = old.address
    connection = ShardConnection(link)  # type: ignore[arg-type]
    new = VerbListener("127.0.0.1", fresh, "new")
    try:
        send = connection.submit(_send(1))
        edit = connection.submit(Remove("a", "id-0", 10.0))
        status = connection.submit(Status("a"))
        assert send.done() is False
        link.address = new.address  # where Ray says the restarted shard is
        old.close()  # the process dies: its connections close
        assert send.result(10) == [None]
        assert status.result(10) == "idle"
        with pytest.raises(VerbInterruptedError, match="may or may not have been applied"):
            edit.result(10)
        assert sorted(type(v).__name__ for v in again) == ["SendMany", "Status"]  # no Remove
        resent = next(v for v in again if isinstance(v, SendMany))
        assert resent.retry is True  # the shard skips a send its log has
        assert connection.reconnects == 1
        assert connection.submit(_send(2)).result(10) == [None]  # and it goes on
    finally:
        release.set()
        connection.close()
        new.close()
