"""The LMDB store on a real environment: sessions, reads, reopen, fork, schema and
directory checks, map growth, concurrent producers and a reader in another process."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import lmdb
import msgspec
import pytest

from storage import (
    DuplicateSessionError,
    EventTypes,
    ForkBoundaryError,
    InvalidEventError,
    InvalidSessionIdError,
    LogCorruptError,
    SchemaVersionError,
    StorageError,
    Store,
    StoreClosedError,
    UnknownEventTypeError,
    UnknownSessionError,
    assert_invariants,
)
from storage.events import Completed, MessageTrigger, SessionEndSeed, TurnEnd, TurnStart
from storage.lmdb import compaction as compaction_module
from storage.lmdb import env as lmdb_env_module
from storage.lmdb import writer as writer_module
from storage.lmdb.layout import (
    SCHEMA_VERSION,
    decode_row,
    encode_frame,
    encode_row,
    encode_u64,
    event_key,
    put_spans,
)
from storage.lmdb.reads import event_records
from tests.storage.builders import LogBuilder, completed_turn, ticking_clock, tool_turn

WAIT = 30.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "store", clock=ticking_clock()) as opened:
        yield opened


def two_turns(store: Store, session_id: str = "agent-1") -> LogBuilder:
    log = LogBuilder(store.create_session(session_id))
    completed_turn(log)
    tool_turn(log)
    return log


# --------------------------------------------------------------------------- basics


def test_a_reopened_store_keeps_every_flushed_session_and_event(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        log = two_turns(store)
        empty = store.create_session("empty")
        store.flush()
    with Store.open(tmp_path / "s") as store:
        session = store.open_session("agent-1")
        assert session.events() == log.events
        assert store.read("agent-1") == log.events
        assert [h.id for h in store.sessions()] == ["agent-1", "empty"]
        assert store.open_session("empty").header == empty.header
        assert_invariants(session.events())


def test_a_reopened_session_continues_its_seqs_and_turn_numbers(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        two_turns(store)
    with Store.open(tmp_path / "s") as store:
        log = LogBuilder(store.open_session("agent-1"))
        completed_turn(log)
        store.flush()
        events = store.read("agent-1")
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.data.turn for e in events if e.type == "turn/start"] == [1, 2, 3]
    assert_invariants(events)


def test_a_new_store_directory_and_its_files_are_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "store"
    Store.open(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    for name in ("data.mdb", "lock.mdb", "writer.lock"):
        assert stat.S_IMODE((path / name).stat().st_mode) & 0o077 == 0, name


def test_the_default_path_is_dot_corral_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with Store.open() as store:
        store.create_session("x")
    assert (tmp_path / ".corral" / "data.mdb").exists()


def test_a_new_session_header_is_durable_at_the_next_flush(store: Store) -> None:
    session = store.create_session("fresh")
    assert store.has_session("fresh")
    store.flush()
    assert store.stats("fresh").event_count == 0
    assert session.header.created > 0
    assert session.last_seq == -1


@pytest.mark.parametrize(
    ("session_id", "complaint"),
    [
        ("", "must not be empty"),
        ("x" * 201, "the limit is 200"),
        ("tab\there", "control character"),
        ("nul\x00", "control character"),
        ("\u0085next-line", "control character"),
    ],
)
def test_an_invalid_session_id_is_refused_with_a_clear_error(
    store: Store, session_id: str, complaint: str
) -> None:
    with pytest.raises(InvalidSessionIdError, match=complaint) as refused:
        store.create_session(session_id)
    assert isinstance(refused.value, ValueError)
    assert isinstance(refused.value, InvalidEventError)
    assert store.sessions() == []


def test_a_duplicate_session_id_is_refused_even_after_reopen(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        store.create_session("twin")
        with pytest.raises(DuplicateSessionError, match="twin"):
            store.create_session("twin")
    with Store.open(tmp_path / "s") as store, pytest.raises(DuplicateSessionError):
        store.create_session("twin")


def test_generated_session_ids_are_unique_and_sort_in_creation_order(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s", clock=ticking_clock(step=1)) as store:
        ids = [store.create_session().id for _ in range(20)]
    assert len(set(ids)) == 20
    assert sorted(ids) == ids


def test_sessions_are_listed_in_creation_order(store: Store) -> None:
    for name in ("zeta", "alpha", "mid"):
        store.create_session(name)
    store.flush()
    assert [h.id for h in store.sessions()] == ["zeta", "alpha", "mid"]
    assert [h.key for h in store.sessions()] == sorted(h.key for h in store.sessions())


# --------------------------------------------------------------------------- reading


def test_read_bounds_are_inclusive_and_limit_caps_the_count(store: Store) -> None:
    log = two_turns(store)
    store.flush()
    assert store.read("agent-1", lower=3, upper=5) == log.events[3:6]
    assert store.read("agent-1", lower=4, limit=2) == log.events[4:6]
    assert store.read("agent-1", upper=0) == log.events[:1]
    assert store.read("agent-1", lower=5, upper=4) == []
    assert store.read("agent-1", lower=10_000) == []


def test_an_unknown_session_reads_as_empty_with_highest_seq_zero(store: Store) -> None:
    assert store.read("nobody") == []
    assert store.last_seq("nobody") == 0
    assert not store.has_session("nobody")
    with pytest.raises(UnknownSessionError, match="nobody"):
        store.open_session("nobody")
    with pytest.raises(UnknownSessionError, match="nobody"):
        store.stats("nobody")


def test_stats_tell_a_one_event_session_from_an_empty_one(store: Store) -> None:
    store.create_session("empty")
    store.create_session("one").append("turn/start", TurnStart(turn=1, trigger=MessageTrigger()))
    store.flush()
    assert store.last_seq("empty") == store.last_seq("one") == 0
    assert (store.stats("empty").event_count, store.stats("empty").last_seq) == (0, None)
    assert (store.stats("one").event_count, store.stats("one").last_seq) == (1, 0)


def test_reads_are_durable_only_and_open_session_sees_everything_appended_before(
    store: Store,
) -> None:
    log = two_turns(store)
    reopened = store.open_session("agent-1")  # flushes first
    assert reopened.events() == log.events
    assert store.last_seq("agent-1") == log.events[-1].seq


def test_an_unknown_ignorable_type_is_skipped_and_appends_continue_after_it(
    tmp_path: Path,
) -> None:
    types = EventTypes.default()
    types.register("plugin/note", ignorable=True)
    with Store.open(tmp_path / "s", event_types=types) as store:
        log = LogBuilder(store.create_session("a"))
        completed_turn(log)
        log.plugin("plugin/note", {"text": "only the plugin knows me"})
    with Store.open(tmp_path / "s") as store:
        session = store.open_session("a")
        assert session.events() == log.events[:-1]
        assert session.last_seq == log.events[-1].seq
        added = session.append("turn/start", TurnStart(turn=2, trigger=MessageTrigger()))
        assert added.seq == log.events[-1].seq + 1
        store.flush()
        assert store.stats("a").event_count == len(log.events) + 1


def test_an_unknown_non_ignorable_type_fails_naming_the_session_and_seq(tmp_path: Path) -> None:
    types = EventTypes.default()
    types.register("plugin/secret")
    with Store.open(tmp_path / "s", event_types=types) as store:
        session = store.create_session("a")
        session.append("plugin/secret", {"x": 1})
    with Store.open(tmp_path / "s") as store:
        with pytest.raises(UnknownEventTypeError, match=r"'a' seq 0.*plugin/secret"):
            store.open_session("a")
        store.register_event_type("plugin/secret")
        assert store.open_session("a").events()[0].data == {"x": 1}


def damage(path: Path, seq: int, value: bytes | None, *, blocks: bool = True) -> None:
    """Overwrite (or, with ``None``, delete) the record of session key 1 at ``seq``;
    store the session's records again as blocks, or one per value (as version 2 did)."""
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        events = env.open_db(b"events", txn=txn)
        records = [(k, v) for k, v in event_records(txn, events) if k[:8] == encode_u64(1)]
        for key, _ in records:
            txn.delete(key, db=events)  # a key that starts no block is not stored: fine
        payloads = [v for _, v in records]
        spans = [(1, 0, payloads[:seq]), (1, seq + 1, payloads[seq + 1 :])]
        if value is not None:
            spans = [(1, 0, [*payloads[:seq], value, *payloads[seq + 1 :]])]
        if blocks:
            put_spans(txn, events, spans)
        else:
            for _, first, part in spans:
                for at, payload in enumerate(part, first):
                    txn.put(event_key(1, at), payload, db=events)
    env.close()


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        (None, r"'agent-1': records of seqs 0\.\.\d+ are not all stored"),
        (b"{torn", r"'agent-1'.*seq 7"),
        (
            b'{"type":"turn/start","seq":6,"time":1,"data":{"turn":1,"trigger":{"kind":"message"}}}',
            r"stored at seq 7 says seq 6",
        ),
    ],
    ids=["missing", "torn", "moved"],
)
@pytest.mark.parametrize("blocks", [True, False], ids=["blocks", "per-record"])
def test_a_damaged_log_is_reported_naming_the_session_and_seq(
    tmp_path: Path, value: bytes | None, complaint: str, blocks: bool
) -> None:
    with Store.open(tmp_path / "s") as store:
        two_turns(store)
    damage(tmp_path / "s", 7, value, blocks=blocks)
    with Store.open(tmp_path / "s") as store:
        with pytest.raises(LogCorruptError, match=complaint):
            store.open_session("agent-1")
        with pytest.raises(LogCorruptError):
            store.read("agent-1")
        assert store.read("agent-1", upper=6) == store.read("agent-1", limit=7)


def test_a_damaged_block_is_reported_naming_the_session_key_and_its_first_seq(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "s") as store:
        two_turns(store)
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8)
    with env.begin(write=True) as txn:
        events = env.open_db(b"events", txn=txn)
        assert txn.get(event_key(1, 0), db=events)[:1] >= b"\x80"  # the session's block
        txn.put(event_key(1, 0), b"\x9f\xc4\xff torn", db=events)
    env.close()
    with (
        Store.open(tmp_path / "s") as store,
        pytest.raises(LogCorruptError, match="events block of session key 1 from seq 0"),
    ):
        store.read("agent-1")


def test_flush_async_reports_durability_to_its_callback(store: Store) -> None:
    log = two_turns(store)
    done = threading.Event()
    outcome: list[BaseException | None] = []

    def callback(error: BaseException | None) -> None:
        outcome.append(error)
        done.set()

    store.flush_async(callback)
    assert done.wait(WAIT)
    assert outcome == [None]
    assert store.last_seq("agent-1") == log.events[-1].seq


def test_a_stale_session_object_cannot_interleave_records_with_a_reopened_one(
    store: Store,
) -> None:
    stale = store.create_session("a")
    stale.append("turn/start", TurnStart(turn=1, trigger=MessageTrigger()))
    fresh = store.open_session("a")
    fresh.append("turn/end", TurnEnd(turn=1, reason=Completed()))
    with pytest.raises(StorageError, match="out of order"):
        stale.append("turn/end", TurnEnd(turn=1, reason=Completed()))
    store.flush()
    assert store.read("a") == fresh.events()


# --------------------------------------------------------------------------- fork


def test_a_fork_is_seeded_with_the_prefix_and_an_end_seed_citing_its_source(
    store: Store,
) -> None:
    log = two_turns(store)
    boundary = next(e.seq for e in log.events if e.type == "turn/end")
    child = store.fork("agent-1", boundary, "child")
    events = child.events()
    assert events[:-1] == log.events[: boundary + 1]
    assert events[-1].type == "session/end-seed"
    assert events[-1].seq == boundary + 1
    assert events[-1].data == SessionEndSeed(source_session="agent-1", source_seq=boundary)
    header = child.header
    assert (header.parent, header.fork_seq, header.seed_length) == (
        "agent-1",
        boundary,
        boundary + 2,
    )
    more = LogBuilder(child)
    completed_turn(more)
    store.flush()
    durable = store.read("child")
    assert durable == child.events()
    assert [e.data.turn for e in durable if e.type == "turn/start"] == [1, 2]
    assert store.read("agent-1") == log.events  # the source is untouched


def test_a_fork_is_durable_whole_when_it_returns(tmp_path: Path) -> None:
    """The header, the seed and the session/end-seed commit in one transaction: no
    crash after the fork can leave a child without its end-seed."""
    with Store.open(tmp_path / "s") as store:
        log = two_turns(store)
        boundary = log.events[-1].seq
        child = store.fork("agent-1", boundary, "child")
        assert child.resident_events == 0  # nothing of it waits for a flush
        durable = store.read("child")
        assert durable == child.events()
        assert [e.type for e in durable[-2:]] == ["turn/end", "session/end-seed"]
    with Store.open(tmp_path / "s", readonly=True) as store:
        assert store.read("child") == durable


def test_a_fork_inside_an_open_turn_is_refused_and_creates_nothing(store: Store) -> None:
    log = two_turns(store)
    inside = next(e.seq for e in log.events if e.type == "step/start")
    with pytest.raises(ForkBoundaryError):
        store.fork("agent-1", inside, "child")
    assert not store.has_session("child")
    with pytest.raises(UnknownSessionError):
        store.fork("missing", 0)


# --------------------------------------------------------------------------- opening


def test_a_store_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    Store.open(tmp_path / "s").close()
    future = str(SCHEMA_VERSION + 1).encode()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"schema_version", future, db=env.open_db(b"meta", txn=txn))
    env.close()
    refusal = rf"schema version {SCHEMA_VERSION + 1}.*supports version {SCHEMA_VERSION}"
    with pytest.raises(SchemaVersionError, match=refusal):
        Store.open(tmp_path / "s")
    with pytest.raises(SchemaVersionError):
        Store.open(tmp_path / "s", readonly=True)


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
        with pytest.raises(StoreClosedError):
            call()
    with pytest.raises(StoreClosedError):
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
    with pytest.raises(StoreClosedError):  # closed from the first close on
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
