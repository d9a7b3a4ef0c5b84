"""A session: one agent's append-only fact log, its projections and its observers.

:meth:`Session.append` is the only way a fact enters a session. It validates the data
(:meth:`Codec.prepare`: lossless JSON, known type, surface rules), assigns the next
``seq`` and ``time``, encodes the record (size check), hands it to the
:class:`LogSink` (the log writer), commits it to the in-memory log and projections,
and finally calls the ``session/event`` observers. Any failure before the hand-over
leaves everything as it was; a failing observer is logged and contained.

The record is handed to the sink *before* the in-memory commit (the order of CONTRACT
7 lists the commit first): a sink that refuses a record (closed store, failed writer)
then leaves nothing behind, and an observer that calls :meth:`Session.flush` waits for
the event it is observing.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Final, NamedTuple, Protocol

import msgspec

from storage.codec import Codec
from storage.errors import InvalidEventError, LogCorruptError, ReentrantAppendError
from storage.events import SURFACE_TYPES, Event, Message, UserMessage
from storage.projections import (
    InboxProjection,
    SurfaceProjection,
    TurnState,
    TurnTracker,
    repair_plan,
)

__all__ = ["LogSink", "Observer", "PendingRecord", "Session", "SessionHeader", "epoch_ms"]

_log = logging.getLogger("corral.session")
_SEQ: Final = attrgetter("seq")


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


class PendingRecord(NamedTuple):
    """One encoded record on its way to durable storage."""

    session_key: int
    seq: int
    payload: bytes


class LogSink(Protocol):
    """Where a session hands its encoded records for durable writing."""

    def submit(self, record: PendingRecord) -> None:
        """Hand over a record for durable write; never blocks long. May refuse (raise)."""
        ...

    def flush_async(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback`` (from any thread) once everything submitted before is
        durable, or with the error that prevents it."""
        ...

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything submitted before the call is durable."""
        ...


Observer = Callable[[Event], None]


def epoch_ms() -> int:
    """Wall-clock time in epoch milliseconds (the default session clock)."""
    return time.time_ns() // 1_000_000


class Session:
    """One session's log. Thread-safe: appends are serialized by a lock.

    ``events`` is already-durable history (loaded from a store): it rebuilds the
    projections and is *not* resubmitted. It must have strictly increasing seqs; gaps
    are allowed only where a store skipped unknown ignorable records, in which case
    ``last_seq`` must give the durable last seq so the next append continues after it.
    """

    def __init__(
        self,
        header: SessionHeader,
        *,
        sink: LogSink,
        codec: Codec,
        clock: Callable[[], int] = epoch_ms,
        events: Iterable[Event] = (),
        last_seq: int | None = None,
    ) -> None:
        self._header = header
        self._sink = sink
        self._codec = codec
        self._clock = clock
        # Invariant: reentrant so that observers may read (state, events, messages);
        # an observer's append is refused before the lock is taken.
        self._lock = threading.RLock()
        self._log: list[Event] = []
        self._last_seq = -1
        self._last_time = 0
        self._turns = TurnTracker()
        self._surface = SurfaceProjection()
        self._inbox = InboxProjection(seed_length=header.seed_length)
        self._observers: tuple[Observer, ...] = ()
        self._notifying: int | None = None  # ident of the thread running observers
        for event in events:
            self._load(event)
        if last_seq is not None:
            if last_seq < self._last_seq:
                raise LogCorruptError(
                    f"session {header.id!r}: last_seq {last_seq} is below the loaded seq "
                    f"{self._last_seq}; the store's session row disagrees with its events"
                )
            self._last_seq = last_seq

    # ------------------------------------------------------------------ identity

    @property
    def id(self) -> str:
        return self._header.id

    @property
    def header(self) -> SessionHeader:
        return self._header

    @property
    def codec(self) -> Codec:
        return self._codec

    @property
    def last_seq(self) -> int:
        """The seq of the last committed event, ``-1`` when the log is empty."""
        return self._last_seq

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, last_seq={self._last_seq})"

    # ------------------------------------------------------------------ writing

    def append(self, type: str, data: object) -> Event:
        """Validate, sequence, persist (hand to the sink), commit, notify; return the event.

        Raises :class:`InvalidEventError` (and subclasses) on invalid data, whatever the
        sink raises if it refuses the record, and :class:`ReentrantAppendError` when
        called from one of this session's observers. On any of these nothing changed.
        """
        if self._notifying is not None:
            self._refuse_reentry(type)
        return self._append(type, self._codec.prepare(type, data))

    def append_fact(self, data: msgspec.Struct) -> Event:
        """:meth:`append` for a typed fact, its type looked up from its struct class."""
        if self._notifying is not None:
            self._refuse_reentry(type(data).__name__)
        name, prepared = self._codec.prepare_fact(data)
        return self._append(name, prepared)

    def _refuse_reentry(self, what: str) -> None:
        if self._notifying == threading.get_ident():
            raise ReentrantAppendError(
                f"session {self.id!r}: a session/event observer tried to append {what!r} "
                "while being notified; observers may not append: hand the work to another "
                "thread or actor (e.g. send a message) and append from there"
            )

    def _append(self, type: str, data: object) -> Event:
        with self._lock:
            seq = self._last_seq + 1
            now = self._clock()
            if now < self._last_time:  # noqa: PLR1730 -- hot path, cheaper than max()
                now = self._last_time  # Invariant: time never goes backwards in a log
            event = Event(type, seq, now, data)
            if type in SURFACE_TYPES:
                self._surface.check(event)
            payload = self._codec.encode(event)
            self._sink.submit(PendingRecord(self._header.key, seq, payload))
            self._commit(event)
            if self._observers:
                self._notify(event)
        return event

    def _commit(self, event: Event) -> None:
        """Apply an accepted event to the log and every projection (cannot fail)."""
        self._log.append(event)
        self._last_seq = event.seq
        self._last_time = event.time
        kind = event.type
        if kind in SURFACE_TYPES:
            self._surface.apply(event)
        elif kind == "agent/inbox/spliced":
            self._inbox.apply(event)
        self._turns.apply(event)

    def _load(self, event: Event) -> None:
        if event.seq <= self._last_seq:
            raise LogCorruptError(
                f"session {self.id!r}: loaded history has seq {event.seq} after seq "
                f"{self._last_seq}; seqs must strictly increase (restore from a backup)"
            )
        if event.type in SURFACE_TYPES:
            try:
                self._surface.check(event)
            except InvalidEventError as err:
                raise LogCorruptError(f"session {self.id!r}: {err}") from err
        last_time = self._last_time
        self._commit(event)
        self._last_time = max(last_time, event.time)

    def _notify(self, event: Event) -> None:
        self._notifying = threading.get_ident()
        try:
            for observer in self._observers:
                try:
                    observer(event)
                except Exception:  # noqa: BLE001 -- containment is the contract (CONTRACT 7)
                    _log.exception(
                        "session %r: session/event observer %r failed on %r seq %d; "
                        "the failure is contained and the event stays committed",
                        self.id,
                        observer,
                        event.type,
                        event.seq,
                    )
        finally:
            self._notifying = None

    def on_event(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer(event)`` after every future append; returns a disposer.

        Observers run in the appending thread, in registration order, while the append
        holds the session lock: keep them short. They may read the session but not
        append to it.
        """
        with self._lock:
            self._observers = (*self._observers, observer)

        def dispose() -> None:
            with self._lock:
                observers = list(self._observers)
                if observer in observers:
                    observers.remove(observer)
                    self._observers = tuple(observers)

        return dispose

    def repair(self) -> list[Event]:
        """Close an open tail turn durably after a crash (CONTRACT 7); see
        :func:`storage.projections.repair_plan` for the rule. Returns what it appended
        (``[]`` when no turn is open)."""
        with self._lock:
            start = self._turns.open_turn_seq
            if start is None:
                return []
            plan = repair_plan(self.events(start))
            return [self.append(kind, data) for kind, data in plan]

    # ------------------------------------------------------------------ durability

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything appended before the call is durable."""
        self._sink.flush(timeout)

    def flush_async(self, callback: Callable[[BaseException | None], None]) -> None:
        self._sink.flush_async(callback)

    # ------------------------------------------------------------------ reading

    def events(self, lower: int = 0, upper: int | None = None) -> list[Event]:
        """Committed events with ``lower <= seq <= upper`` (``upper`` inclusive, like the
        store's ``read`` and fork boundaries); ``None`` means through the last."""
        with self._lock:
            log = self._log
            start = bisect_left(log, lower, key=_SEQ) if lower > 0 else 0
            stop = len(log) if upper is None else bisect_right(log, upper, key=_SEQ)
            return log[start:stop]

    def derive_messages(self) -> list[Message]:
        """The model-visible history (surface facts only), as a new list."""
        with self._lock:
            return self._surface.messages()

    messages = derive_messages

    @property
    def state(self) -> TurnState:
        """Turn/step position of the log (a frozen snapshot)."""
        with self._lock:
            return self._turns.snapshot()

    def pending_inbox(self) -> tuple[list[UserMessage], list[UserMessage]]:
        """``(next_turn, next_step)`` pending messages, replayed from inbox splices."""
        with self._lock:
            return self._inbox.pending()
