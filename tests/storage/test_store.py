"""The LMDB store on a real environment: sessions, ids, reads, reopen and fork."""

from __future__ import annotations

import threading
from pathlib import Path

import lmdb
import pytest

from storage import (
    DuplicateSessionError,
    EventTypes,
    ForkBoundaryError,
    InvalidEventError,
    InvalidSessionIdError,
    LogCorruptError,
    StorageError,
    Store,
    UnknownEventTypeError,
    UnknownSessionError,
    assert_invariants,
)
from storage.events import Completed, MessageTrigger, SessionEndSeed, TurnEnd, TurnStart
from storage.lmdb.layout import (
    encode_u64,
    event_key,
    put_spans,
)
from storage.lmdb.reads import event_records
from tests.storage.builders import LogBuilder, completed_turn, ticking_clock
from tests.storage.store_rig import WAIT, store, two_turns

__all__ = ["store"]  # the fixture, used by name


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
    with Store.open(tmp_path / "s") as store, pytest.raises(DuplicateSessionError, match="twin"):
        store.create_session("twin")


def test_generated_session_ids_are_unique_and_sort_in_creation_order(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s", clock=ticking_clock(step=1)) as store:
        ids = [store.create_session().id for _ in range(20)]
    assert len(set(ids)) == 20
    assert sorted(ids) == ids


def test_create_sessions_makes_many_new_sessions_durable_at_the_next_flush(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "s") as store:
        before = store.create_session("before")
        made = store.create_sessions(300)
        after = store.create_session()
        assert store.create_sessions(0) == []
        assert len({s.id for s in made}) == 300
        keys = [before.header.key, *(s.header.key for s in made), after.header.key]
        assert keys == list(range(keys[0], keys[0] + 302))  # one key each, in order
        completed_turn(LogBuilder(made[7]))
        store.flush()
    with Store.open(tmp_path / "s") as store:
        listed = [h.id for h in store.sessions()]
        assert listed == ["before", *(s.id for s in made), after.id]
        assert store.stats(made[7].id).event_count > 0
        assert store.stats(made[8].id).event_count == 0


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
        with pytest.raises(LogCorruptError, match=complaint):
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
    with pytest.raises(ForkBoundaryError, match=f"fork boundary {inside} ends inside turn"):
        store.fork("agent-1", inside, "child")
    assert not store.has_session("child")
    with pytest.raises(UnknownSessionError, match="'missing'"):
        store.fork("missing", 0)
