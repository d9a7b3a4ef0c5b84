"""Records of ignorable plugin types read, checked and forked by a store that does not
know their type: skipped by default, accounted for on request (placeholders), copied
verbatim by a fork so that every seq the log cites stays valid."""

from __future__ import annotations

import io
from pathlib import Path

import msgspec
import pytest

from storage import (
    EventTypes,
    LogCorruptError,
    Store,
    UnknownSessionError,
    assert_invariants,
    check_invariants,
    derive_messages,
)
from storage.events import (
    Event,
    IgnoredRecord,
    SessionEndSeed,
    SurfaceReplace,
    UserMessageData,
)
from tests.storage.builders import (
    LogBuilder,
    completed_turn,
    ticking_clock,
    tool_turn,
    user_message,
)
from tests.storage.test_store import damage

PLUGIN = "plugin/note"


def aware_types() -> EventTypes:
    types = EventTypes.default()
    types.register(PLUGIN, ignorable=True)
    return types


def write_parent(path: Path) -> list[Event]:
    """A session ``parent`` written by a process that knows ``plugin/note``: plugin
    events between turns, inside a step between a tool call and its result, one cited
    by a user message, and a replace of a message that follows plugin events. Returns
    its events as that process committed them."""
    with Store.open(path, event_types=aware_types(), clock=ticking_clock()) as store:
        log = LogBuilder(store.create_session("parent"))
        completed_turn(log)
        log.plugin(PLUGIN, {"text": "between turns"})
        log.turn_start()
        log.step_start()
        log.user("use the tool")
        log.assistant(calls=[("call-1", "echo", "{}")])
        call = log.tool_call("call-1")
        log.plugin(PLUGIN, {"text": "while the tool runs"})
        log.tool_result(call)  # cites the tool/call across the plugin event
        noted = log.plugin(PLUGIN, {"text": "cited by the next message"})
        message = UserMessageData(
            message=user_message("from the plugin"),
            turn=log.turn,
            step=log.step,
            source_event_seqs=(noted.seq,),
        )
        log.add("user/message", message)
        reply = log.assistant("first draft")
        log.assistant("second draft", replaces=reply.seq)
        log.step_end()
        log.turn_end()
        log.plugin(PLUGIN, {"text": "after turn 2"})
        completed_turn(log)
        assert_invariants(log.events)
        return log.events


def stored_records(store: Store, session_id: str) -> list[bytes]:
    out = io.BytesIO()
    store.export_jsonl(session_id, out)
    return out.getvalue().splitlines()[1:]


def test_a_store_that_does_not_know_an_ignorable_type_reads_each_record_of_it_as_a_placeholder_on_request(
    tmp_path: Path,
) -> None:
    parent = write_parent(tmp_path / "s")
    with Store.open(tmp_path / "s") as store:
        assert store.read("parent") == [e for e in parent if e.type != PLUGIN]  # skipped
        full = store.read("parent", include_ignored=True)
        records = stored_records(store, "parent")
        assert [(e.type, e.seq, e.time) for e in full] == [(e.type, e.seq, e.time) for e in parent]
        for event, original, record in zip(full, parent, records, strict=True):
            if event.type == PLUGIN:
                assert event.data == IgnoredRecord(raw=record)
                assert msgspec.json.decode(event.data.raw)["data"] == original.data
            else:
                assert event == original
        third = [e.seq for e in parent if e.type == PLUGIN][2]
        assert store.read("parent", lower=third, upper=third, include_ignored=True) == [full[third]]
        assert (
            store.read("parent", lower=third, limit=3, include_ignored=True)
            == full[third : third + 3]
        )


def test_a_log_with_records_of_an_unknown_ignorable_type_passes_the_checker_read_with_placeholders(
    tmp_path: Path,
) -> None:
    write_parent(tmp_path / "s")
    with Store.open(tmp_path / "s", readonly=True) as store:
        assert check_invariants(store.read("parent", include_ignored=True)) == []
        skipped = check_invariants(store.read("parent"))  # the gaps the skip leaves
        assert {v.rule for v in skipped} == {"seq-gap", "source-seq"}  # and a cited seq


def test_a_store_that_does_not_know_an_ignorable_type_forks_a_log_keeping_every_seq_and_citation(
    tmp_path: Path,
) -> None:
    parent = write_parent(tmp_path / "s")
    plugin_seqs = [e.seq for e in parent if e.type == PLUGIN]
    boundary = plugin_seqs[-1]  # the plugin event right after turn 2
    with Store.open(tmp_path / "s", clock=ticking_clock(start=2_000_000_000_000)) as store:
        child = store.fork("parent", boundary, "child")
        seen = child.events()  # the child's own session skips what it does not know
        prefix = [e for e in parent[: boundary + 1] if e.type != PLUGIN]
        assert seen[:-1] == prefix
        assert seen[-1].seq == boundary + 1
        assert seen[-1].data == SessionEndSeed(source_session="parent", source_seq=boundary)
        assert child.last_seq == boundary + 1
        assert child.header.seed_length == boundary + 2
        assert child.messages() == derive_messages(prefix)
        more = LogBuilder(child)
        completed_turn(more)  # the child goes on, turn 3
        store.flush()
        copied = stored_records(store, "child")[: boundary + 1]
        assert copied == stored_records(store, "parent")[: boundary + 1]  # verbatim
        assert_invariants(store.read("child", include_ignored=True))
    with Store.open(tmp_path / "s", event_types=aware_types(), readonly=True) as store:
        events = store.read("child")
        assert events[: boundary + 1] == parent[: boundary + 1]
        assert events[boundary + 1] == seen[-1]
        assert [e.data.turn for e in events if e.type == "turn/start"] == [1, 2, 3]
        assert_invariants(events)
        assert store.read("parent") == parent  # the source is untouched


@pytest.mark.parametrize("at", ["a plugin event", "a turn end after plugin events"])
def test_a_fork_boundary_may_be_a_skipped_record_or_follow_one(tmp_path: Path, at: str) -> None:
    parent = write_parent(tmp_path / "s")
    ends = [e.seq for e in parent if e.type == "turn/end"]
    boundary = ends[0] + 1 if at == "a plugin event" else ends[1]
    assert (parent[boundary].type == PLUGIN) == (at == "a plugin event")
    with Store.open(tmp_path / "s") as store:
        store.fork("parent", boundary, "child")
    with Store.open(tmp_path / "s", event_types=aware_types(), readonly=True) as store:
        events = store.read("child")
        assert events[:-1] == parent[: boundary + 1]
        assert_invariants(events)


def test_a_fork_of_a_log_its_child_could_not_load_fails_and_leaves_no_child(
    tmp_path: Path,
) -> None:
    """A record whose citation a session refuses (written behind the store's back): the
    fork is refused before anything of the child is written."""
    parent = write_parent(tmp_path / "s")
    cited = next(e for e in parent if e.type == "tool/result")
    with Store.open(tmp_path / "s") as store:
        record = msgspec.json.decode(stored_records(store, "parent")[cited.seq])
    record["data"]["sourceEventSeqs"] = [cited.seq + 5]  # a later seq: not allowed
    damage(tmp_path / "s", cited.seq, msgspec.json.encode(record))
    boundary = next(e.seq for e in parent if e.type == "turn/end" and e.seq > cited.seq)
    with Store.open(tmp_path / "s") as store:
        with pytest.raises(LogCorruptError, match="sourceEventSeqs"):
            store.fork("parent", boundary, "child")
        assert not store.has_session("child")
        assert [h.id for h in store.sessions()] == ["parent"]
        early = next(e.seq for e in parent if e.type == "turn/end")
        store.fork("parent", early, "early")  # the store goes on: a fork before the damage
    with Store.open(tmp_path / "s", readonly=True) as store:
        assert not store.has_session("child")
        with pytest.raises(UnknownSessionError, match="no durable session 'child'"):
            store.stats("child")
        assert [h.id for h in store.sessions()] == ["parent", "early"]


def test_the_checker_takes_a_placeholder_for_its_seq_and_nothing_else() -> None:
    log = LogBuilder()
    completed_turn(log)
    tool_turn(log)
    events = list(log.events)
    # Placeholders named like built-in facts, inside a step and between turns: opaque.
    for at, name in ((3, "turn/start"), (len(events), "tool/result")):
        events.insert(at, Event(name, at, 1, IgnoredRecord(raw=b"{}")))
    events = [msgspec.structs.replace(e, seq=i) for i, e in enumerate(events)]
    assert check_invariants(events) == []
    cites = msgspec.structs.replace(
        events[-1],
        type="user/message",
        seq=len(events),
        data=UserMessageData(message=user_message("x"), source_event_seqs=(3,)),
    )
    replaces = msgspec.structs.replace(
        cites,
        seq=len(events) + 1,
        data=UserMessageData(message=user_message("y"), surface_op=SurfaceReplace(seq=3)),
    )
    rules = [v.rule for v in check_invariants([*events, cites, replaces])]
    assert rules == ["replace-target"]  # citing a placeholder is fine; replacing one is not
    gap = [e for e in events if e.seq != 3]
    assert [v.rule for v in check_invariants(gap)] == ["seq-gap"]
