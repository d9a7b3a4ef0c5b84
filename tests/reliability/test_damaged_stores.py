"""Damaged stores: unknown event types written with raw LMDB, a truncated or bit-flipped
``data.mdb``, a future schema version, a writer lock held by another process: each is
refused with one clear message (for the damaged session only, where it can be), never a
crash. Whatever might kill the process (LMDB reads pages through a memory map) runs in a
child interpreter."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest

from runtime import (
    Runtime,
    ScriptedModel,
)
from storage import (
    SchemaVersionError,
    StorageError,
    Store,
    UnknownEventTypeError,
)
from storage.lmdb import layout as layout_module
from storage.lmdb.layout import SCHEMA_VERSION, decode_row, encode_row, event_key

from .conftest import FAST_RETRY, WAIT, check_whole_store, corral, one_error_line, python

# --------------------------------------------------------------------------- damaged stores


def build_store(path: Path, pad: int = 40) -> dict[str, list[Any]]:
    """Two sessions with enough text to span several LMDB pages; returns their events."""
    with Runtime.open(path, retry_policy=FAST_RETRY) as rt:
        for name in ("victim", "bystander"):
            agent = rt.spawn(model=ScriptedModel.echo(), session_id=name)
            for turn in range(pad):
                agent.followup(f"{name}-marker-{turn:03d} " + "padding " * 40)
            assert agent.wait_idle(WAIT)
    with Store.open(path, readonly=True) as store:
        return {h.id: store.read(h.id) for h in store.sessions()}


def raw_append(path: Path, session_id: str, record: dict[str, Any]) -> int:
    """Append ``record`` to a session with raw LMDB writes; returns its seq."""
    env = lmdb.open(str(path), subdir=True, max_dbs=8)
    try:
        events, sessions = env.open_db(b"events"), env.open_db(b"sessions")
        with env.begin(write=True) as txn:
            raw = txn.get(session_id.encode(), db=sessions)
            row = decode_row(raw)
            seq = row.last_seq + 1
            body = json.dumps({**record, "seq": seq}, separators=(",", ":")).encode()
            txn.put(event_key(row.header.key, seq), body, db=events)
            txn.put(session_id.encode(), encode_row(raw[8:], seq), db=sessions)
    finally:
        env.close()
    return seq


def test_an_unknown_event_type_in_a_store_is_a_clear_error_for_its_session_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    build_store(path, pad=3)
    seq = raw_append(path, "victim", {"type": "alien/thing", "time": 1, "data": {}})
    with Runtime.open(path) as rt:
        with pytest.raises(UnknownEventTypeError, match=rf"alien/thing.*|seq {seq}"):
            rt.resume("victim", model=ScriptedModel.echo())
        agent = rt.resume("bystander", model=ScriptedModel.echo())
        agent.followup("business as usual")
        assert agent.wait_idle(WAIT)
    assert "alien/thing" in one_error_line(corral("log", "show", "--store", path, "victim"))


def test_an_unknown_ignorable_event_is_skipped_and_the_session_resumes_after_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    build_store(path, pad=3)
    alien = {"type": "alien/note", "time": 1, "data": {"x": 1}, "ignorable": True}
    seq = raw_append(path, "victim", alien)
    with Runtime.open(path) as rt:
        agent = rt.resume("victim", model=ScriptedModel.echo())
        agent.followup("and on")
        assert agent.wait_idle(WAIT)
        assert agent.session.events()[-1].seq > seq
    with Store.open(path) as store:
        store.register_event_type("alien/note", ignorable=True)
        seqs = [e.seq for e in store.read("victim")]
        assert seqs == list(range(len(seqs))) and seq in seqs


OPEN_AND_READ = r"""
import json, sys
from runtime import Runtime
from storage import Store
out = {}
try:
    with Store.open(sys.argv[1]) as store:
        for header in store.sessions():
            try:
                out[header.id] = len(store.read(header.id))
            except Exception as err:
                out[header.id] = f"{type(err).__module__}.{type(err).__name__}: {err}"
except Exception as err:
    out["open"] = f"{type(err).__module__}.{type(err).__name__}: {err}"
print(json.dumps(out))
"""


def open_in_child(path: Path) -> dict[str, Any]:
    """Open and read every session in a fresh interpreter: a crash shows as a signal."""
    done = python(OPEN_AND_READ, path)
    assert done.returncode == 0, f"the reader died ({done.returncode}): {done.stderr[-2000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("keep", [0.75, 0.5, 0.1, 8191])
def test_a_truncated_store_file_is_refused_with_a_clear_error_not_a_crash(
    tmp_path: Path, keep: float
) -> None:
    path = tmp_path / "store"
    build_store(path)
    size = (path / "data.mdb").stat().st_size
    os.truncate(path / "data.mdb", int(size * keep) if keep < 1 else int(keep))
    found = open_in_child(path)
    assert list(found) == ["open"], found
    assert found["open"].startswith("storage.errors.LogCorruptError: "), found
    assert "truncated" in found["open"]
    line = one_error_line(corral("log", "ls", "--store", path))
    assert "truncated" in line


def compact_copy(path: Path, to: Path) -> bytes:
    """A compacted copy (only live pages) of the store; returns its data file."""
    to.mkdir(mode=0o700)
    env = lmdb.open(str(path), subdir=True, max_dbs=8, readonly=True)
    try:
        env.copy(str(to), compact=True)
    finally:
        env.close()
    return (to / "data.mdb").read_bytes()


def test_a_record_with_flipped_bytes_is_a_clear_error_for_its_session_only(
    tmp_path: Path,
) -> None:
    built = build_store(tmp_path / "built")
    path = tmp_path / "store"
    data = bytearray(compact_copy(tmp_path / "built", path))
    hits = [m.start() for m in re.finditer(rb"victim-marker-007", data)]
    assert hits
    for offset in hits:
        data[offset] = 0xFF  # not UTF-8: the record no longer decodes
    (path / "data.mdb").write_bytes(data)
    found = open_in_child(path)
    assert found["bystander"] == len(built["bystander"]), found
    assert found["victim"].startswith("storage.errors.LogCorruptError: "), found
    assert "victim" in found["victim"]


def damage_pages(tmp_path: Path, marker: bytes) -> tuple[Path, dict[str, list[Any]]]:
    """A compacted store whose pages holding ``marker`` have invalid page flags.

    A branch or leaf page that holds ``marker`` only in its free space (stale bytes of
    a page it reuses) is left alone: the damage hits where the record lives."""
    built = build_store(tmp_path / "built")
    path = tmp_path / "store"
    data = bytearray(compact_copy(tmp_path / "built", path))
    pages = set()
    for found in re.finditer(marker, data):
        page, offset = divmod(found.start(), 4096)
        flags, lower, upper = struct.unpack_from("<HHH", data, page * 4096 + 10)
        if flags in (0x01, 0x02) and lower <= offset < upper:  # P_BRANCH, P_LEAF: free space
            continue
        pages.add(page)
    assert pages
    for page in pages:
        data[page * 4096 + 10 : page * 4096 + 12] = (0x40).to_bytes(2, "little")  # bad flags
    (path / "data.mdb").write_bytes(data)
    return path, built


@pytest.fixture
def record_per_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Store one record per ``events`` value (blocks of one), as versions 1 and 2 did:
    records then sit in the B-tree's leaf pages, not in a block's overflow pages."""
    monkeypatch.setattr(layout_module, "BLOCK_RECORDS", 1)


@pytest.mark.parametrize("layout", ["blocks", "record-per-value"])
def test_a_damaged_page_a_read_starts_on_is_a_clear_error_for_its_session_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    if layout == "record-per-value":
        monkeypatch.setattr(layout_module, "BLOCK_RECORDS", 1)  # records in leaf pages
    path, built = damage_pages(tmp_path, rb"victim-marker-000")  # the session's first page
    found = open_in_child(path)
    assert found["bystander"] == len(built["bystander"]), found
    assert found["victim"].startswith("storage.errors.LogCorruptError: "), found
    assert "damaged" in found["victim"]


@pytest.mark.xfail(
    strict=True,
    reason="known limit: LMDB asserts (SIGABRT) instead of returning MDB_CORRUPTED when a "
    "cursor steps onto a damaged page mid-iteration; LMDB pages carry no checksum",
)
def test_a_damaged_btree_page_met_mid_iteration_is_a_clear_error(
    tmp_path: Path, record_per_value: None
) -> None:
    """Records in leaf pages (one per value). In blocks, a session's records sit in the
    blocks' overflow pages, which LMDB checks when it reads a value (the test above)."""
    path, _ = damage_pages(tmp_path, rb"victim-marker-020")
    found = open_in_child(path)
    assert found["victim"].startswith("storage.errors.LogCorruptError: "), found


@pytest.mark.soak
@pytest.mark.timeout(6 * 3600)
def test_soak_random_bit_flips_never_kill_a_reader_with_sigbus_or_sigsegv(
    tmp_path: Path,
    rng: random.Random,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    built = build_store(tmp_path / "built")
    counts = {session_id: len(events) for session_id, events in built.items()}
    original = (tmp_path / "built" / "data.mdb").read_bytes()
    tally: dict[str, int] = {}
    for trial in range(int(request.config.getoption("--soak-kills"))):
        path = tmp_path / f"flip-{trial}"
        shutil.copytree(tmp_path / "built", path)
        data = bytearray(original)
        for _ in range(rng.choice([1, 3, 10])):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        (path / "data.mdb").write_bytes(data)
        done = python(OPEN_AND_READ, path)
        if done.returncode != 0:
            outcome = f"signal {-done.returncode}" if done.returncode < 0 else "exit"
        else:
            found = json.loads(done.stdout.strip().splitlines()[-1])
            kinds = {v.split(":")[0] for v in found.values() if isinstance(v, str)}
            if kinds:
                outcome = ", ".join(sorted(kinds))
            elif found == counts:
                outcome = "read fine, every event"
            else:
                outcome = "read without error, but events or sessions missing"
        tally[outcome] = tally.get(outcome, 0) + 1
        shutil.rmtree(path)
    with capsys.disabled():
        print(f"\nrandom bit flips ({sum(tally.values())} stores): {tally}")
    assert not any(k in tally for k in ("signal 7", "signal 11")), tally
    assert "exit" not in tally, tally
    errors = {
        kind
        for outcome in tally
        if not outcome.startswith(("read ", "signal "))
        for kind in outcome.split(", ")
    }
    assert all(kind.startswith("storage.errors.") for kind in errors), tally  # typed


def set_schema_version(path: Path, version: bytes) -> None:
    env = lmdb.open(str(path), subdir=True, max_dbs=8)
    try:
        meta = env.open_db(b"meta")
        with env.begin(write=True) as txn:
            txn.put(b"schema_version", version, db=meta)
    finally:
        env.close()


def test_a_store_of_a_future_schema_version_is_refused_with_one_clear_message(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    before = build_store(path, pad=2)
    future = SCHEMA_VERSION + 1
    set_schema_version(path, str(future).encode())
    for opener in (
        lambda: Store.open(path),
        lambda: Store.open(path, readonly=True),
        lambda: Runtime.open(path),
    ):
        # What it found and what this corral supports (the one test of this refusal).
        refusal = rf"schema version {future}.*supports version {SCHEMA_VERSION}"
        with pytest.raises(SchemaVersionError, match=refusal):
            opener()
    assert f"schema version {future}" in one_error_line(corral("log", "ls", "--store", path))
    set_schema_version(path, str(SCHEMA_VERSION).encode())  # the refusals changed nothing
    with Store.open(path, readonly=True) as store:
        assert {h.id: store.read(h.id) for h in store.sessions()} == before


HOLD_LOCK = r"""
import sys
from storage import Store
store = Store.open(sys.argv[1])
print("locked", flush=True)
sys.stdin.readline()
store.close()
"""


def test_a_store_locked_by_another_process_is_refused_for_writing_and_readable_meanwhile(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    before = build_store(path, pad=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"
        for opener in (lambda: Store.open(path), lambda: Runtime.open(path)):
            match = f"already open for writing by process {holder.pid}"
            with pytest.raises(StorageError, match=match):
                opener()
        with Store.open(path, readonly=True) as store:
            assert {h.id: store.read(h.id) for h in store.sessions()} == before
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(WAIT) == 0
    with Runtime.open(path) as rt:  # the lock went with the process
        agent = rt.resume("victim", model=ScriptedModel.echo())
        agent.followup("mine now")
        assert agent.wait_idle(WAIT)
    check_whole_store(path)
