"""The storage error taxonomy.

Every error is a :class:`StorageError`; each message says what happened, where (the
session, the seq, the JSON path such as ``$.data.arguments.x``) and what to do.
Validation errors (:class:`InvalidEventError` and its subclasses) are raised *before*
anything is written: a failed append leaves the log, its projections and the sink as
they were.
"""

from __future__ import annotations

__all__ = [
    "CorralError",
    "DiskFullError",
    "DuplicateSessionError",
    "EventTooLargeError",
    "ForkBoundaryError",
    "InvalidEventError",
    "LogCorruptError",
    "ReentrantAppendError",
    "SchemaVersionError",
    "StorageError",
    "StoreClosedError",
    "UnknownEventTypeError",
    "UnknownSessionError",
]


class CorralError(Exception):
    """Base of every error corral raises on purpose, in every layer.

    It lives here, in the lowest layer, so that ``actors`` and ``runtime`` can derive
    their own bases from it; ``runtime`` re-exports it.
    """


class StorageError(CorralError):
    """Base of every error raised by ``storage``."""


class InvalidEventError(StorageError):
    """An event was refused by validation (lossless JSON, shape, surface rules).

    The message names the offending JSON path (``$.data.arguments.x``), what was
    expected and what was found. Nothing was written.
    """


class EventTooLargeError(InvalidEventError):
    """The encoded event is larger than the codec's ``max_event_bytes``."""


class UnknownEventTypeError(InvalidEventError):
    """The event type is not registered (and, when reading, not marked ignorable)."""


class ReentrantAppendError(StorageError):
    """A ``session/event`` observer tried to append to the session it observes."""


class DuplicateSessionError(StorageError):
    """A session with this id already exists."""


class UnknownSessionError(StorageError):
    """No session with this id exists."""


class LogCorruptError(StorageError):
    """A stored record cannot be read back; the message names the session and seq."""


class SchemaVersionError(StorageError):
    """The store was written by an incompatible schema version."""


class StoreClosedError(StorageError):
    """The store (or the sink) is closed; nothing more can be appended or flushed."""


class ForkBoundaryError(StorageError):
    """A fork boundary is out of range or ends inside an open turn."""


class DiskFullError(StorageError):
    """The filesystem that holds the store has no room for a write (``ENOSPC``, or the
    short write LMDB reports as an I/O error on a full disk).

    Nothing is lost and nothing half-written: the transaction was aborted. ``free`` is
    what the filesystem had left for this process and ``needed`` about what the write
    asked for (both in bytes, ``needed`` 0 when unknown). A writable store *holds* the
    records appended meanwhile and writes them once space is freed (see
    docs/durability.md, "A full disk").
    """

    def __init__(self, message: str, free: int = 0, needed: int = 0) -> None:
        super().__init__(message, free, needed)  # all in args: it pickles whole
        self.free = free
        self.needed = needed

    def __str__(self) -> str:
        return str(self.args[0])
