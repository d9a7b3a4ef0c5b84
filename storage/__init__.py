"""Durable facts: the session event vocabulary, its codec, the LMDB log and projections."""

from storage.codec import DEFAULT_MAX_EVENT_BYTES, Codec, EventTypes
from storage.errors import (
    CorralError,
    DuplicateSessionError,
    EventTooLargeError,
    ForkBoundaryError,
    InvalidEventError,
    LogCorruptError,
    ReentrantAppendError,
    SchemaVersionError,
    StorageError,
    StoreClosedError,
    UnknownEventTypeError,
    UnknownSessionError,
)
from storage.events import EVENT_TYPES, SURFACE_TYPES, Event
from storage.invariants import Violation, assert_invariants, check_invariants
from storage.lmdb_store import (
    Durability,
    InvalidSessionIdError,
    SessionStats,
    Store,
    StoreStatistics,
)
from storage.memory import MemorySink
from storage.projections import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    TurnState,
    derive_messages,
    fork_prefix,
    pending_inbox,
    repair_plan,
    turn_state,
)
from storage.session import LogSink, PendingRecord, Session, SessionHeader

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "EVENT_TYPES",
    "SURFACE_TYPES",
    "TOOL_NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN",
    "Codec",
    "CorralError",
    "DuplicateSessionError",
    "Durability",
    "Event",
    "EventTooLargeError",
    "EventTypes",
    "ForkBoundaryError",
    "InvalidEventError",
    "InvalidSessionIdError",
    "LogCorruptError",
    "LogSink",
    "MemorySink",
    "PendingRecord",
    "ReentrantAppendError",
    "SchemaVersionError",
    "Session",
    "SessionHeader",
    "SessionStats",
    "StorageError",
    "Store",
    "StoreClosedError",
    "StoreStatistics",
    "TurnState",
    "UnknownEventTypeError",
    "UnknownSessionError",
    "Violation",
    "assert_invariants",
    "check_invariants",
    "derive_messages",
    "fork_prefix",
    "pending_inbox",
    "repair_plan",
    "turn_state",
]
