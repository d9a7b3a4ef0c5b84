"""Appending a batch of facts to a session at once, all or nothing
(:meth:`BatchAppends.extend`, a base of :class:`~storage.session.Session`).

Every fact is validated (surface rules also against the batch's earlier facts) and
encoded before any is handed to the sink, all at once; the events are then committed
together and the observers called once per event, after the whole batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, ClassVar, Final, NamedTuple

from storage.codec import Codec, EventKind
from storage.errors import InvalidEventError
from storage.events import Event, SurfaceReplace
from storage.locks import wait_until_free
from storage.lossless import run_check
from storage.projections import SurfaceProjection
from storage.records import LogSink, Outbox

__all__ = ["BatchAppends", "Fact"]

Fact = tuple[str, object]
"""A fact to append: its event type and its data (see :meth:`Session.append`)."""

_time_ns: Final = time.time_ns
# type(x), for where a parameter named ``type`` hides it (cheaper than ``x.__class__``).
_class: Final = type


class _Checked(NamedTuple):
    """A batch of facts validated by :meth:`Session.extend`, in parallel lists."""

    names: list[str]
    datas: list[object]
    kinds: list[EventKind]
    surfaces: list[int]
    """The indexes of the surface facts."""
    tracked: list[int]
    """The indexes of the facts that a projection takes (see ``Session._appliers``)."""


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


class BatchAppends:
    """The batch half of :class:`~storage.session.Session` (its base class; the fields
    are the session's, set in its ``__init__``)."""

    if TYPE_CHECKING:
        _key: int
        _sink: LogSink
        _outbox: Outbox | None
        _codec: Codec
        _kinds: Mapping[str, EventKind]
        _max_bytes: int
        _clock: Callable[[], int] | None
        _lock: threading.RLock
        _tail: list[Event | bytes]
        _records: bool
        _room_at: int
        _last_seq: int
        _last_time: int
        _surface: SurfaceProjection
        _appliers: ClassVar[Mapping[str, Callable[[Any, Event], None]]]  # (session, event)
        _observers: tuple[Callable[[Event], None], ...]
        _notifying: int | None

        def _refuse_reentry(self, what: str) -> None: ...

        def _make_room(self) -> None: ...

        def _notify(self, event: Event) -> None: ...

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
                    apply(self, event)
        else:
            for index in tracked:  # in seq order
                event = events[index]
                appliers[event.type](self, event)
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
