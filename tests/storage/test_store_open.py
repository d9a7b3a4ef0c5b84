"""Opening a store: schema versions and their upgrades, paths that are not a store, the
writer lock, a closed store, Ctrl-C in an open or a close, read-only and durability."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import lmdb
import pytest

from storage import (
    LogCorruptError,
    StorageError,
    Store,
    StoreClosedError,
)
from storage.events import MessageTrigger, TurnStart
from storage.lmdb import env as lmdb_env_module
from storage.lmdb import writer as writer_module
from storage.lmdb.layout import (
    SCHEMA_VERSION,
    decode_row,
    encode_frame,
    encode_row,
    encode_u64,
    event_key,
)
from storage.lmdb.reads import event_records
from tests.storage.store_rig import store, two_turns

__all__ = ["store"]  # the fixture, used by name


# --------------------------------------------------------------------------- opening


def test_a_version_1_store_is_upgraded_by_a_writable_open(tmp_path: Path) -> None:
    """Version 1 has no journal: a writable open adds it, a read-only one reads the store
    as it is."""
    with Store.open(tmp_path / "s") as store:
        log = two_turns(store)
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8)
    with env.begin(write=True) as txn:  # make it exactly what corral 1 wrote
        txn.drop(env.open_db(b"journal", txn=txn), delete=True)
        txn.put(b"schema_version", b"1", db=env.open_db(b"meta", txn=txn))
    env.close()
    with Store.open(tmp_path / "s", readonly=True) as store:  # read as it is
        assert store.read("agent-1") == log.events
    with Store.open(tmp_path / "s") as store:
        assert store.read("agent-1") == log.events
        store.open_session("agent-1").append(
            "turn/start", TurnStart(turn=3, trigger=MessageTrigger())
        )
    with Store.open(tmp_path / "s", readonly=True) as store:
        assert store.read("agent-1")[:-1] == log.events
        assert store.stats("agent-1").event_count == len(log.events) + 1
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8, readonly=True)
    with env.begin() as txn:
        assert txn.get(b"schema_version", db=env.open_db(b"meta", txn=txn)) == str(
            SCHEMA_VERSION
        ).encode("ascii")
        assert env.open_db(b"journal", txn=txn, create=False) is not None
    env.close()


def test_a_version_2_store_is_read_as_it_is_and_upgraded_by_a_writable_open(
    tmp_path: Path,
) -> None:
    """Version 2 journals one record per value: a read-only open reads such a journal
    (a crash left it), a writable open compacts it and stamps the current version."""
    path = tmp_path / "s"
    with Store.open(path) as store:
        log = two_turns(store)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:  # as corral 2 wrote it: one record per value,
        # the last 3 in the journal (a crash left them there)
        events, sessions = env.open_db(b"events", txn=txn), env.open_db(b"sessions", txn=txn)
        raw = txn.get(b"agent-1", db=sessions)
        row = decode_row(raw)
        records = list(event_records(txn, events))
        assert len(records) == row.last_seq + 1 == len(log.events)
        txn.drop(events, delete=False)
        for key, value in records[:-3]:
            txn.put(key, value, db=events)
        for counter, (key, value) in enumerate(records[-3:]):
            txn.put(encode_u64(counter), key + value, db=env.open_db(b"journal", txn=txn))
        txn.put(b"agent-1", encode_row(raw[8:], row.last_seq - 3), db=sessions)
        txn.put(b"schema_version", b"2", db=env.open_db(b"meta", txn=txn))
    env.close()
    with Store.open(path, readonly=True) as store:  # read as it is
        assert store.read("agent-1") == log.events
        assert store.read("agent-1", lower=len(log.events) - 2) == log.events[-2:]
    with Store.open(path) as store:  # compacted at open: this process reads no journal
        assert store.read("agent-1") == log.events
        store.open_session("agent-1").append(
            "turn/start", TurnStart(turn=3, trigger=MessageTrigger())
        )
    with Store.open(path, readonly=True) as store:
        assert store.read("agent-1")[:-1] == log.events
        assert store.stats("agent-1").event_count == len(log.events) + 1
    env = lmdb.open(str(path), max_dbs=8, readonly=True)
    with env.begin() as txn:
        assert txn.get(b"schema_version", db=env.open_db(b"meta", txn=txn)) == str(
            SCHEMA_VERSION
        ).encode("ascii")
    env.close()


def test_a_version_3_store_with_records_in_its_journal_is_read_and_upgraded(
    tmp_path: Path,
) -> None:
    """Version 3 is version 4 without compaction rounds (its journal never holds a copy
    of a compacted record): both opens read it as it is, a writable one stamps 4."""
    path = tmp_path / "s"
    with Store.open(path) as store:
        log = two_turns(store)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:  # as corral 3 left it: the last 3 in a frame
        events, sessions = env.open_db(b"events", txn=txn), env.open_db(b"sessions", txn=txn)
        raw = txn.get(b"agent-1", db=sessions)
        row = decode_row(raw)
        records = [value for _, value in event_records(txn, events)]
        txn.drop(events, delete=False)
        for seq, value in enumerate(records[:-3]):
            txn.put(event_key(row.header.key, seq), value, db=events)
        frame = encode_frame([(row.header.key, row.last_seq - 2, records[-3:])])
        txn.put(encode_u64(0), frame, db=env.open_db(b"journal", txn=txn))
        txn.put(b"agent-1", encode_row(raw[8:], row.last_seq - 3), db=sessions)
        txn.put(b"schema_version", b"3", db=env.open_db(b"meta", txn=txn))
    env.close()
    with Store.open(path, readonly=True) as store:
        assert store.read("agent-1") == log.events
    with Store.open(path) as store:
        assert store.read("agent-1") == log.events
    env = lmdb.open(str(path), max_dbs=8, readonly=True)
    with env.begin() as txn:
        assert txn.get(b"schema_version", db=env.open_db(b"meta", txn=txn)) == b"4"
        assert txn.stat(env.open_db(b"journal", txn=txn, create=False))["entries"] == 0
    env.close()


def test_a_damaged_journal_frame_is_refused_by_readers_and_by_a_writable_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s"
    with Store.open(path) as store:
        two_turns(store)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(encode_u64(0), b"\xc1 not msgpack", db=env.open_db(b"journal", txn=txn))
    env.close()
    with (
        Store.open(path, readonly=True) as store,
        pytest.raises(LogCorruptError, match="journal frame cannot be read"),
    ):
        store.read("agent-1")
    with pytest.raises(LogCorruptError, match="journal frame cannot be read"):
        Store.open(path)


@pytest.mark.parametrize(
    "kind", ["file", "other-files", "foreign-lmdb", "garbage-data-file", "missing-readonly"]
)
def test_a_path_that_is_not_a_store_is_refused_with_a_clear_error(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "p"
    readonly = False
    if kind == "file":
        path.write_text("hello")
    elif kind == "other-files":
        path.mkdir()
        (path / "notes.txt").write_text("mine")
    elif kind == "foreign-lmdb":
        env = lmdb.open(str(path))
        with env.begin(write=True) as txn:
            txn.put(b"k", b"v")
        env.close()
    elif kind == "garbage-data-file":
        path.mkdir()
        (path / "data.mdb").write_bytes(b"not an lmdb file" * 1000)
    else:
        readonly = True
    with pytest.raises(StorageError, match=r"not a|no corral store|cannot open"):
        Store.open(path, readonly=readonly)
    if kind == "other-files":
        assert sorted(p.name for p in path.iterdir()) == ["notes.txt"]


def _open_as_unprivileged_user(path: Path) -> str:
    """Open the store in a forked child that dropped root (root reads any directory);
    returns the child's error message, or "opened"."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        try:
            os.setgid(65534)
            os.setuid(65534)
            Store.open(path).close()
            message = "opened"
        except StorageError as err:
            message = f"StorageError: {err}"
        except BaseException as err:
            message = f"{type(err).__name__}: {err}"
        os.write(write_end, message.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message


def test_an_unreadable_directory_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "locked"
    Store.open(path).close()
    tmp_path.chmod(0o755)
    path.chmod(0)
    try:
        if os.geteuid() == 0:
            message = _open_as_unprivileged_user(path)
            assert message.startswith("StorageError:"), message
            assert "locked" in message
        else:
            with pytest.raises(StorageError, match="locked"):
                Store.open(path)
    finally:
        path.chmod(0o700)


def test_a_second_writer_on_the_same_directory_is_refused(store: Store) -> None:
    with pytest.raises(StorageError, match="already open for writing by this process"):
        Store.open(store.path)


def test_a_readonly_open_of_a_missing_store_says_how_a_store_is_made(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="a store is made by its first writable open"):
        Store.open(tmp_path / "nothing", readonly=True)


def test_a_closed_store_refuses_every_call_and_its_sessions_refuse_appends(
    tmp_path: Path,
) -> None:
    store = Store.open(tmp_path / "s")
    session = store.create_session("a")
    store.close()
    store.close()  # idempotent
    for call in (
        lambda: store.read("a"),
        lambda: store.create_session("b"),
        lambda: store.open_session("a"),
        store.flush,
        store.statistics,
    ):
        with pytest.raises(StoreClosedError, match=r"is closed(:|;) open it again"):
            call()
    with pytest.raises(StoreClosedError, match=r"is closed(:|;) open it again"):
        session.append("turn/start", TurnStart(turn=1, trigger=MessageTrigger()))
    assert session.last_seq == -1


@pytest.mark.parametrize("where", ["flush", "writer close", "env close"])
def test_a_close_interrupted_by_ctrl_c_is_finished_by_the_next_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # Before, close() marked the store closed before it waited for the last flush: a
    # Ctrl-C in that wait (or in the wait for the writer thread, or between closing
    # the environment and its unlock) left the writer thread, the environment and the
    # writer lock held for the rest of the process, and a second close() returned at
    # once ("already open for writing by this process" on every later open).
    store = Store.open(tmp_path / "s")
    log = two_turns(store)
    targets = {
        "flush": (writer_module.LogWriter, "flush"),
        "writer close": (writer_module.LogWriter, "close"),
        "env close": (lmdb_env_module.LmdbEnv, "_unlock"),
    }
    owner, name = targets[where]
    original = getattr(owner, name)
    calls = []

    def interrupted(self: object, *args: object) -> None:
        calls.append(name)
        if len(calls) == 1:
            original(self, *args)  # it did its work (the flush, the close) ...
            raise KeyboardInterrupt  # ... and the Ctrl-C lands as it returns
        original(self, *args)

    monkeypatch.setattr(owner, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.close()
    with pytest.raises(
        StoreClosedError, match=r"is closed(:|;) open it again"
    ):  # closed from the first close on
        store.flush()
    store.close()  # finishes letting go
    assert len(calls) == 2
    assert store._writer is not None and not store._writer._thread.is_alive()
    store.close()  # and is then done
    with Store.open(tmp_path / "s") as again:  # the writer lock was let go of
        assert again.read("agent-1") == log.events


@pytest.mark.parametrize(
    "left", ["no databases", "empty corral databases", "lock files only", "writer.lock only"]
)
def test_a_first_open_that_never_ended_is_made_anew_by_the_next(tmp_path: Path, left: str) -> None:
    # Before, a Ctrl-C or a kill during the first open of a directory left data.mdb
    # (or the lock files alone) before the schema version was committed, and every
    # later open, in any process, refused the directory: "holds an LMDB environment
    # that is not a corral store (it has no schema version)", or "it holds other files
    # and no data.mdb".
    path = tmp_path / "s"
    if left.endswith("only"):
        path.mkdir()
        (path / "writer.lock").write_text("123\n")
        if left == "lock files only":
            (path / "lock.mdb").write_bytes(b"")
    else:
        env = lmdb.open(str(path), max_dbs=8)
        if left == "empty corral databases":
            for name in (b"meta", b"events", b"sessions"):
                env.open_db(name)
        env.close()
    with Store.open(path) as store:
        log = two_turns(store)
    with Store.open(path) as store:
        assert store.read("agent-1") == log.events


@pytest.mark.parametrize("holds", ["a record of its own", "another database", "a corral record"])
def test_an_lmdb_environment_holding_data_but_no_schema_version_is_still_refused(
    tmp_path: Path, holds: str
) -> None:
    path = tmp_path / "s"
    env = lmdb.open(str(path), max_dbs=8)
    if holds == "a record of its own":
        with env.begin(write=True) as txn:
            txn.put(b"key", b"value")
    elif holds == "another database":
        env.open_db(b"theirs")
    else:
        events = env.open_db(b"events")
        with env.begin(write=True, db=events) as txn:
            txn.put(b"\x00" * 12, b"data")
    env.close()
    with pytest.raises(StorageError, match="not a corral store"):
        Store.open(path)
    with pytest.raises(StorageError, match="not a corral store"):  # and it is left as it was
        Store.open(path)


@pytest.mark.parametrize("where", ["once locked", "in lmdb.open"])
def test_a_ctrl_c_while_a_store_opens_does_not_leave_its_writer_lock_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # Before, a Ctrl-C between the flock and the return of the descriptor (or in
    # lmdb.open, which only lmdb.Error unlocked for) kept the lock for the rest of the
    # process: "already open for writing by this process".
    Store.open(tmp_path / "s").close()

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    if where == "once locked":
        monkeypatch.setattr(lmdb_env_module.os, "ftruncate", interrupted)
    else:
        monkeypatch.setattr(lmdb_env_module.lmdb, "open", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Store.open(tmp_path / "s")
    monkeypatch.undo()
    with Store.open(tmp_path / "s") as store:
        two_turns(store)


def test_a_read_only_store_reads_but_refuses_to_write(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        log = two_turns(store)
    with Store.open(tmp_path / "s", readonly=True) as reader:
        session = reader.open_session("agent-1")
        assert session.events() == log.events
        assert [h.id for h in reader.sessions()] == ["agent-1"]
        with pytest.raises(StorageError, match="read-only"):
            session.append("turn/start", TurnStart(turn=3, trigger=MessageTrigger()))
        with pytest.raises(StorageError, match="read-only"):
            reader.create_session("b")
        reader.flush()  # nothing to do


def test_durability_none_still_makes_an_explicit_flush_durable(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s", durability="none") as store:
        log = two_turns(store)
        store.flush()
        assert store.read("agent-1") == log.events
    with Store.open(tmp_path / "s", readonly=True) as reader:
        assert reader.read("agent-1") == log.events


def test_an_unknown_durability_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        Store.open(tmp_path / "s", durability="sometimes")  # type: ignore[arg-type]
