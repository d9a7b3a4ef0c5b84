"""JSONL export and import: byte-identical round trips and all-or-nothing validation."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import (
    DuplicateSessionError,
    EventTooLargeError,
    EventTypes,
    InvalidEventError,
    Store,
    UnknownEventTypeError,
    UnknownSessionError,
)
from storage.events import MessageTrigger, TurnStart
from storage.lmdb import writer as writer_module
from tests.storage.builders import (
    LogBuilder,
    completed_turn,
    open_turn_with_pending_call,
    ticking_clock,
    tool_turn,
)


def plugin_types() -> EventTypes:
    types = EventTypes.default()
    types.register("plugin/note")
    types.register("plugin/trace", ignorable=True)
    return types


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "a", event_types=plugin_types(), clock=ticking_clock()) as store:
        yield store


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "b", event_types=plugin_types()) as store:
        yield store


def realistic(store: Store, session_id: str = "agent-1") -> LogBuilder:
    log = LogBuilder(store.create_session(session_id))
    completed_turn(log, text="héllo ✓", reply='quotes " and \\ and\nnewlines')
    log.plugin("plugin/note", {"nested": {"list": [1, 2.5, None, True]}, "ünï": "cödé"})
    tool_turn(log)
    log.plugin("plugin/trace", {"spans": 3})
    open_turn_with_pending_call(log)
    return log


def exported(store: Store, session_id: str) -> bytes:
    out = io.BytesIO()
    store.export_jsonl(session_id, out)
    return out.getvalue()


def test_an_export_is_the_same_whether_records_are_in_the_journal_or_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "JOURNAL_MAX_RECORDS", 10)
    with Store.open(tmp_path / "s", event_types=plugin_types()) as store:
        log = realistic(store)
        store.flush()
        more = LogBuilder(store.open_session("agent-1"))
        more.plugin("plugin/note", {"after": "the compaction"})  # lands in the journal
        store.flush()
        live = exported(store, "agent-1")
        assert store.statistics().compactions >= 1
    with Store.open(tmp_path / "s", event_types=plugin_types(), readonly=True) as store:
        assert exported(store, "agent-1") == live  # compacted at close
    assert len(live.splitlines()) == len(log.events) + 2


def test_export_then_import_gives_byte_identical_records(source: Store, target: Store) -> None:
    log = realistic(source)
    first = exported(source, "agent-1")
    lines = first.splitlines()
    assert len(lines) == len(log.events) + 1  # a header line, then one line per record

    imported = target.import_jsonl(io.BytesIO(first))
    target.flush()
    again = exported(target, "agent-1")

    assert again.splitlines()[1:] == lines[1:]
    assert imported.events() == log.events
    assert target.read("agent-1") == log.events
    assert imported.header.created == source.open_session("agent-1").header.created


def test_an_export_holds_the_stored_bytes_of_every_record(source: Store) -> None:
    log = realistic(source)
    lines = exported(source, "agent-1").splitlines()
    assert lines[1:] == [source.codec.encode(event) for event in log.events]
    assert b'"format":"corral-session"' in lines[0]


def test_export_returns_the_number_of_records(source: Store) -> None:
    log = realistic(source)
    assert source.export_jsonl("agent-1", io.BytesIO()) == len(log.events)
    with pytest.raises(UnknownSessionError, match="'nobody'"):
        source.export_jsonl("nobody", io.BytesIO())


def test_an_imported_session_is_durable_and_continues_after_its_last_seq(
    tmp_path: Path, source: Store
) -> None:
    log = realistic(source)
    data = exported(source, "agent-1")
    with Store.open(tmp_path / "c", event_types=plugin_types()) as store:
        session = store.import_jsonl(io.BytesIO(data), session_id="copy")
        repaired = session.repair()  # close the open tail turn
        assert repaired[0].seq == log.events[-1].seq + 1
    with Store.open(tmp_path / "c", event_types=plugin_types()) as store:
        events = store.read("copy")
        assert events[: len(log.events)] == log.events
        assert events[-1].type == "turn/end"


def test_a_fork_child_keeps_its_lineage_through_export_and_import(
    source: Store, target: Store
) -> None:
    log = LogBuilder(source.create_session("parent"))
    completed_turn(log)
    completed_turn(log)
    child = source.fork("parent", log.events[10].seq, "child")
    target.import_jsonl(io.BytesIO(exported(source, "child")))
    copy = target.open_session("child")
    assert (copy.header.parent, copy.header.fork_seq, copy.header.seed_length) == (
        "parent",
        child.header.fork_seq,
        child.header.seed_length,
    )
    assert copy.events() == child.events()


def test_a_file_of_bare_records_imports_under_a_generated_id(source: Store, target: Store) -> None:
    log = realistic(source)
    bare = b"".join(line + b"\n" for line in exported(source, "agent-1").splitlines()[1:])
    session = target.import_jsonl(io.BytesIO(bare))
    target.flush()
    assert session.id != "agent-1"
    assert target.read(session.id) == log.events


def test_an_ignorable_record_unknown_to_the_importer_is_kept_byte_identical(
    tmp_path: Path, source: Store
) -> None:
    log = realistic(source)
    data = exported(source, "agent-1")
    types = EventTypes.default()
    types.register("plugin/note")  # plugin/trace is unknown here, but ignorable
    with Store.open(tmp_path / "d", event_types=types) as store:
        session = store.import_jsonl(io.BytesIO(data))
        assert [e.type for e in session.events()] == [
            e.type for e in log.events if e.type != "plugin/trace"
        ]
        assert exported(store, "agent-1").splitlines()[1:] == data.splitlines()[1:]


def replace_line(data: bytes, index: int, line: bytes) -> bytes:
    lines = data.splitlines()
    lines[index] = line
    return b"\n".join(lines) + b"\n"


@pytest.mark.parametrize(
    ("damage", "error", "complaint"),
    [
        ("gap", InvalidEventError, "line 7: seq 7 where seq 5 was expected"),
        ("garbage", InvalidEventError, "line 6: not a JSON event record"),
        ("bad-data", InvalidEventError, "line 6: .*does not match its schema"),
        ("unknown-type", UnknownEventTypeError, "line 6: .*plugin/unheard-of"),
        ("too-large", EventTooLargeError, "line 6: the record is"),
    ],
)
def test_an_invalid_record_anywhere_fails_the_import_before_anything_is_written(
    source: Store, target: Store, damage: str, error: type[Exception], complaint: str
) -> None:
    realistic(source)
    data = exported(source, "agent-1")
    if damage == "gap":
        lines = data.splitlines()
        data = b"\n".join(lines[:6] + lines[8:]) + b"\n"
    elif damage == "garbage":
        data = replace_line(data, 5, b"{not json")
    elif damage == "bad-data":
        data = replace_line(data, 5, b'{"type":"turn/start","seq":4,"time":1,"data":{"turn":"x"}}')
    elif damage == "unknown-type":
        data = replace_line(data, 5, b'{"type":"plugin/unheard-of","seq":4,"time":1,"data":{}}')
    else:
        data = replace_line(data, 5, b'{"type":"plugin/note","seq":4,"time":1,"data":{"x":"')
        data = data.replace(b'"x":"\n', b'"x":"' + b"x" * (5 << 20) + b'"}}\n')
    with pytest.raises(error, match=complaint):
        target.import_jsonl(io.BytesIO(data))
    target.flush()
    assert target.sessions() == []
    assert not target.has_session("agent-1")
    assert target.statistics().events_written == 0


def test_an_import_under_an_existing_id_is_refused_and_writes_nothing(
    source: Store, target: Store
) -> None:
    realistic(source)
    data = exported(source, "agent-1")
    mine = target.create_session("agent-1")
    mine.append("turn/start", TurnStart(turn=1, trigger=MessageTrigger()))
    with pytest.raises(DuplicateSessionError, match="agent-1"):
        target.import_jsonl(io.BytesIO(data))
    target.flush()
    assert target.stats("agent-1").event_count == 1


def test_an_export_of_a_newer_format_version_is_refused(source: Store, target: Store) -> None:
    realistic(source)
    data = exported(source, "agent-1").replace(b'"version":1', b'"version":9', 1)
    with pytest.raises(InvalidEventError, match="export version 9"):
        target.import_jsonl(io.BytesIO(data))


@pytest.mark.parametrize("data", [b"", b"\n", b"  \n\n"])
def test_an_empty_input_is_not_an_export_and_creates_no_session(target: Store, data: bytes) -> None:
    with pytest.raises(InvalidEventError, match="the input is empty"):
        target.import_jsonl(io.BytesIO(data))
    target.flush()
    assert target.sessions() == []


def test_the_export_of_an_empty_session_imports_as_an_empty_session(
    source: Store, target: Store
) -> None:
    source.create_session("empty")
    session = target.import_jsonl(io.BytesIO(exported(source, "empty")))
    assert (session.id, session.last_seq) == ("empty", -1)
    assert [h.id for h in target.sessions()] == ["empty"]
