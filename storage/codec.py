"""The event codec: type registry, lossless-JSON validation and the durable record bytes.

A durable record is the JSON object ``{"type","seq","time","data"}`` (plus
``"ignorable":true`` for types registered as ignorable, so that a reader that does not
know the type may skip it; asked to, a reader returns a placeholder for each record it
skipped instead, see :class:`~storage.events.IgnoredRecord`). Records round-trip
byte-identically:
``decode(encode(e)) == e`` and ``encode(decode(b)) == b`` for records this codec wrote.

Validation (:meth:`Codec.prepare`) accepts only data that survives JSON unchanged:
finite floats, string keys, plain ``dict``/``list``/``str``/``int``/``float``/``bool``/
``None`` values, no cycles. Typed facts are checked by a per-type plan compiled once from
the struct's schema: only float fields and ``Any``/``dict``-typed parts (such as
``ToolSpec.parameters``) are looked at, so a struct whose schema cannot hold a
non-finite float or an odd key costs nothing to validate. Field *types* of a struct
instance are trusted (msgspec does not check them at construction; mypy does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Final, Union

import msgspec

from storage.budget import DEFAULT_MAX_EVENT_BYTES
from storage.errors import (
    EventTooLargeError,
    InvalidEventError,
    LogCorruptError,
    UnknownEventTypeError,
)
from storage.events import EVENT_TYPES, SURFACE_TYPES, Event, IgnoredRecord
from storage.lossless import Check, check_plain_json, describe, run_check, struct_check

__all__ = ["Codec", "EventKind", "EventTypes"]

_SURFACE_KEYS: Final = ("surfaceOp", "sourceEventSeqs")


@dataclass(frozen=True, slots=True)  # slots: an attribute read costs a third of a NamedTuple's
class EventKind:
    """What a registry knows of one event type: everything an append looks up, at once."""

    name: str
    data_type: type[msgspec.Struct] | None
    ignorable: bool
    decoder: msgspec.json.Decoder[Any]
    check: Check | None
    """The validation plan of ``data_type`` instances; ``None``: nothing to check."""
    surface: bool
    """One of :data:`SURFACE_TYPES` (checked and applied by the surface projection)."""
    encode: Callable[[Event], bytes]
    """The record bytes of an event of this type (raises on unencodable data)."""


class EventTypes:
    """A per-store registry of event types (never a process global).

    Built-in facts come from :data:`storage.events.EVENT_TYPES` via :meth:`default`.
    Plugins register their own types: with a ``msgspec.Struct`` for typed data, or with
    ``data_type=None`` to accept any JSON object. ``ignorable`` types are marked in
    their records so a reader that does not know them skips them instead of failing.
    """

    def __init__(self) -> None:
        self._entries: dict[str, EventKind] = {}
        self._by_class: dict[type, EventKind | None] = {}  # None: class used by two types
        self._record_decoder: tuple[int, msgspec.json.Decoder[Any]] | None = None

    @classmethod
    def default(cls) -> EventTypes:
        """A new registry holding the built-in fact types."""
        registry = cls()
        for name, data_type in EVENT_TYPES.items():
            registry.register(name, data_type)
        return registry

    def register(
        self,
        name: str,
        data_type: type[msgspec.Struct] | None = None,
        *,
        ignorable: bool = False,
    ) -> None:
        """Register ``name``; registering the same definition twice is a no-op."""
        if not isinstance(name, str) or not name:
            raise InvalidEventError(f"an event type name must be a non-empty string, got {name!r}")
        existing = self._entries.get(name)
        if existing is not None:
            if existing.data_type is data_type and existing.ignorable == ignorable:
                return
            raise InvalidEventError(
                f"event type {name!r} is already registered (data_type="
                f"{_type_name(existing.data_type)}, ignorable={existing.ignorable}); "
                "a type's definition never changes: register a new type name instead"
            )
        if data_type is None:
            decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(dict[str, Any])
            check = None
        else:
            if not (isinstance(data_type, type) and issubclass(data_type, msgspec.Struct)):
                raise InvalidEventError(
                    f"event type {name!r}: data_type must be a msgspec.Struct subclass or "
                    f"None, got {data_type!r}"
                )
            info = msgspec.inspect.type_info(data_type)
            assert isinstance(info, msgspec.inspect.StructType)
            carried = [f.encode_name for f in info.fields if f.encode_name in _SURFACE_KEYS]
            if carried and name not in SURFACE_TYPES:
                raise InvalidEventError(
                    f"event type {name!r}: {data_type.__name__} has field(s) {carried}, but "
                    "only user/message, assistant/message and tool/result may carry "
                    "surfaceOp/sourceEventSeqs; rename the field(s)"
                )
            decoder = msgspec.json.Decoder(data_type)
            check = struct_check(data_type)
        encode = _encode_ignorable if ignorable else _ENCODER.encode
        entry = EventKind(name, data_type, ignorable, decoder, check, name in SURFACE_TYPES, encode)
        self._entries[name] = entry
        if data_type is not None:
            self._by_class[data_type] = None if data_type in self._by_class else entry

    @property
    def kinds(self) -> Mapping[str, EventKind]:
        """Every registered type by name (a live, read-only view: later registrations
        show up in it)."""
        return self._entries

    @property
    def kinds_by_class(self) -> Mapping[type, EventKind | None]:
        """The type of each struct class (live, read-only); ``None`` for a class
        registered under several types."""
        return self._by_class

    def record_decoder(self) -> msgspec.json.Decoder[Any]:
        """A decoder of whole records of every registered type in one pass: a tagged
        union (tag ``type``) of one envelope struct per type, ``data`` typed. Rebuilt
        after a registration (types are only ever added). A record of an unknown type
        fails to decode with it; :meth:`Codec.decode` then takes the two-pass path.
        (Two msgspec decodes per record, envelope then data, made replay half as fast.)"""
        cached = self._record_decoder
        if cached is not None and cached[0] == len(self._entries):
            return cached[1]
        envelopes = [_envelope(entry) for entry in self._entries.values()]
        decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Union[tuple(envelopes)])  # noqa: UP007 -- built at run time
        self._record_decoder = (len(self._entries), decoder)
        return decoder

    def is_known(self, name: str) -> bool:
        return name in self._entries

    def is_ignorable(self, name: str) -> bool:
        entry = self._entries.get(name)
        return entry is not None and entry.ignorable

    def data_type(self, name: str) -> type[msgspec.Struct] | None:
        """The struct registered for ``name`` (``None`` for plain-JSON plugin types)."""
        return self._entry(name).data_type

    def names(self) -> list[str]:
        return list(self._entries)

    def _entry(self, name: str) -> EventKind:
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownEventTypeError(
                f"unknown event type {name!r}: register it with EventTypes.register() "
                f"before appending it (known types: {', '.join(sorted(self._entries))})"
            )
        return entry

    def _entry_of(self, data: msgspec.Struct) -> EventKind:
        try:
            entry = self._by_class[type(data)]
        except KeyError:
            raise UnknownEventTypeError(
                f"no event type is registered for {type(data).__name__}; register it with "
                "EventTypes.register(name, data_type) or use append(type, data)"
            ) from None
        if entry is None:
            raise InvalidEventError(
                f"{type(data).__name__} is registered under several event types; "
                "use append(type, data) to say which"
            )
        return entry


def _envelope(entry: EventKind) -> type[msgspec.Struct]:
    """The record struct of one event type, for :meth:`EventTypes.record_decoder`."""
    data: Any = dict[str, Any] if entry.data_type is None else entry.data_type
    return msgspec.defstruct(
        "Record",
        [("seq", int), ("time", int), ("data", data), ("ignorable", bool, False)],
        tag_field="type",
        tag=entry.name,
        namespace={"name": entry.name},  # the tag is no field: the event type, as a class attribute
        gc=False,
    )


def _type_name(data_type: type | None) -> str:
    return "None" if data_type is None else data_type.__name__


class _IgnorableRecord(msgspec.Struct):
    type: str
    seq: int
    time: int
    data: Any
    ignorable: bool = True


class _RawRecord(msgspec.Struct):
    type: str
    seq: int
    time: int
    data: msgspec.Raw
    ignorable: bool = False


_ENCODER: Final = msgspec.json.Encoder()
_IGNORABLE: Final = attrgetter("ignorable")
_RAW_DECODER: Final = msgspec.json.Decoder(_RawRecord)


def _encode_ignorable(event: Event) -> bytes:
    return _ENCODER.encode(_IgnorableRecord(event.type, event.seq, event.time, event.data))


class Codec:
    """Validates event data and encodes/decodes durable records for one store."""

    def __init__(self, types: EventTypes, *, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES):
        if type(max_event_bytes) is not int or max_event_bytes <= 0:
            raise ValueError(f"max_event_bytes must be a positive int, got {max_event_bytes!r}")
        self._types = types
        self._max = max_event_bytes

    @property
    def types(self) -> EventTypes:
        return self._types

    @property
    def max_event_bytes(self) -> int:
        return self._max

    def type_of(self, data: msgspec.Struct) -> str:
        """The registered type name of a typed fact."""
        return self._types._entry_of(data).name

    def kind_of(self, data: msgspec.Struct) -> EventKind:
        """The registered kind of a typed fact; raises :class:`UnknownEventTypeError`
        for an unregistered class, :class:`InvalidEventError` for an ambiguous one."""
        return self._types._entry_of(data)

    def prepare(self, type: str, data: object) -> object:
        """Validate and normalize ``data`` for an event of ``type``.

        Typed types take an instance of their struct (returned as is), or a mapping in
        the durable JSON shape (camelCase keys; keys outside the schema are ignored, as
        msgspec does) converted to it. Plain-JSON plugin types take a mapping and get a
        fresh deep copy. Raises :class:`InvalidEventError` (or a subclass).
        """
        entry = self._types._entry(type)
        data_type = entry.data_type
        if data_type is not None and data.__class__ is data_type:
            if entry.check is not None:
                run_check(type, entry.check, data)
            return data
        if isinstance(data, msgspec.Struct) or not isinstance(data, Mapping):
            expected = f"a {data_type.__name__} or a mapping" if data_type else "a JSON object"
            raise InvalidEventError(
                f"{type!r} event at $.data: expected {expected}, found {describe(data)}"
            )
        plain = dict(data)
        run_check(type, check_plain_json, plain)
        if data_type is None:
            for key in _SURFACE_KEYS:
                if key in plain:
                    raise InvalidEventError(
                        f"{type!r} event at $.data.{key}: only user/message, assistant/message "
                        f"and tool/result may carry surfaceOp/sourceEventSeqs; remove {key!r}"
                    )
        try:
            return entry.decoder.decode(_ENCODER.encode(plain))
        except msgspec.ValidationError as err:
            detail = str(err).replace("`$", "`$.data")
            raise InvalidEventError(f"{type!r} event: {detail}") from err
        except UnicodeEncodeError as err:  # a lone surrogate: not encodable as UTF-8 JSON
            message = f"{type!r} event: data cannot be encoded as JSON ({err})"
            raise InvalidEventError(message) from err

    def encode(self, event: Event) -> bytes:
        """The durable record bytes; raises :class:`EventTooLargeError` over the limit."""
        return self.encode_as(self._types._entry(event.type), event)

    def encode_as(self, kind: EventKind, event: Event) -> bytes:
        """:meth:`encode` for an event whose kind the caller has looked up already."""
        try:
            payload = kind.encode(event)
        except (TypeError, ValueError, OverflowError) as err:
            raise InvalidEventError(
                f"{event.type!r} event seq {event.seq}: data cannot be encoded as JSON ({err})"
            ) from err
        if len(payload) > self._max:
            raise self._too_large(event, len(payload))
        return payload

    def encode_many(self, kinds: Sequence[EventKind], events: Sequence[Event]) -> list[bytes]:
        """:meth:`encode_as` of each event (``kinds[i]`` is the kind of ``events[i]``):
        the same bytes and, for the first bad event in order, the same error; faster.
        """
        try:
            if any(map(_IGNORABLE, kinds)):
                payloads = [kind.encode(event) for kind, event in zip(kinds, events, strict=True)]
            else:  # every record is the plain envelope: one loop in C
                payloads = list(map(_ENCODER.encode, events))
        except (TypeError, ValueError, OverflowError):
            payloads = []  # some data cannot be encoded: encode_as says which, below
        if len(payloads) == len(events) and (not payloads or max(map(len, payloads)) <= self._max):
            return payloads
        return [self.encode_as(kind, event) for kind, event in zip(kinds, events, strict=True)]

    def _too_large(self, event: Event, size: int) -> EventTooLargeError:
        return EventTooLargeError(
            f"{event.type!r} event seq {event.seq} is {size} bytes encoded, over the limit "
            f"of {self._max} bytes; store large content elsewhere and log a reference, or "
            "raise max_event_bytes"
        )

    def decode(
        self, payload: bytes, *, session_id: str, include_ignored: bool = False
    ) -> Event | None:
        """Read a record back. ``None`` means an unknown but ignorable type: skip it; with
        ``include_ignored``, such a record reads as a placeholder event instead (its
        data an :class:`~storage.events.IgnoredRecord` holding the record's bytes)."""
        decoder = self._types.record_decoder()
        try:  # one pass: the envelope and its typed data (see EventTypes.record_decoder)
            record = decoder.decode(payload)
        except msgspec.DecodeError:  # says what is wrong, or skips
            return self._decode_slowly(payload, session_id, include_ignored)
        return Event(record.name, record.seq, record.time, record.data)

    def decode_run(
        self,
        payloads: Iterable[bytes],
        *,
        first_seq: int,
        session_id: str,
        include_ignored: bool = False,
    ) -> list[Event]:
        """:meth:`decode` of the records stored at seqs ``first_seq``, ``first_seq + 1``,
        ... of one session (unknown ignorable types skipped, or with ``include_ignored``
        read as placeholders: then every seq has its event). Raises
        :class:`LogCorruptError` naming the seq of a record that does not decode or that
        says another seq than the one it is stored at."""
        decoder = self._types.record_decoder()
        events: list[Event] = []
        append = events.append
        seq = first_seq
        for payload in payloads:
            try:
                record = decoder.decode(payload)
            except msgspec.DecodeError:  # the slow path only: the fast one pays nothing
                event = self._decode_at(payload, session_id, seq, include_ignored)
                if event is not None:
                    append(event)
                seq += 1
                continue
            if record.seq != seq:
                raise self._misplaced(session_id, seq, record.seq)
            append(Event(record.name, seq, record.time, record.data))
            seq += 1
        return events

    def _decode_at(
        self, payload: bytes, session_id: str, seq: int, include_ignored: bool
    ) -> Event | None:
        """:meth:`decode` of the record stored at ``seq``, its errors naming that seq."""
        try:
            event = self._decode_slowly(payload, session_id, include_ignored)
        except LogCorruptError as err:
            if f"seq {seq}" in str(err):
                raise
            raise LogCorruptError(f"{err} (the record at seq {seq})") from err
        if event is not None and event.seq != seq:
            raise self._misplaced(session_id, seq, event.seq)
        return event

    @staticmethod
    def _misplaced(session_id: str, stored: int, says: int) -> LogCorruptError:
        return LogCorruptError(
            f"session {session_id!r}: the record stored at seq {stored} says seq {says}"
        )

    def _decode_slowly(
        self, payload: bytes, session_id: str, include_ignored: bool = False
    ) -> Event | None:
        """:meth:`decode` in two passes (the envelope, then its data by type): for a
        record of an unknown type, or one that does not decode (the error says why)."""
        try:
            record = _RAW_DECODER.decode(payload)
        except msgspec.DecodeError as err:
            raise LogCorruptError(
                f"session {session_id!r}: a record is not a valid event envelope ({err}); "
                "the log is damaged: restore the store from a backup or an export"
            ) from err
        entry = self._types._entries.get(record.type)
        if entry is None:
            if record.ignorable:
                if include_ignored:  # a placeholder: accounted for, not interpreted
                    return Event(
                        record.type, record.seq, record.time, IgnoredRecord(bytes(payload))
                    )
                return None
            raise UnknownEventTypeError(
                f"session {session_id!r} seq {record.seq}: unknown event type "
                f"{record.type!r} (not marked ignorable); register it with "
                "EventTypes.register() before opening this log"
            )
        try:
            data = entry.decoder.decode(record.data)
        except msgspec.DecodeError as err:
            raise LogCorruptError(
                f"session {session_id!r} seq {record.seq}: {record.type!r} data does not "
                f"match its schema ({err}); the log is damaged or was written by another "
                "schema: restore from a backup or an export"
            ) from err
        return Event(record.type, record.seq, record.time, data)
