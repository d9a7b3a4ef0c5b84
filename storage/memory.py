"""An in-memory :class:`~storage.records.LogSink` for tests and deterministic runs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

from storage.errors import StoreClosedError
from storage.records import PendingRecord, Record

__all__ = ["MemorySink"]


class _Batch(NamedTuple):
    session_key: int
    first_seq: int
    payloads: list[bytes]


class MemorySink:
    """Keeps every submitted record in :attr:`records`; everything is durable at once.

    ``flush`` returns immediately and ``flush_async`` calls its callback synchronously,
    in the calling thread. After :meth:`close`, ``submit`` and the flushes refuse with
    :class:`StoreClosedError` (to test what a session does when its store goes away).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Single records and whole batches (a list of payloads from a first seq), in
        # submission order: a batch is kept as it came, without a tuple per record for
        # the cyclic GC to walk, and expanded when read.
        self._records: list[PendingRecord | _Batch] = []
        self._closed = False
        self.flushes = 0
        """How many flushes (sync or async) were requested."""

    @property
    def records(self) -> list[PendingRecord]:
        """A copy of the submitted records, in submission order."""
        with self._lock:
            entries = list(self._records)
        records: list[PendingRecord] = []
        for entry in entries:
            if isinstance(entry, _Batch):
                key, first, payloads = entry
                records += (PendingRecord(key, seq, p) for seq, p in enumerate(payloads, first))
            else:
                records.append(entry)
        return records

    def payloads(self, session_key: int | None = None) -> list[bytes]:
        """The submitted payloads, optionally of one session only."""
        return [
            r.payload for r in self.records if session_key is None or r.session_key == session_key
        ]

    def submit(self, record: Record) -> None:
        with self._lock:
            if self._closed:
                raise self._refusal()
            self._records.append(PendingRecord._make(record))  # a session passes a plain tuple

    def submit_many(self, session_key: int, first_seq: int, payloads: Sequence[bytes]) -> None:
        batch = _Batch(session_key, first_seq, list(payloads))
        with self._lock:
            if self._closed:
                raise self._refusal()
            self._records.append(batch)

    def flush_async(self, callback: Callable[[BaseException | None], None]) -> None:
        with self._lock:
            self.flushes += 1
            error = None if not self._closed else self._refusal()
        callback(error)

    def flush(self, timeout: float | None = None) -> None:
        with self._lock:
            self.flushes += 1
            self._check_open()

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise self._refusal()

    @staticmethod
    def _refusal() -> StoreClosedError:
        return StoreClosedError("the memory sink is closed: records can no longer be written")
