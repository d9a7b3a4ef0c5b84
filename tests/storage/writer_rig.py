"""The log writer's test rig: a real LMDB environment and writer in ``tmp_path``, the
helpers that hold the writer or read the journal, shared by the ``test_writer*`` files.

Importing :func:`no_idle_compaction` into a test module makes it autouse there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import lmdb
import pytest

from storage.lmdb import writer as writer_module
from storage.lmdb.env import LmdbEnv
from storage.lmdb.layout import Databases, event_key
from storage.lmdb.reads import event_records, scan_journal
from storage.lmdb.writer import LogWriter
from storage.records import FlushCallback, SessionHeader

WAIT = 10.0


def header(key: int, session_id: str | None = None) -> SessionHeader:
    return SessionHeader(id=session_id or f"session-{key}", key=key, created=1_700_000_000_000)


def payload(key: int, seq: int, size: int = 0) -> bytes:
    return f'{{"key":{key},"seq":{seq},"pad":"{"x" * size}"}}'.encode()


def stored(env: lmdb.Environment, dbs: Databases) -> dict[bytes, bytes]:
    """Every committed record by its ``events`` key, compacted or still in the journal
    (a journaled record that a compaction round moved to ``events`` is the same bytes)."""
    with env.begin() as txn:
        records = dict(event_records(txn, dbs.events))
        for key, tail in scan_journal(txn, dbs.journal, None).items():
            for seq, value in enumerate(tail.records, tail.first):
                assert records.setdefault(event_key(key, seq), value) == value, "two versions"
    return dict(sorted(records.items()))


class Rig:
    def __init__(self, path: Path, *, map_size: int = 1 << 20, sync_on_flush: bool = False):
        self.store = LmdbEnv(path, readonly=False, map_size=map_size, sync=True)
        self.env = self.store.env
        self.dbs = self.store.dbs
        self.writer = LogWriter(self.store, sync_on_flush=sync_on_flush)

    def close(self) -> None:
        self.writer.close()
        self.store.close()


@pytest.fixture(autouse=True)
def no_idle_compaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that look at the journal must not race the writer's idle compaction."""
    monkeypatch.setattr(writer_module, "JOURNAL_IDLE_S", 3600.0)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path / "env")
    yield made
    made.close()


def hold_writer(rig: Rig) -> threading.Event:
    """Hold the writer thread in a flush callback until the returned event is set (held
    when this returns): flushes queued meanwhile wait for the next commit."""
    release, entered = threading.Event(), threading.Event()

    def hold(error: BaseException | None) -> None:
        entered.set()
        release.wait(WAIT)

    rig.writer.flush_async(hold)  # callbacks run on the writer thread
    assert entered.wait(WAIT)
    return release


def once() -> Callable[[], bool]:
    """True on the first call only, also when a signal handler's call nests in another."""
    first = threading.Lock()
    return lambda: first.acquire(blocking=False)


def signal_main_until(ran: threading.Event) -> None:
    """Send SIGUSR1 to the main thread until its handler sets ``ran``. One signal is not
    enough: one that arrives after the main thread released the GIL but before its wait
    began does not interrupt the wait, and its handler runs only once the wait is over.
    The handler must therefore act once (``once``) and ignore the repeats (they may also
    interrupt its own wait, which then goes on)."""
    deadline = time.monotonic() + WAIT
    while True:
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
        if ran.wait(0.05):
            return
        assert time.monotonic() < deadline, "the main thread never ran its signal handler"


class Noticed(list[FlushCallback]):
    """A writer's list of queued flush callbacks that calls ``notice(length)`` after each
    append (put in place of the writer's list while the writer is held)."""

    def __init__(self, notice: Callable[[int], None]) -> None:
        super().__init__()
        self._notice = notice

    def append(self, callback: FlushCallback) -> None:
        super().append(callback)
        self._notice(len(self))


def journal_size(rig: Rig) -> int:
    """Records in the journal (its frames hold a commit's records each)."""
    with rig.env.begin() as txn:
        return sum(len(t.records) for t in scan_journal(txn, rig.dbs.journal, None).values())


def uncompacted(rig: Rig) -> int:
    """Journaled records that ``events`` does not hold (the journal may also still hold
    copies of compacted ones: a round deletes frames only once it ends)."""
    with rig.env.begin() as txn:
        in_events = {key for key, _ in event_records(txn, rig.dbs.events)}
        tails = scan_journal(txn, rig.dbs.journal, None)
    return sum(
        event_key(key, seq) not in in_events
        for key, tail in tails.items()
        for seq in range(tail.first, tail.first + len(tail.records))
    )


def journal_frames(rig: Rig) -> int:
    with rig.env.begin() as txn:
        return int(txn.stat(rig.dbs.journal)["entries"])


def compacted(rig: Rig) -> dict[bytes, bytes]:
    with rig.env.begin() as txn:
        return dict(event_records(txn, rig.dbs.events))


def read_back(rig: Rig, session_id: str) -> list[bytes]:
    """A session's records through the store's merged view (journal + events)."""
    row = rig.store.row(session_id)
    assert row is not None
    return [value for _, part in rig.store.chunks(row) for value in part]


def run_until_killed(script: str, path: Path) -> None:
    """Run ``script`` on a store at ``path`` in a child that ends by SIGKILLing itself."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run(
        [sys.executable, "-c", script, str(path)], env=env, check=False, timeout=WAIT
    )
    assert child.returncode == -signal.SIGKILL
