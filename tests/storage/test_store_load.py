"""The store under load: map growth, concurrent producers and a reader in another
process while this one writes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import msgspec
import pytest

from storage import (
    EventTypes,
    Store,
    assert_invariants,
)
from storage.events import MessageTrigger, TurnStart
from storage.lmdb import compaction as compaction_module
from storage.lmdb import writer as writer_module
from tests.storage.builders import LogBuilder, completed_turn
from tests.storage.store_rig import WAIT, store

__all__ = ["store"]  # the fixture, used by name


# --------------------------------------------------------------------------- load


class Padded(msgspec.Struct, frozen=True):
    n: int
    pad: str


def test_a_tiny_map_grows_without_losing_or_duplicating_a_record(tmp_path: Path) -> None:
    types = EventTypes.default()
    types.register("test/padded", Padded)
    with Store.open(tmp_path / "s", map_size=64 << 10, event_types=types) as store:
        sessions = [store.create_session(f"s{i}") for i in range(3)]
        for n in range(600):
            for session in sessions:
                session.append("test/padded", Padded(n=n, pad="p" * 300))
            if n % 150 == 0:
                store.flush()
        store.flush()
        stats = store.statistics()
    assert stats.resizes >= 1
    assert stats.map_size > 64 << 10
    with Store.open(tmp_path / "s", event_types=types, readonly=True) as reader:
        for i in range(3):
            events = reader.read(f"s{i}")
            assert [e.seq for e in events] == list(range(600))
            assert [e.data.n for e in events] == list(range(600))


def test_concurrent_producers_each_waiting_for_durability_lose_nothing(tmp_path: Path) -> None:
    producers, turns = 16, 4
    failures: list[BaseException] = []
    logs: dict[int, LogBuilder] = {}
    with Store.open(tmp_path / "s") as store:
        sessions = [store.create_session(f"p{i}") for i in range(producers)]
        start = threading.Barrier(producers)

        def produce(index: int) -> None:
            try:
                log = logs[index] = LogBuilder(sessions[index])
                start.wait(WAIT)
                for _ in range(turns):
                    completed_turn(log)
                    sessions[index].flush(WAIT)  # durable before the next turn
                    assert store.last_seq(sessions[index].id) == log.events[-1].seq
            except BaseException as err:
                failures.append(err)

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert failures == []
        stats = store.statistics()
    assert stats.events_written == sum(len(log.events) for log in logs.values())
    with Store.open(tmp_path / "s", readonly=True) as reader:
        for i in range(producers):
            assert reader.read(f"p{i}") == logs[i].events
            assert_invariants(logs[i].events)


def test_per_append_durability_from_many_threads(tmp_path: Path) -> None:
    producers, appends = 8, 25
    with Store.open(tmp_path / "s") as store:
        sessions = [store.create_session(f"p{i}") for i in range(producers)]

        def produce(index: int) -> None:
            session = sessions[index]
            for turn in range(1, appends + 1):
                session.append("turn/start", TurnStart(turn=turn, trigger=MessageTrigger()))
                session.flush(WAIT)

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert [store.stats(s.id).event_count for s in sessions] == [appends] * producers


READER = textwrap.dedent(
    """
    import sys
    from storage import EventTypes, Store

    path, target = sys.argv[1], int(sys.argv[2])
    types = EventTypes.default()
    types.register("test/padded")  # read as a plain JSON object
    with Store.open(path, readonly=True, event_types=types) as store:
        seen = -1
        while seen < target:
            events = store.read("shared")
            seqs = [e.seq for e in events]
            assert seqs == list(range(len(seqs))), "gap or reorder"
            assert len(seqs) - 1 >= seen, "went backwards"
            if len(seqs) - 1 > seen:
                seen = len(seqs) - 1
                print(seen, flush=True)
    """
)


def _start_reader(path: Path, target: int) -> subprocess.Popen[str]:
    """Another process that reads the store at ``path`` until it holds ``target``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-c", READER, str(path), str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("route", ["journal", "direct"])
def test_another_process_reads_while_this_one_writes_and_grows_the_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """The reader merges the journal it scans with ``events``, across compactions
    (``journal``), or reads runs written straight to ``events`` (``direct``)."""
    monkeypatch.setattr(writer_module, "JOURNAL_MAX_RECORDS", 150)
    monkeypatch.setattr(compaction_module, "DIRECT_MIN_BYTES", 1 if route == "direct" else 1 << 62)
    path = tmp_path / "s"
    types = EventTypes.default()
    types.register("test/padded", Padded)
    target = 1999
    with Store.open(path, map_size=64 << 10, event_types=types) as store:
        session = store.create_session("shared")
        session.append("test/padded", Padded(n=0, pad=""))
        store.flush()
        reader = _start_reader(path, target)
        try:
            assert reader.stdout is not None
            assert reader.stdout.readline().strip() == "0"  # the reader is reading
            for n in range(1, target + 1):
                session.append("test/padded", Padded(n=n, pad="r" * 200))
                if n % 100 == 0:
                    store.flush()
            store.flush()
            out, err = reader.communicate(timeout=WAIT)
        finally:
            reader.kill()
            reader.wait()
        assert reader.returncode == 0, err
        assert store.statistics().resizes >= 1
        if route == "journal":
            assert store.statistics().compactions >= 5
    assert out.split()[-1] == str(target)


GROWTH_WAIT = 60.0  # a hang guard only (a growth takes milliseconds), under the 120 s test timeout


def test_a_tiny_map_grows_while_reader_threads_and_another_process_keep_reading(
    tmp_path: Path,
) -> None:
    """RELIABILITY.md's probe: a 64 KiB map, three reader threads and a reader in another
    process. Each growth used to wait (seconds to minutes) for the reader threads to
    leave LMDB at the same instant; now they wait for it, and everyone reads it all."""
    path = tmp_path / "s"
    types = EventTypes.default()
    types.register("test/padded", Padded)
    target = 1999
    done = threading.Event()
    problems: list[BaseException] = []
    with Store.open(path, map_size=64 << 10, event_types=types) as store:
        session = store.create_session("shared")
        session.append("test/padded", Padded(n=0, pad=""))
        store.flush()
        started = threading.Barrier(4)

        def read_until_done() -> None:
            try:
                started.wait(WAIT)
                seen = 0
                while not done.is_set():
                    last = store.last_seq("shared")
                    assert last >= seen, "went backwards"
                    seen = last
                    events = store.read("shared", lower=max(0, last - 3), upper=last)
                    assert [e.seq for e in events] == list(range(max(0, last - 3), last + 1))
            except BaseException as err:
                problems.append(err)

        threads = [threading.Thread(target=read_until_done) for _ in range(3)]
        for thread in threads:
            thread.start()
        started.wait(WAIT)
        reader = _start_reader(path, target)
        try:
            assert reader.stdout is not None
            assert reader.stdout.readline().strip() == "0"  # the reader is reading
            for n in range(1, target + 1):
                session.append("test/padded", Padded(n=n, pad="g" * 300))
            store.flush(GROWTH_WAIT)
            assert all(thread.is_alive() for thread in threads)  # they read all along
            out, err = reader.communicate(timeout=WAIT)
        finally:
            done.set()
            for thread in threads:
                thread.join(WAIT)
            reader.kill()
            reader.wait()
        assert problems == []
        assert reader.returncode == 0, err
        assert out.split()[-1] == str(target)
        assert store.statistics().resizes >= 3
        assert [e.data.n for e in store.read("shared")] == list(range(target + 1))
