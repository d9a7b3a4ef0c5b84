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

:meth:`Session.extend` appends a batch of facts the same way, all or nothing: every fact
is validated (surface rules also against the batch's earlier facts) and encoded before
any is handed to the sink, all at once; the events are then
committed together and the observers called once per event, after the whole batch.

Memory stays bounded for a long-lived session: given a :data:`DurableReader` (the store
passes one), a session keeps its projections and only the *tail* of events not yet
known to be durable. A successful flush through the session acknowledges everything
appended before it; acknowledged events are dropped from memory and
:meth:`Session.events` reads them back from the store. A session that is never
flushed (durability ``none``) asks its sink for a flush itself when its tail reaches
``tail_bound`` events, and again each time it grew by as many. Without a reader a
session keeps every event in memory.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Final, NamedTuple, cast

import msgspec

from storage.aio import wait_durable
from storage.codec import Codec, EventKind
from storage.errors import InvalidEventError, LogCorruptError, ReentrantAppendError
from storage.events import SURFACE_TYPES, Event, Message, SurfaceReplace, UserMessage
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
from storage.records import DurableReader, FlushCallback, LogSink, Outbox, SessionHeader
from storage.timeouts import check_timeout

__all__ = ["TAIL_BOUND", "Fact", "Observer", "Session", "epoch_ms"]

_log = logging.getLogger("corral.session")
_SEQ: Final = attrgetter("seq")
_INBOX: Final = "agent/inbox/spliced"

Fact = tuple[str, object]
"""A fact to append: its event type and its data (see :meth:`Session.append`)."""

TAIL_BOUND: Final = 64
"""Default ``tail_bound``: how many events a store-backed session holds before it asks
its sink which are durable, and how much its tail grows between two such requests (the
not-yet-durable tail can be longer while the sink catches up)."""


class _Checked(NamedTuple):
    """A batch of facts validated by :meth:`Session.extend`, in parallel lists."""

    names: list[str]
    datas: list[object]
    kinds: list[EventKind]
    surfaces: list[int]
    """The indexes of the surface facts."""
    tracked: list[int]
    """The indexes of the facts that a projection takes (see ``Session._appliers``)."""


Observer = Callable[[Event], None]


def _blame(err: InvalidEventError, index: int, type: str) -> None:
    """Prefix ``err``'s message with the batch position of the fact it refuses (the
    caller re-raises it: same class, traceback and cause)."""
    err.args = (f"facts[{index}] ({type!r}): {err}", *err.args[1:])


class _BatchSurface(SurfaceProjection):
    """The surface projection as it will be once a batch's surface events are applied,
    for checking them in order without applying any (a refused batch changes nothing).

    Only :meth:`slot_of` is answered (from the base projection and the batch's earlier
    events), which is all :meth:`SurfaceProjection.check` consults.
    """

    __slots__ = ("_base", "_batch", "_length")

    def __init__(self, base: SurfaceProjection) -> None:
        super().__init__()
        self._base = base
        self._batch: dict[int, int] = {}  # seq of a batch surface event -> its slot
        self._length = len(base)

    def slot_of(self, seq: int) -> int | None:
        slot = self._batch.get(seq)
        return slot if slot is not None else self._base.slot_of(seq)

    def check_all(self, events: list[Event], surfaces: list[int]) -> None:
        """Check ``events[i]`` for each ``i`` of ``surfaces`` (increasing), as if the
        earlier ones were applied; an error names the index."""
        for index in surfaces:
            event = events[index]
            try:
                self.check(event)
            except InvalidEventError as err:
                _blame(err, index, event.type)
                raise
            op = event.data.surface_op
            if type(op) is SurfaceReplace:
                slot = self.slot_of(op.seq)
                assert slot is not None  # Invariant: check() found the target
                self._batch[event.seq] = slot
            else:
                self._batch[event.seq] = self._length
                self._length += 1


_SMALL_BATCH: Final = 16
"""The most facts :meth:`Session.extend` appends in one Python loop, as ``_commit`` does
(larger batches take ``_extend_bulk``, whose loops run in C; the crossover is not tuned:
a turn's batches hold 2-5 facts, a bulk append thousands)."""

_time_ns: Final = time.time_ns
# type(x), for where a parameter named ``type`` hides it (cheaper than ``x.__class__``).
_class: Final = type


def _both(
    first: Callable[[Event], None], second: Callable[[Event], None]
) -> Callable[[Event], None]:
    """One projection update made of two, in order."""

    def update(event: Event) -> None:
        first(event)
        second(event)

    return update


def epoch_ms() -> int:
    """Wall-clock time in epoch milliseconds (the default session clock)."""
    return _time_ns() // 1_000_000


class Session:
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
        self._appliers = self._projection_updates()
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
            apply = self._appliers.get(type)
            if apply is not None:
                apply(event)
            if len(tail) >= self._room_at:
                self._make_room()
            if self._observers:  # a runtime bridges sessions only once someone listens
                self._notify(event)
        finally:
            lock.release()
        return event

    def extend(self, facts: Iterable[Fact]) -> list[Event]:
        """Append several facts at once, all or nothing; return their events.

        Each ``(type, data)`` is validated as by :meth:`append` (known type, lossless
        JSON, surface rules, size limit); the surface rules see the batch's earlier
        facts too, so a replace may cite one of them. If any fact is refused nothing is
        written and the error (the same class :meth:`append` raises) starts with its
        index: ``facts[3] ('user/message'): ...``. Otherwise the events get the next
        seqs and one ``time`` (a single clock reading), go to the sink at once (one
        ``list.extend`` onto the session's outbox, or one :meth:`LogSink.submit_many`),
        and are committed to the log and projections
        together; only then are the observers called, once per event in seq order
        (holding the lock, as for :meth:`append`): an observer never sees a batch half
        committed. Raises :class:`ReentrantAppendError` when called from an observer
        and whatever the sink raises if it refuses the batch; then nothing changed.
        """
        if self._notifying is not None:
            self._refuse_reentry("a batch of facts")
        # A list or tuple as is (no copy): the general path may have to read it again.
        batch = facts if isinstance(facts, list | tuple) else list(facts)
        if len(batch) > _SMALL_BATCH:
            return self._extend_bulk(batch)
        if not batch:
            return []
        # A small batch (a turn's back-to-back facts): _commit's tricks, one frame, one
        # loop. Anything but typed facts of known types takes the general path.
        known = self._kinds
        lock = self._lock
        while not lock.acquire(False):  # not `with` (hot path): see storage.locks
            wait_until_free(lock)
        try:
            seq = first = self._last_seq + 1
            now = self._now()
            events: list[Event] = []
            payloads: list[bytes] = []
            surface = -1  # the index of the first surface fact
            surfaces = 0
            bad = False  # a fact cannot be encoded, or is too large: which? see below
            limit = self._max_bytes
            for name, data in batch:
                kind = known.get(name)
                if kind is None or _class(data) is not kind.data_type:
                    # The general path converts, or raises the right error (the lock is
                    # reentrant; it gets the clock reading: one per batch).
                    return self._extend_bulk(batch, now)
                if kind.check is not None:  # validation errors first, in order, as _validate
                    try:
                        run_check(name, kind.check, data)
                    except InvalidEventError as err:
                        _blame(err, seq - first, name)
                        raise
                event = Event(name, seq, now, data)
                events.append(event)
                try:  # Codec.encode_as, inline (as in _commit)
                    payload = kind.encode(event)
                except (TypeError, ValueError, OverflowError):
                    bad = True
                    payload = b""
                if len(payload) > limit:
                    bad = True
                payloads.append(payload)
                if kind.surface:
                    if not surfaces:
                        surface = seq - first
                    surfaces += 1
                seq += 1
            # Surface rules before the size and encoding errors, as in _extend_bulk.
            if surfaces == 1:  # nothing earlier in the batch to cite: the projection says
                try:
                    self._surface.check(events[surface])
                except InvalidEventError as err:
                    _blame(err, surface, events[surface].type)
                    raise
            elif surfaces:
                cited = [index for index, event in enumerate(events) if known[event.type].surface]
                _BatchSurface(self._surface).check_all(events, cited)
            if bad:  # raises, naming the fact
                payloads = self._encode_all([known[event.type] for event in events], events)
            self._commit_batch(events, payloads, None)
        finally:
            lock.release()
        return events

    def _extend_bulk(self, facts: Sequence[Fact], now: int | None = None) -> list[Event]:
        """:meth:`extend` of a large batch, or of one with mappings or plugin types (loops
        in C where it can). ``now``: the batch's time, already read (the lock is held)."""
        names, datas, kinds, surfaces, tracked = self._validate(facts)
        if not kinds:
            return []
        lock = self._lock
        while not lock.acquire(False):  # not `with` (hot path): see storage.locks
            wait_until_free(lock)
        try:
            first = self._last_seq + 1
            if now is None:
                now = self._now()
            last = first + len(kinds) - 1
            events = list(map(Event, names, range(first, last + 1), repeat(now), datas))
            if surfaces:
                _BatchSurface(self._surface).check_all(events, surfaces)
            self._commit_batch(events, self._encode_all(kinds, events), tracked)
        finally:
            lock.release()
        return events

    def _now(self) -> int:
        """A batch's time: one clock reading, never before the log's last time (the lock
        is held; ``_commit`` reads the clock inline, as its hot path)."""
        clock = self._clock
        now = _time_ns() // 1_000_000 if clock is None else clock()  # None: epoch_ms
        return max(now, self._last_time)  # Invariant: time never goes backwards in a log

    def _commit_batch(
        self, events: list[Event], payloads: list[bytes], tracked: list[int] | None
    ) -> None:
        """Hand a checked, encoded batch to the sink, then commit it to the log, the
        projections (``tracked``: the indexes of the events a projection takes; None:
        look each one up) and the observers. The lock is held."""
        outbox = self._outbox
        if outbox is None:
            self._sink.submit_many(self._key, events[0].seq, payloads)
        else:  # see Outbox
            records = outbox.records
            records.extend(payloads)
            if len(records) == len(payloads) or outbox.stopped:
                outbox.announce(payloads[-1], len(payloads))  # may refuse (and take them back)
        # Commit: cannot fail from here on.
        tail = self._tail
        tail.extend(payloads if self._records else events)
        self._last_seq = events[-1].seq
        self._last_time = events[0].time  # Invariant: a batch has one time
        appliers = self._appliers
        if tracked is None:
            for event in events:  # in seq order
                apply = appliers.get(event.type)
                if apply is not None:
                    apply(event)
        else:
            for index in tracked:  # in seq order
                event = events[index]
                appliers[event.type](event)
        if len(tail) >= self._room_at:
            self._make_room()
        if self._observers:
            for event in events:
                self._notify(event)

    def _validate(self, facts: Iterable[Fact]) -> _Checked:
        """``facts`` checked (and converted) one by one as :meth:`append` does; an
        error names the index of the first bad fact."""
        batch = _Checked([], [], [], [], [])
        names, datas, kinds, surfaces, tracked = batch
        known = self._kinds
        appliers = self._appliers
        for index, (name, data) in enumerate(facts):
            kind = known.get(name)
            try:
                if kind is not None and type(data) is kind.data_type:  # as in append
                    if kind.check is not None:
                        run_check(name, kind.check, data)
                    datas.append(data)
                else:
                    datas.append(self._codec.prepare(name, data))
                    kind = known[name]
            except InvalidEventError as err:
                _blame(err, index, name)
                raise
            names.append(name)
            kinds.append(kind)
            if kind.surface:
                surfaces.append(index)
            if name in appliers:
                tracked.append(index)
        return batch

    def _encode_all(self, kinds: list[EventKind], events: list[Event]) -> list[bytes]:
        """The records of ``events``; an error names the index of the first bad one."""
        try:
            return self._codec.encode_many(kinds, events)
        except InvalidEventError:
            pass  # which one? encode them one by one (a failure is rare: take the slow path)
        for index, (kind, event) in enumerate(zip(kinds, events, strict=True)):
            try:
                self._codec.encode_as(kind, event)
            except InvalidEventError as err:
                _blame(err, index, event.type)
                raise
        raise AssertionError("encode_many refused events that encode_as accepts")

    def _projection_updates(self) -> dict[str, Callable[[Event], None]]:
        """What an append calls to update the projections, by event type (types that
        change none are absent): one lookup and one call per fact."""
        updates: dict[str, Callable[[Event], None]] = {_INBOX: self._inbox.apply}
        for name in TURN_TYPES:
            handler = self._turns.handler(name)
            assert handler is not None  # Invariant: TURN_TYPES are the handled types
            updates[name] = handler
        surface = self._surface.apply
        for name in SURFACE_TYPES:
            turn = updates.get(name)  # tool/result: the turn tracker's too, after the surface
            updates[name] = surface if turn is None else _both(surface, turn)
        return updates

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

    # ------------------------------------------------------------------ durability

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
