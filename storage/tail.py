"""A session's durable tail: what a store-backed :class:`~storage.session.Session` keeps
in memory of the events not yet known durable, how a flush acknowledges and drops them,
and how :meth:`DurableTail.events` reads the dropped ones back through the store.

A successful flush through the session acknowledges everything appended before it;
acknowledged events are dropped from memory and read back from the store. A session
that is never flushed (durability ``none``) asks its sink for a flush itself when its
tail reaches ``tail_bound`` events, and again each time it grew by as many. Without a
reader a session keeps every event in memory.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from operator import attrgetter
from typing import TYPE_CHECKING, Final, cast

from storage.aio import wait_durable
from storage.codec import Codec
from storage.events import Event
from storage.records import DurableReader, FlushCallback, LogSink
from storage.timeouts import check_timeout

__all__ = ["DurableTail"]

_SEQ: Final = attrgetter("seq")


class DurableTail:
    """The durability and read-back half of :class:`~storage.session.Session` (its
    base class; the fields are the session's, set in its ``__init__``)."""

    if TYPE_CHECKING:
        _codec: Codec
        _sink: LogSink
        _reader: DurableReader | None
        _lock: threading.RLock
        # See Session.__init__ for the invariants of these.
        _tail: list[Event | bytes]
        _records: bool
        _dropped: int
        _durable: int
        _probing: bool
        _bound: int
        _room_at: int
        _last_seq: int

        @property
        def id(self) -> str: ...

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything appended before the call is durable."""
        timeout = check_timeout(timeout)
        mark = self._last_seq
        self._sink.flush(timeout)
        self.acknowledge(mark)

    def flush_async(self, callback: FlushCallback) -> None:
        """Call ``callback(None)`` (from any thread) once everything appended before the
        call is durable, or ``callback(error)`` if it cannot be."""
        if self._reader is None:
            self._sink.flush_async(callback)
            return
        mark = self._last_seq
        acknowledge = self.acknowledge

        def done(error: BaseException | None) -> None:
            if error is None:
                acknowledge(mark)
            callback(error)

        self._sink.flush_async(done)

    async def aflush(self) -> None:
        """:meth:`flush` for asyncio code: ``await session.aflush()`` returns once
        everything appended before the call is durable, without blocking the event
        loop; it raises what :meth:`flush` would. The loop is woken once per commit,
        however many of its tasks wait (see :mod:`storage.aio`)."""
        await wait_durable(self.flush_async)

    def acknowledge(self, mark: int) -> None:
        """Everything through seq ``mark`` is durable (a flush of this session's sink,
        asked for once the event of seq ``mark`` was appended, succeeded): drop it from
        memory if the lock is free; else a later acknowledgement or :meth:`_make_room`
        does it. Callable from any thread; it never waits for the lock (it runs on the
        writer thread, and an observer holding the lock may be waiting for that thread).

        Raises ``ValueError`` for a mark past the last event appended (no flush covers
        an event not yet appended)."""
        if mark > self._last_seq:
            raise ValueError(
                f"cannot acknowledge seq {mark} of session {self.id!r}: its last event is "
                f"seq {self._last_seq}"
            )
        if self._reader is None:
            return
        if mark > self._durable:  # noqa: PLR1730 -- a plain store: see _durable
            self._durable = mark
        lock = self._lock
        if lock.acquire(False):  # not blocking=False: a keyword costs more (once per flush)
            try:
                self._trim()
            finally:
                lock.release()

    def _trim(self) -> None:
        """Drop the events known durable from the tail (the lock is held)."""
        durable = self._durable
        dropped = self._dropped
        if durable > dropped:
            tail = self._tail
            # Invariant: the tail's seqs are dropped + 1, dropped + 2, ... (appends never
            # skip one, and a session with a reader keeps no loaded event).
            del tail[: durable - dropped]
            self._dropped = durable
            self._room_at = len(tail) + self._bound

    def _make_room(self) -> None:
        """The tail grew by ``tail_bound`` events (the lock is held): drop what is known
        durable; if the tail is still full, ask the sink (once at a time) what is
        durable now. A session that is never flushed (durability ``none``) learns here."""
        self._trim()
        if len(self._tail) >= self._bound and not self._probing:
            self._probing = True
            mark = self._last_seq

            def done(error: BaseException | None) -> None:
                self._probing = False
                if error is None:
                    self.acknowledge(mark)

            self._sink.flush_async(done)
        self._room_at = len(self._tail) + self._bound

    # ------------------------------------------------------------------ reading

    def events(self, lower: int = 0, upper: int | None = None) -> list[Event]:
        """Committed events with ``lower <= seq <= upper`` (``upper`` inclusive, like the
        store's ``read`` and fork boundaries); ``None`` means through the last.

        Events already dropped from memory are read back through the reader (so this
        raises what the store raises, e.g. :class:`StoreClosedError` once it is closed)."""
        with self._lock:
            tail = self._tail
            dropped = self._dropped
            if self._records:  # seqs dropped + 1, dropped + 2, ...
                start = max(lower - dropped - 1, 0)
                stop = len(tail) if upper is None else max(upper - dropped, 0)
            else:
                start = bisect_left(tail, lower, key=_SEQ)
                stop = len(tail) if upper is None else bisect_right(tail, upper, key=_SEQ)
            kept = tail[start:stop]
        if self._records:  # records never change: decoded without the lock
            first = dropped + 1 + start
            held = self._codec.decode_run(
                cast(list[bytes], kept), first_seq=first, session_id=self.id
            )
        else:
            held = cast(list[Event], kept)
        if lower > dropped or (upper is not None and upper < lower):
            return held
        assert self._reader is not None  # Invariant: nothing is dropped without a reader
        # Dropped events are durable and never change: no need to hold the lock.
        durable = self._reader(lower=lower, upper=dropped if upper is None else min(upper, dropped))
        return durable + held
