"""The types a session and its sink share: the session header, the encoded record on
its way to disk, the sink and outbox protocols, and the flush callback.

They live apart from :mod:`storage.session` and the LMDB modules so that both sides
import them from here and neither imports the other (a session knows its sink only by
:class:`LogSink`; the log writer knows a session only by its header and records).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import msgspec

if TYPE_CHECKING:
    from storage.events import Event

__all__ = [
    "DurableReader",
    "FlushCallback",
    "LogSink",
    "Outbox",
    "PendingRecord",
    "Record",
    "SessionHeader",
]

FlushCallback = Callable[[BaseException | None], None]
"""What a flush calls (from any thread) once the records before it are durable:
with ``None``, or with the error that prevents it."""


class SessionHeader(msgspec.Struct, frozen=True, rename="camel"):
    """What a store keeps about a session besides its events.

    ``key`` is the store's compact session key (events are keyed by key + seq);
    ``created`` is epoch ms. A fork child names its ``parent`` and ``fork_seq`` (the
    inclusive boundary). Events with ``seq < seed_length`` are the seeded prefix (fork
    or import) and are not replayed into the pending inbox.
    """

    id: str
    key: int
    created: int
    parent: str | None = None
    fork_seq: int | None = None
    seed_length: int = 0


Record = tuple[int, int, bytes]
"""What :meth:`LogSink.submit` takes: ``(session_key, seq, payload)``. A session hands
over a plain tuple (building a :class:`PendingRecord` costs a tenth of an append)."""


class PendingRecord(NamedTuple):
    """One encoded record on its way to durable storage (a named :data:`Record`)."""

    session_key: int
    seq: int
    payload: bytes


class Outbox(Protocol):
    """One session's records on their way to a sink that takes them itself (the log
    writer's ``outbox(session_key)``, see :class:`LogSink`): the session appends its
    encoded records to ``records`` (under its own lock, in seq order, without gaps) and
    the sink takes them from the front when it writes. Cheaper than a call per record:
    an append costs a list append, and the sink hears of the session once per batch of
    records.

    Protocol: after appending, a session calls :meth:`announce` if ``records`` holds only
    what it just appended (the sink may have emptied it: it does not know the session
    has records) or if ``stopped`` is set (the sink refuses records: closed, failed, or
    a newer session object of the same id took over). :meth:`announce` either accepts
    the records or takes them back out of ``records`` and raises; then nothing was
    appended.
    """

    records: list[bytes]
    stopped: bool

    def announce(self, last: bytes, count: int) -> None:
        """The session just appended ``count`` records, ``last`` the last of them; raises
        (having removed them) if the sink refuses them."""
        ...


class LogSink(Protocol):
    """Where a session hands its encoded records for durable writing.

    A sink may also have an ``outbox(session_key)`` method returning an :class:`Outbox`
    (or ``None``): a session then hands its records over through that instead of
    :meth:`submit` and :meth:`submit_many`."""

    def submit(self, record: Record) -> None:
        """Hand over a record for durable write; never blocks long. May refuse (raise).

        A session passes a plain ``(session_key, seq, payload)`` tuple: unpack it, do not
        read its fields by name."""
        ...

    def submit_many(self, session_key: int, first_seq: int, payloads: Sequence[bytes]) -> None:
        """Hand over the records of seqs ``first_seq``, ``first_seq + 1``, ... of one
        session at once: all are accepted or none (raise). The sink may keep
        ``payloads`` (the caller gives it away)."""
        ...

    def flush_async(self, callback: FlushCallback) -> None:
        """Call ``callback`` (from any thread) once everything submitted before is
        durable, or with the error that prevents it."""
        ...

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything submitted before the call is durable."""
        ...


class DurableReader(Protocol):
    """Reads a session's durable events back (the store's ``read`` bound to a session)."""

    def __call__(self, *, lower: int, upper: int) -> list[Event]:
        """The durable events with ``lower <= seq <= upper`` (inclusive), in seq order."""
        ...
