"""A fork whose child lives in another shard than its source: the child as an export.

``Runtime.fork`` seeds the child from the source's log in the same store. When the
child's id routes to another shard, the source's shard writes the child's session as
:mod:`storage.export` JSONL instead, the same events ``Store.fork`` would seed (the
source's records up to the boundary, byte for byte, and a ``session/end-seed`` citing
the source) under a header naming the source as parent; the child's shard imports it
(``Store.import_jsonl``: validated, atomic, durable) and resumes the agent over it.
"""

from __future__ import annotations

import io
import time

from storage import Event, ForkBoundaryError, SessionEndSeed, SessionHeader, Store, fork_prefix
from storage.export import write_jsonl

__all__ = ["fork_export"]


def fork_export(store: Store, source_id: str, boundary: int, child_id: str) -> bytes:
    """The JSONL export of a fork child ``child_id`` of ``source_id`` at ``boundary``
    (raises ``ForkBoundaryError`` as ``Store.fork`` does for a boundary out of range or
    inside an open turn)."""
    if type(boundary) is not int:
        raise TypeError(f"boundary is the int seq of the last event to inherit, got {boundary!r}")
    store.flush()
    events = store.read(source_id, upper=max(boundary, 0), include_ignored=True)
    if not events:
        store.stats(source_id)  # UnknownSessionError for a session the store lacks
    seed = fork_prefix(events, boundary)
    full = io.BytesIO()
    store.export_jsonl(source_id, full)
    records = full.getvalue().split(b"\n")[1 : len(seed) + 1]  # after the header line
    if len(records) != len(seed):
        raise ForkBoundaryError(f"session {source_id!r} changed while it was being forked")
    last_time = max((event.time for event in seed), default=0)
    end = Event(
        "session/end-seed",
        len(seed),
        max(int(time.time() * 1000), last_time),  # time never goes backwards in a log
        SessionEndSeed(source_session=source_id, source_seq=boundary),
    )
    header = SessionHeader(
        id=child_id,
        key=0,  # (the importing store assigns its own)
        created=int(time.time() * 1000),
        parent=source_id,
        fork_seq=boundary,
        seed_length=len(seed) + 1,
    )
    out = io.BytesIO()
    write_jsonl(out, header, [*records, store.codec.encode(end)])
    return out.getvalue()
