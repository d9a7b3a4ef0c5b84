"""JSONL export and import of one session log.

An export is a header line followed by one line per record::

    {"format":"corral-session","version":1,"session":{"id":...,"created":...,...}}
    {"type":"turn/start","seq":0,"time":1718000000000,"data":{...}}
    ...

Each record line is the record's stored bytes, verbatim, so exporting, importing and
exporting again gives byte-identical record lines. The header line is optional on
import (a file of bare records imports too). :func:`read_jsonl` validates *every* line
(well-formed record, known or ignorable type, data matching its schema, size, seq
contiguous from 0) and then the session as a whole (the invariant checker: references,
turn and step numbers, the inbox) before the caller writes anything, so an import is
all or nothing; the error names the first violation. A line over the size limit is
refused after reading at most the limit (and a byte) of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import BinaryIO, Final, Literal, NamedTuple

import msgspec

from storage.codec import Codec
from storage.errors import (
    EventTooLargeError,
    InvalidEventError,
    LogCorruptError,
    UnknownEventTypeError,
)
from storage.events import Event
from storage.invariants import check_invariants
from storage.records import SessionHeader

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "ExportHeader",
    "ImportedLog",
    "read_jsonl",
    "write_jsonl",
]

EXPORT_FORMAT: Final = "corral-session"
EXPORT_VERSION: Final = 1


class ExportHeader(msgspec.Struct, frozen=True):
    """The first line of an export: what it is and which session it came from."""

    format: Literal["corral-session"]
    version: int
    session: SessionHeader


class ImportedLog(NamedTuple):
    """A validated export: its header (if any), raw records and decoded events."""

    header: SessionHeader | None
    payloads: list[bytes]
    events: list[Event]  # without records of unknown ignorable types


class _Envelope(msgspec.Struct):
    seq: int


_header_encoder: Final = msgspec.json.Encoder()
_header_decoder: Final = msgspec.json.Decoder(ExportHeader)
_envelope_decoder: Final = msgspec.json.Decoder(_Envelope)


def write_jsonl(out: BinaryIO, header: SessionHeader, payloads: Iterable[bytes]) -> int:
    """Write ``header`` and every record to ``out``; return the number of records."""
    out.write(_header_encoder.encode(ExportHeader(EXPORT_FORMAT, EXPORT_VERSION, header)))
    out.write(b"\n")
    count = 0
    for payload in payloads:
        out.write(payload)
        out.write(b"\n")
        count += 1
    return count


def read_jsonl(inp: BinaryIO, codec: Codec) -> ImportedLog:
    """Read and validate a whole export; raises InvalidEventError naming the line (or,
    for a session that breaks an invariant, the seq and the rule), or saying the input
    is empty (no header, no record: not an export)."""
    header: SessionHeader | None = None
    payloads: list[bytes] = []
    events: list[Event] = []
    checked: list[Event] = []  # with placeholders of ignorable records, for their seqs
    name = "<import>"
    for number, line in enumerate(_lines(inp, codec.max_event_bytes), start=1):
        if not line.strip():
            continue
        if not payloads and header is None and number == 1 and line.startswith(b'{"format"'):
            header = _read_header(line)
            name = header.id
            continue
        event = _read_record(codec, line, number, expected=len(payloads), name=name)
        payloads.append(bytes(line))
        if event is not None:
            events.append(event)
            checked.append(event)
        else:  # an ignorable record of an unknown type: its placeholder keeps its seq
            placeholder = codec.decode(line, session_id=name, include_ignored=True)
            if placeholder is not None:
                checked.append(placeholder)
    if header is None and not payloads:  # an export of an empty session has its header
        raise InvalidEventError("the input is empty: no export header and no records")
    _check_session(checked)
    return ImportedLog(header, payloads, events)


def _lines(inp: BinaryIO, limit: int) -> Iterator[bytes]:
    """The lines of ``inp`` without their newline; a record line longer than ``limit``
    bytes is refused once ``limit + 1`` of its bytes are read (not read whole: a 1 GiB
    line). The header line (the first) is read whole: it is not a record."""
    number = 0
    while True:
        number += 1
        raw = inp.readline(limit + 2)  # the record, its newline, one byte too many
        if not raw:
            return
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if len(line) > limit:
            if not (number == 1 and line.startswith(b'{"format"')):
                raise EventTooLargeError(
                    f"line {number}: the record is over {limit} bytes, the limit; open "
                    "the store with a larger max_event_bytes. Nothing was written."
                )
            if not raw.endswith(b"\n"):
                rest = inp.readline()
                line = raw + (rest[:-1] if rest.endswith(b"\n") else rest)
        yield line


def _check_session(events: list[Event]) -> None:
    """Refuse a session that breaks the invariants (:mod:`storage.invariants`), naming
    the first violation; an open tail turn is allowed (a resume repairs it)."""
    found = check_invariants(events, allow_open_tail=True)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise InvalidEventError(
            f"the session breaks the log's invariants at {found[0]}{more}; an import is "
            "all or nothing: nothing was written. Export the session again from its "
            "store, or fix the file"
        )


def _read_header(line: bytes) -> SessionHeader:
    try:
        head = _header_decoder.decode(line)
    except msgspec.DecodeError as err:
        raise InvalidEventError(f"line 1: not a corral session export header ({err})") from err
    if head.version != EXPORT_VERSION:
        raise InvalidEventError(
            f"line 1: export version {head.version}; this corral reads version "
            f"{EXPORT_VERSION}: import it with a matching corral release"
        )
    return head.session


def _read_record(
    codec: Codec, line: bytes, number: int, *, expected: int, name: str
) -> Event | None:
    where = f"line {number}"
    if len(line) > codec.max_event_bytes:
        raise EventTooLargeError(
            f"{where}: the record is {len(line)} bytes, over the limit of "
            f"{codec.max_event_bytes}; open the store with a larger max_event_bytes"
        )
    try:
        seq = _envelope_decoder.decode(line).seq
    except msgspec.DecodeError as err:
        raise InvalidEventError(f"{where}: not a JSON event record ({err})") from err
    if seq != expected:
        raise InvalidEventError(
            f"{where}: seq {seq} where seq {expected} was expected; an import holds one "
            "whole session, seq contiguous from 0. Nothing was written."
        )
    try:
        return codec.decode(line, session_id=name)
    except UnknownEventTypeError as err:
        raise UnknownEventTypeError(f"{where}: {err}. Nothing was written.") from err
    except LogCorruptError as err:
        raise InvalidEventError(f"{where}: {err}. Nothing was written.") from err
