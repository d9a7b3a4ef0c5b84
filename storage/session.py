"""A session: one agent's append-only fact log, its projections and its observers.

:meth:`Session.append` is the only way a fact enters a session. It validates the data
(:meth:`Codec.prepare`: lossless JSON, known type, surface rules), assigns the next
``seq`` and ``time``, encodes the record (size check), hands it to the
:class:`LogSink` (the log writer: through the session's :class:`Outbox`), commits it to
the in-memory log and projections, and finally calls the ``session/event`` observers.
Any failure before the hand-over leaves everything as it was; a failing observer is
logged and contained.

The record is handed to the sink *before* the in-memory commit (the order of CONTRACT
7 lists the commit first): a sink that refuses a record (closed store, failed writer)
then leaves nothing behind, and an observer that calls :meth:`Session.flush` waits for
the event it is observing.

:meth:`Session.extend` appends a batch of facts the same way, all or nothing (see
:mod:`storage.batch`). Memory stays bounded for a long-lived session: given a
:data:`~storage.records.DurableReader` (the store passes one), a session keeps its
projections and only the *tail* of events not yet known to be durable (see
:mod:`storage.tail`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar, Final

import msgspec

from storage.batch import BatchAppends
from storage.codec import Codec, EventKind
from storage.errors import InvalidEventError, LogCorruptError, ReentrantAppendError
from storage.events import SURFACE_TYPES, Event, Message, UserMessage
from storage.locks import wait_until_free
from storage.lossless import run_check
from storage.projections import (
    TURN_TYPES,
    InboxProjection,
    SurfaceProjection,
    TurnState,
    TurnTracker,
    repair_plan,
)
from storage.records import DurableReader, LogSink, Outbox, SessionHeader
from storage.tail import DurableTail

__all__ = ["TAIL_BOUND", "Observer", "Session", "epoch_ms"]

_log = logging.getLogger("corral.session")
_INBOX: Final = "agent/inbox/spliced"

Observer = Callable[[Event], None]

TAIL_BOUND: Final = 64
"""Default ``tail_bound``: how many events a store-backed session holds before it asks
its sink which are durable, and how much its tail grows between two such requests (the
not-yet-durable tail can be longer while the sink catches up)."""


_time_ns: Final = time.time_ns
# type(x), for where a parameter named ``type`` hides it (cheaper than ``x.__class__``).
_class: Final = type


Applier = Callable[["Session", Event], None]
"""How one event type updates a session's projections (see ``_APPLIERS``)."""


def _apply_inbox(session: Session, event: Event) -> None:
    session._inbox.apply(event)


def _apply_surface(session: Session, event: Event) -> None:
    session._surface.apply(event)


def _turn_applier(update: Callable[[TurnTracker, Event], None]) -> Applier:
    def apply_turn(session: Session, event: Event) -> None:
        update(session._turns, event)

    return apply_turn


def _both(first: Applier, second: Applier) -> Applier:
    """One projection update made of two, in order."""

    def update(session: Session, event: Event) -> None:
        first(session, event)
        second(session, event)

    return update


def _projection_updates() -> dict[str, Applier]:
    """What an append calls to update the projections, by event type (types that change
    none are absent): one lookup and one call per fact. One table for every session (a
    table of bound methods per session held ~650 bytes of each idle agent)."""
    updates: dict[str, Applier] = {_INBOX: _apply_inbox}
    for name in TURN_TYPES:
        update = TurnTracker.update_for(name)
        assert update is not None  # Invariant: TURN_TYPES are the handled types
        updates[name] = _turn_applier(update)
    for name in SURFACE_TYPES:
        turn = updates.get(name)  # tool/result: the turn tracker's too, after the surface
        updates[name] = _apply_surface if turn is None else _both(_apply_surface, turn)
    return updates


_APPLIERS: Final = _projection_updates()


def epoch_ms() -> int:
    """Wall-clock time in epoch milliseconds (the default session clock)."""
    return _time_ns() // 1_000_000


class Session(BatchAppends, DurableTail):
    """One session's log. Thread-safe: appends are serialized by a lock.

    ``events`` is already-durable history (loaded from a store): it rebuilds the
    projections and is *not* resubmitted. It must have strictly increasing seqs; gaps
    are allowed only where a store skipped unknown ignorable records, in which case
    ``last_seq`` must give the durable last seq so the next append continues after it.

    With a ``reader`` the session keeps only the *records* (the encoded bytes handed to
    the sink) of the events not yet known durable, decodes them when they are read, and
    drops them once they are known durable, reading those back through the reader; the
    loaded ``events`` are then streamed through the projections and not kept, so they
    must be readable from ``reader`` already (committed, not merely queued). Without a
    ``reader`` every event stays in memory, as an object.

    (Why records and not the events: the sink holds the records anyway, and an event
    object kept until its flush comes back is freed after other sessions' work has
    pushed it out of the CPU caches; freeing it at once, while it is still hot, ran
    6-9% more turns per second with 1,000 agents, see benchmarks/README.md.)
    """

    # The projection updates by event type, one table for every session.
    _appliers: ClassVar[Mapping[str, Applier]] = _APPLIERS

    def __init__(
        self,
        header: SessionHeader,
        *,
        sink: LogSink,
        codec: Codec,
        clock: Callable[[], int] = epoch_ms,
        events: Iterable[Event] = (),
        last_seq: int | None = None,
        reader: DurableReader | None = None,
        tail_bound: int = TAIL_BOUND,
    ) -> None:
        if tail_bound < 1:
            raise ValueError(f"tail_bound must be at least 1, got {tail_bound!r}")
        self._header = header
        self._key = header.key
        self._sink = sink
        self._codec = codec
        self._kinds = codec.types.kinds
        self._kinds_by_class = codec.types.kinds_by_class
        self._max_bytes = codec.max_event_bytes
        # None: the default clock, read inline by the hot path (one call less per append).
        self._clock: Callable[[], int] | None = None if clock is epoch_ms else clock
        self._reader = reader
        # Invariant: reentrant so that observers may read (state, events, messages);
        # an observer's append is refused before the lock is taken.
        self._lock = threading.RLock()
        # Invariant: ``_tail`` holds exactly the committed events with seq above
        # ``_dropped``; those at or below it are durable and read through ``_reader``.
        # With a reader it holds their records (seqs _dropped + 1, _dropped + 2, ...:
        # appends never skip one), without one the events themselves (loaded events may
        # skip seqs where a store skipped unknown ignorable records).
        self._tail: list[Event | bytes] = []
        self._records = reader is not None
        # Where appends put their records if the sink takes them itself (see Outbox).
        opener: Callable[[int], Outbox | None] | None = getattr(sink, "outbox", None)
        self._outbox = None if opener is None else opener(self._key)
        self._dropped = -1
        # The highest seq known durable. Written without the lock (by flush callbacks,
        # on the writer thread): racing writers may lose an update, which only delays
        # dropping events; every value written is a true durable mark.
        self._durable = -1
        self._probing = False  # a flush of our own is outstanding (see _make_room)
        self._bound = tail_bound
        # The tail length at which an append calls _make_room (checked on every append,
        # so that _make_room runs once per ``tail_bound`` appends, not on each one).
        self._room_at = tail_bound if reader is not None else sys.maxsize
        self._last_seq = -1
        self._last_time = 0
        self._turns = TurnTracker()
        self._surface = SurfaceProjection()
        self._inbox = InboxProjection(seed_length=header.seed_length)
        self._observers: tuple[Observer, ...] = ()
        self._notifying: int | None = None  # ident of the thread running observers
        keep = self._tail.append if reader is None else None
        for event in events:
            self._load(event)
            if keep is not None:
                keep(event)
        if last_seq is not None:
            if last_seq < self._last_seq:
                raise LogCorruptError(
                    f"session {header.id!r}: last_seq {last_seq} is below the loaded seq "
                    f"{self._last_seq}; the store's session row disagrees with its events"
                )
            self._last_seq = last_seq
        if reader is not None:
            self._dropped = self._durable = self._last_seq

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

    @property
    def resident_events(self) -> int:
        """How many events the session holds in memory (as their records with a reader;
        the rest is read from the store)."""
        return len(self._tail)

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
        kind = self._kinds.get(type)
        if kind is not None and _class(data) is kind.data_type:  # a typed fact: fast path
            if kind.check is not None:
                run_check(type, kind.check, data)
        else:
            data = self._codec.prepare(type, data)  # converts, or raises the right error
            kind = self._kinds[type]
        return self._commit(kind, data)

    def append_fact(self, data: msgspec.Struct) -> Event:
        """:meth:`append` for a typed fact, its type looked up from its struct class."""
        kind = self._kinds_by_class.get(type(data)) or self._codec.kind_of(data)
        if self._notifying is not None:
            self._refuse_reentry(kind.name)
        if kind.check is not None:
            run_check(kind.name, kind.check, data)
        return self._commit(kind, data)

    def _commit(self, kind: EventKind, data: object) -> Event:
        """The rest of :meth:`append` for valid ``data`` of ``kind``, in one frame (the hot
        path of every fact): sequence, encode, hand over, commit, notify."""
        type = kind.name
        lock = self._lock
        while not lock.acquire(False):  # not `with` (hot path): see storage.locks
            wait_until_free(lock)
        try:
            seq = self._last_seq + 1
            clock = self._clock
            now = _time_ns() // 1_000_000 if clock is None else clock()  # None: epoch_ms
            if now < self._last_time:  # noqa: PLR1730 -- hot path, cheaper than max()
                now = self._last_time  # Invariant: time never goes backwards in a log
            event = Event(type, seq, now, data)
            if kind.surface:
                self._surface.check(event)
            try:  # Codec.encode_as, inline (hot path): on failure, it raises the typed error
                payload = kind.encode(event)
            except (TypeError, ValueError, OverflowError):
                payload = self._codec.encode_as(kind, event)
            if len(payload) > self._max_bytes:
                self._codec.encode_as(kind, event)  # raises EventTooLargeError
            outbox = self._outbox
            if outbox is None:
                self._sink.submit((self._key, seq, payload))  # a plain tuple: see Record
            else:  # see Outbox
                records = outbox.records
                records.append(payload)
                if len(records) == 1 or outbox.stopped:
                    outbox.announce(payload, 1)  # may refuse (and take it back)
            # Commit: cannot fail from here on.
            tail = self._tail
            tail.append(payload if self._records else event)
            self._last_seq = seq
            self._last_time = now
            apply = _APPLIERS.get(type)
            if apply is not None:
                apply(self, event)
            if len(tail) >= self._room_at:
                self._make_room()
            if self._observers:  # a runtime bridges sessions only once someone listens
                self._notify(event)
        finally:
            lock.release()
        return event

    def notifying_here(self) -> bool:
        """Whether the calling thread runs this session's ``session/event`` observers
        (which may not append)."""
        return self._notifying == threading.get_ident()

    def _refuse_reentry(self, what: str) -> None:
        if self._notifying == threading.get_ident():
            raise ReentrantAppendError(
                f"session {self.id!r}: a session/event observer tried to append {what!r} "
                "while being notified; observers may not append: hand the work to another "
                "thread or actor (e.g. send a message) and append from there"
            )

    def _load(self, event: Event) -> None:
        if event.seq <= self._last_seq:
            raise LogCorruptError(
                f"session {self.id!r}: loaded history has seq {event.seq} after seq "
                f"{self._last_seq}; seqs must strictly increase (restore from a backup)"
            )
        kind = event.type
        if kind in SURFACE_TYPES:
            try:
                self._surface.check(event)
            except InvalidEventError as err:
                raise LogCorruptError(f"session {self.id!r}: {err}") from err
            self._surface.apply(event)
        elif kind == _INBOX:
            self._inbox.apply(event)
        self._turns.apply(event)
        self._last_seq = event.seq
        self._last_time = max(self._last_time, event.time)

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
        append to it. For a batch (:meth:`extend`) they are called once per event, in
        seq order, after the whole batch is committed.
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
            return self.extend(repair_plan(self.events(start)))

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

    def was_inboxed(self, message_id: str) -> bool:
        """Whether a message ``message_id`` ever went through this session's inbox
        (pending now, claimed or discarded since; a seeded prefix's too)."""
        with self._lock:
            return self._inbox.was_inboxed(message_id)

    def pending_inbox(self) -> tuple[list[UserMessage], list[UserMessage]]:
        """``(next_turn, next_step)`` pending messages, replayed from inbox splices."""
        with self._lock:
            return self._inbox.pending()
