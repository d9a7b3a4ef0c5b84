"""Crash safety: a writer process killed with SIGKILL at random moments never loses an
acknowledged event and never leaves a gap, a duplicate, a reordering or a torn record.

The child (``crash_child.py``) prints ``ack <session> <seq>`` after each flush returns.
The parent kills it after a random number of acknowledgements plus a random tiny
delay, reopens the store read-only, checks every session, and starts the next child,
which must continue the sessions from where the durable log ends.

Every other child compacts its journal after a few records, in rounds of a few steps,
so kills land before, during and after compactions and between the steps of a round
(the journal then still holds records that ``events`` holds too); the others die with
records in the journal, which the read-only check merges and the next child's open
compacts. Half the children write
the runs of sessions with nothing in the journal straight to ``events``. The second
half of each turn is one ``Session.extend``: a kill never leaves part of it.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
import pytest

from storage import Store, check_invariants
from storage.lmdb import writer as writer_module

CHILD = Path(__file__).with_name("crash_child.py")
SESSIONS = 3
DURABILITIES = ("write-ahead", "turn", "none")


@dataclass
class Run:
    loaded: dict[str, int] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)


def run_child_until_killed(
    path: Path, rng: random.Random, durability: str, journal: int | None, direct: int | None
) -> Run:
    """Start a child, kill it after a random number of acks, return what it reported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    threshold = [str(journal or writer_module.JOURNAL_MAX_RECORDS)]
    if direct is not None:
        threshold.append(str(direct))
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(path), str(SESSIONS), durability, *threshold],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None
    run = Run()
    kill_after = rng.randint(SESSIONS, SESSIONS * 12)
    acks = 0
    timer: threading.Timer | None = None
    try:
        for raw in child.stdout:
            if not raw.endswith(b"\n"):
                break  # a line torn by the kill acknowledges nothing
            word, name, seq = raw.decode().split()
            if word == "loaded":
                run.loaded[name] = int(seq)
                continue
            assert int(seq) >= run.acked.get(name, -1), raw
            run.acked[name] = int(seq)
            acks += 1
            if acks == kill_after:
                timer = threading.Timer(rng.uniform(0, 0.004), child.kill)
                timer.start()
    finally:
        if timer is not None:
            timer.join()
        child.kill()
        _, err = child.communicate()
    assert child.returncode == -9, f"the child did not die by SIGKILL: {err.decode()}"
    assert acks >= kill_after, "the child stopped acknowledging before it was killed"
    return run


def check_store(path: Path, run: Run) -> dict[str, int]:
    """Every acknowledged event is there, contiguous and decodable; return last seqs."""
    last: dict[str, int] = {}
    with Store.open(path, readonly=True) as store:
        for index in range(SESSIONS):
            name = f"s{index}"
            events = store.read(name)  # decodes every record: a torn one would raise
            seqs = [event.seq for event in events]
            assert seqs == list(range(len(events))), f"{name}: gap, duplicate or reorder"
            assert store.stats(name).event_count == len(events)
            for event in events:
                if event.type == "assistant/chunk":
                    assert event.data.chunk.text == f"{name}@{event.seq}", "a moved record"
            assert check_invariants(events, allow_open_tail=True) == []
            ending = [event.type for event in events[-2:]]
            torn = ending[-1:] in (["assistant/message"], ["step/end"]) or ending == [
                "assistant/chunk",
                "assistant/chunk",
            ]
            assert not torn, f"{name} ends inside a batch appended at once: {ending}"
            assert len(events) - 1 >= run.acked.get(name, -1), f"{name}: lost an acked event"
            last[name] = len(events) - 1
    return last


def journal_records(path: Path) -> int:
    """How many records the killed child left in the journal (not yet compacted)."""
    env = lmdb.open(str(path), subdir=True, max_dbs=8, readonly=True)
    try:
        with env.begin() as txn:
            return int(txn.stat(env.open_db(b"journal", txn=txn, create=False))["entries"])
    finally:
        env.close()


def crash_campaign(path: Path, kills: int, seed: int) -> None:
    print(f"crash campaign: {kills} kills, seed {seed}")  # shown if the test fails
    rng = random.Random(seed)
    durable: dict[str, int] = {}
    left_in_journal = 0
    for round_number in range(kills):
        journal = rng.randint(2, 40) if round_number % 2 else None
        direct = 1 if round_number % 4 >= 2 else None
        durability = DURABILITIES[round_number % 3]
        run = run_child_until_killed(path, rng, durability, journal, direct)
        left_in_journal += journal_records(path) > 0
        context = f"seed {seed}, round {round_number}"
        expected = {f"s{i}": durable.get(f"s{i}", -1) for i in range(SESSIONS)}
        assert run.loaded == expected, f"the child did not load the durable log ({context})"
        after = check_store(path, run)
        # A kill just after the acknowledgements of what the child loaded may land
        # before its first flush of new events: then it had nothing to continue with.
        flushed = any(seq > run.loaded[name] for name, seq in run.acked.items())
        for name, seq in after.items():
            assert seq > durable.get(name, -1) or not flushed, (
                f"{name} did not continue ({context})"
            )
        durable = after
    assert left_in_journal, "no kill left records in the journal: the merge went untested"


def test_a_killed_writer_loses_no_acknowledged_event_and_the_next_run_continues(
    tmp_path: Path,
) -> None:
    crash_campaign(tmp_path / "store", kills=8, seed=random.randrange(1 << 30))


@pytest.mark.soak
def test_soak_many_kills_lose_no_acknowledged_event(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    kills = int(request.config.getoption("--soak-kills"))
    crash_campaign(tmp_path / "store", kills=kills, seed=random.randrange(1 << 30))
