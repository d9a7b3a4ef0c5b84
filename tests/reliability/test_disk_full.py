"""A full disk, for real: a small tmpfs filled by a store or by a runtime under load,
then space freed, and the runtime carrying on by itself.

Mounting needs root (CI runs as root, see ``.ci/run``); where the mount is refused the
tests that need it skip, saying why. Nothing here needs a mock: the disk is full because
it is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
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


def test_a_runtime_under_load_survives_a_full_disk_and_carries_on_once_freed(
    load_disk: SmallDisk,
) -> None:
    """50 agents in a child process fill the disk; their turns end with a storage error
    (no agent crashes); the ballast is deleted and the same process goes on: flushes are
    acknowledged again. Then it is SIGKILLed and everything acknowledged is checked."""
    path = load_disk.root / "store"
    load_disk.fill(leave=3 << 20)
    seen = {"full": 0, "after": 0}

    def cue(line: str) -> float | None:
        if line.startswith("full "):
            seen["full"] += 1
            if seen["full"] == 5:
                load_disk.free()
        elif line.startswith("ack ") and seen["full"] >= 5:
            seen["after"] += 1
            if seen["after"] == 20:
                return 0.0
        return None

    run = run_until_killed(
        child_command("load", str(path), "--agents", "50", "--seed", "3", "--on-full"), cue
    )
    assert not run.watchdog_fired, run.stderr[-2000:]
    assert seen["full"] >= 5 and seen["after"] >= 20, (seen, run.stderr[-2000:])
    assert "crashed" not in run.stderr, run.stderr[-2000:]
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    figures = Figures()
    reported = parse(run)
    with Store.open(path, readonly=True) as store:
        logs = check_durable(store, reported, figures)
    resume_and_work(path, logs, "after the full disk", figures)
    print(
        f"disk full under load: {figures.acks} acks, {seen['full']} full flushes, "
        f"{figures.acked_events} acknowledged events, {figures.settled} settled turns checked"
    )
    assert figures.acked_events > 0 and figures.settled > 0


def test_storage_error_is_the_base_of_disk_full() -> None:
    assert issubclass(DiskFullError, StorageError)
    err = DiskFullError("no space", 1, 2)
    import pickle

    again = pickle.loads(pickle.dumps(err))
    assert (str(again), again.free, again.needed) == ("no space", 1, 2)
