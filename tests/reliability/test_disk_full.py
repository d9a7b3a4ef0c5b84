"""A full disk, for real: a small tmpfs filled by a store or by a runtime under load,
then space freed, and the runtime carrying on by itself.

Mounting needs root (CI runs as root, see ``.ci/run``); where the mount is refused the
tests that need it skip, saying why. Nothing here needs a mock: the disk is full because
it is.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runtime import DiskFullError, Runtime, ScriptedModel
from storage import StorageError, check_invariants
from storage.lmdb.store import Store
from tests.storage.builders import LogBuilder, completed_turn

from .conftest import child_command, corral, python, run_until_killed
from .test_crash_under_load import Figures, check_durable, parse, resume_and_work

WAIT = 30.0


class SmallDisk:
    """A mounted tmpfs of ``size`` bytes, and a ballast file that fills it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ballast = root / "ballast"

    def fill(self, leave: int = 0) -> None:
        """Write ballast until ``leave`` bytes (or fewer) are free."""
        stat = os.statvfs(self.root)
        free = stat.f_bavail * stat.f_frsize
        with self.ballast.open("ab") as out:
            chunk = b"\0" * (64 << 10)
            while free > leave:
                try:
                    out.write(chunk[: min(len(chunk), free - leave)])
                    out.flush()
                except OSError:
                    break
                stat = os.statvfs(self.root)
                free = stat.f_bavail * stat.f_frsize

    def free(self) -> None:
        self.ballast.unlink()

    def free_bytes(self) -> int:
        stat = os.statvfs(self.root)
        return stat.f_bavail * stat.f_frsize


def _mount(where: Path, size: str) -> str | None:
    """Mount a tmpfs; the reason it cannot be, or None."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (CI runs as root)"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return f"mount -t tmpfs was refused here: {done.stderr.strip()}"
    return None


def _small_disk(tmp_path: Path, size: str) -> Iterator[SmallDisk]:
    where = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    reason = _mount(where, size)
    if reason is not None:
        pytest.skip(reason)
    try:
        yield SmallDisk(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    yield from _small_disk(tmp_path, "4m")


@pytest.fixture
def load_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    yield from _small_disk(tmp_path, "8m")


# ----------------------------------------------------------------- opening a full disk


def test_a_store_created_on_a_full_disk_raises_disk_full_and_the_process_lives(
    disk: SmallDisk,
) -> None:
    disk.fill()
    code = (
        "import sys\nfrom storage import Store, DiskFullError\n"
        "try:\n    Store.open(sys.argv[1])\n"
        "except DiskFullError as err:\n    print('full', err.free, err.needed)\n"
    )
    done = python(code, disk.root / "store")
    assert done.returncode == 0, f"died of signal {-done.returncode}: {done.stderr}"
    word, free, needed = done.stdout.split()
    assert word == "full" and int(free) < int(needed)
    disk.free()
    with Store.open(disk.root / "store") as store:  # the space is back: a store it is
        store.create_session("a").flush()
    with Store.open(disk.root / "store", readonly=True) as store:
        assert store.has_session("a")


def test_corral_bench_on_a_full_disk_exits_with_a_message_not_a_bus_error(
    disk: SmallDisk,
) -> None:
    disk.fill()
    done = corral("bench", "--agents", "2", "--turns", "1", "--store", disk.root / "s")
    assert done.returncode not in (-signal.SIGBUS, 128 + signal.SIGBUS), done.stderr
    assert done.returncode != 0
    assert "no space left" in done.stderr, done.stderr


def test_a_read_only_open_without_lock_file_on_a_full_disk_is_refused_typed(
    disk: SmallDisk,
) -> None:
    with Store.open(disk.root / "store") as store:
        LogBuilder(store.create_session("a"))
    (disk.root / "store" / "lock.mdb").unlink()
    disk.fill()
    code = (
        "import sys\nfrom storage import Store, DiskFullError\n"
        "try:\n    Store.open(sys.argv[1], readonly=True)\n"
        "except DiskFullError:\n    print('full')\n"
    )
    done = python(code, disk.root / "store")
    assert done.returncode == 0, f"died of signal {-done.returncode}: {done.stderr}"
    assert done.stdout.split() == ["full"]


def test_a_fifo_in_place_of_data_mdb_is_refused_at_once(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    os.mkfifo(store / "data.mdb")
    code = (
        "import sys\nfrom runtime import Runtime\nfrom storage import StorageError\n"
        "try:\n    Runtime.open(sys.argv[1])\n"
        "except StorageError as err:\n    print(err)\n"
    )
    done = python(code, store, timeout=30)
    assert "is not a regular file" in done.stdout, done
    listed = corral("log", "ls", "--store", store, timeout=30)
    assert listed.returncode != 0 and "is not a regular file" in listed.stderr


# ----------------------------------------------------------------- filling, freeing


def test_a_store_holds_appends_while_full_and_writes_them_once_space_is_freed(
    disk: SmallDisk,
) -> None:
    with Store.open(disk.root / "store") as store:
        session = store.create_session("a")
        log = LogBuilder(session)
        session.flush()
        disk.fill(leave=256 << 10)
        acknowledged = -1
        full: DiskFullError | None = None
        while full is None:
            completed_turn(log)
            try:
                session.flush()
                acknowledged = session.last_seq
            except DiskFullError as err:
                full = err
        assert "no space left" in str(full) and full.needed > 0
        completed_turn(log)  # appending goes on: held in memory
        with pytest.raises(DiskFullError):
            session.flush()
        held = session.last_seq
        assert held > acknowledged
        disk.free()
        session.flush()  # the held records fit now: written, in order
        assert store.statistics().events_written >= held + 1
    with Store.open(disk.root / "store", readonly=True) as store:
        events = store.read("a")
        assert [e.seq for e in events] == list(range(held + 1))
        assert check_invariants(events) == []


def test_closing_while_the_disk_is_full_says_what_was_not_written_and_loses_nothing_acked(
    disk: SmallDisk,
) -> None:
    store = Store.open(disk.root / "store")
    session = store.create_session("a")
    log = LogBuilder(session)
    session.flush()
    disk.fill(leave=256 << 10)
    acknowledged = -1
    while True:
        completed_turn(log)
        try:
            session.flush()
        except DiskFullError:
            break
        acknowledged = session.last_seq
    with pytest.raises(DiskFullError, match="what no flush acknowledged was not written"):
        store.close()
    disk.free()
    with Store.open(disk.root / "store") as again:
        events = again.read("a")
    assert len(events) >= acknowledged + 1
    assert [e.seq for e in events] == list(range(len(events)))
    assert check_invariants(events, allow_open_tail=True) == []


def test_a_turn_that_meets_a_full_disk_ends_error_and_the_runtime_carries_on_when_freed(
    disk: SmallDisk,
) -> None:
    with Runtime.open(disk.root / "store") as rt:
        agent = rt.spawn(model=ScriptedModel.echo(), session_id="a")
        errors: list[str] = []
        rt.on("agent/error", lambda event: errors.append(event.error.message))
        agent.followup("first")
        assert agent.wait_idle(WAIT)
        disk.fill(leave=64 << 10)
        turns = 0
        while not errors:  # each turn writes a few KiB: the disk fills within a few
            agent.followup("x" * 2000)
            assert agent.wait_idle(WAIT)
            turns += 1
            assert turns < 200, "the disk never filled"
        assert "could not be made durable" in errors[0] and "no space left" in errors[0]
        assert agent.crash is None and agent.status == "idle"
        with pytest.raises(DiskFullError, match="a send is refused and nothing was logged"):
            agent.followup("refused")
        disk.free()
        rt.flush()  # the held facts fit now
        assert rt.store.disk_full is None
        agent.followup("after")
        assert agent.wait_idle(WAIT)
        last = agent.session.events()[-1]
        assert last.type == "turn/end" and last.data.reason.kind == "completed"
    with Store.open(disk.root / "store", readonly=True) as store:
        events = store.read("a")
    assert check_invariants(events) == []
    ends = [e.data.reason.kind for e in events if e.type == "turn/end"]
    # Every turn is there, the one the full disk met too (ended error at its write-ahead
    # flush, or completed and held at its settle flush: its turn/end written once freed).
    assert len(ends) == turns + 2 and ends[-1] == "completed"
    assert set(ends) <= {"completed", "error"}
    texts = [e.data.message.content[0].text for e in events if e.type == "user/message"]
    assert "refused" not in texts and texts[-1] == "after"


def test_reopening_a_full_disk_store_after_a_crash_fits_in_the_space_there_is(
    disk: SmallDisk,
) -> None:
    """A crash leaves a journal; compacting it at open would need about its size again.
    The open keeps it instead, and does not spend the freed space on a doomed attempt."""
    code = (
        "import os, signal, sys\nfrom storage import Store\n"
        "from tests.storage.builders import LogBuilder, completed_turn\n"
        "store = Store.open(sys.argv[1])\nlog = LogBuilder(store.create_session('a'))\n"
        "for _ in range(400):\n    completed_turn(log)\n    store.flush()\n"
        "print(log.session.last_seq, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = python(code, disk.root / "store")
    assert done.returncode == -signal.SIGKILL, done.stderr
    acknowledged = int(done.stdout.split()[0])
    disk.fill(leave=96 << 10)
    before = disk.free_bytes()
    with Runtime.open(disk.root / "store") as rt:
        assert rt.store.stats("a").last_seq == acknowledged
        assert disk.free_bytes() >= before - (64 << 10), "the open spent the free space"
        agent = rt.resume("a", model=ScriptedModel.echo())
        agent.followup("still here")
        assert agent.wait_idle(WAIT)
        rt.flush()
        last = agent.session.last_seq
    disk.free()
    with Store.open(disk.root / "store") as store:  # room now: the journal is compacted
        events = store.read("a")
    assert [e.seq for e in events] == list(range(last + 1))
    assert events[-1].type == "turn/end" and events[-1].data.reason.kind == "completed"
    assert check_invariants(events) == []


@dataclass
class DiskFigures:
    """What a disk-full campaign checked; printed at its end."""

    trials: int = 0
    freed_live: int = 0  # trials where the space came back under the running child
    freed_after_kill: int = 0  # ... after a SIGKILL while full, before the reopen
    full_flushes: int = 0
    acks_after_free: int = 0
    crash: Figures = field(default_factory=Figures)

    def report(self) -> str:
        c = self.crash
        return (
            f"disk full under load: {self.trials} trials ({self.freed_live} freed under the "
            f"running runtime, {self.freed_after_kill} freed after a SIGKILL while full); "
            f"{self.full_flushes} flushes refused DiskFullError; {c.acks} flush "
            f"acknowledgements ({self.acks_after_free} after the space came back) covering "
            f"{c.acked_events} events and {c.acked_sends} followups; {c.settled} settled "
            f"turns and {c.events_checked} durable events checked: nothing acknowledged "
            f"lost; {c.resumed_turns} turns by resumed agents"
        )


def fill_once(disk: SmallDisk, rng: random.Random, figures: DiskFigures, *, live: bool) -> None:
    """One trial: 50 agents in a child fill the disk (3 MiB left, behind a 1-4 MiB
    ballast and a large one); at the 5th refused flush the small ballast goes, either
    under the running child (``live``: it must carry on by itself, 20 acknowledgements)
    or after a SIGKILL while full (the reopen must fit in the 1-4 MiB freed)."""
    for entry in disk.root.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    small = disk.root / "small-ballast"
    small.write_bytes(b"\0" * rng.randint(1 << 20, 4 << 20))
    disk.fill(leave=3 << 20)
    path = disk.root / "store"
    seen = {"full": 0, "after": 0}

    def cue(line: str) -> float | None:
        if line.startswith("full "):
            seen["full"] += 1
            if seen["full"] == 5:
                if not live:
                    return 0.0
                small.unlink()
        elif line.startswith("ack ") and live and seen["full"] >= 5:
            seen["after"] += 1
            if seen["after"] == 20:
                return rng.uniform(0.0, 0.01)
        return None

    seed = str(rng.randrange(1 << 30))
    run = run_until_killed(
        child_command("load", str(path), "--agents", "50", "--seed", seed, "--on-full"), cue
    )
    assert not run.watchdog_fired, run.stderr[-2000:]
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    assert seen["full"] >= 5, (seen, run.stderr[-2000:])
    assert "crashed" not in run.stderr, run.stderr[-2000:]  # no agent died of the disk
    if live:
        assert seen["after"] >= 20, seen
        disk.free()  # the large ballast too: the resumed agents' turns need room
        figures.freed_live += 1
    else:
        small.unlink()
        figures.freed_after_kill += 1
    reported = parse(run)
    with Store.open(path, readonly=True) as store:
        logs = check_durable(store, reported, figures.crash)
    resume_and_work(path, logs, f"after full disk {figures.trials}", figures.crash)
    figures.trials += 1
    figures.full_flushes += seen["full"]
    figures.acks_after_free += seen["after"]


def test_a_runtime_under_load_survives_a_full_disk_and_carries_on_once_freed(
    load_disk: SmallDisk, rng: random.Random
) -> None:
    """No agent crashes while the disk is full; freed under the running runtime, the same
    process goes on (flushes acknowledged again); freed after a SIGKILL while full, the
    reopen works in the room there is. Everything acknowledged is checked with the
    SIGKILL harness's checkers (test_crash_under_load)."""
    figures = DiskFigures()
    fill_once(load_disk, rng, figures, live=True)
    fill_once(load_disk, rng, figures, live=False)
    print(figures.report())
    assert figures.crash.acked_events > 0 and figures.crash.settled > 0


@pytest.mark.soak
@pytest.mark.timeout(6 * 3600)
def test_soak_disk_full_under_load(
    load_disk: SmallDisk,
    rng: random.Random,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    trials = max(2, int(request.config.getoption("--soak-kills")) // 10)
    figures = DiskFigures()
    start = time.perf_counter()
    for index in range(trials):
        fill_once(load_disk, rng, figures, live=index % 2 == 0)
    with capsys.disabled():
        print(f"\n{figures.report()} ({time.perf_counter() - start:.0f} s)")
    assert figures.trials == trials


def test_storage_error_is_the_base_of_disk_full() -> None:
    assert issubclass(DiskFullError, StorageError)
    err = DiskFullError("no space", 1, 2)
    import pickle

    again = pickle.loads(pickle.dumps(err))
    assert (str(again), again.free, again.needed) == ("no space", 1, 2)
