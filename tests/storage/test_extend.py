"""Session.extend: a batch of facts validated like single appends, written all or nothing,
handed to the sink at once (LogSink.submit_many), observers after the whole batch."""

from __future__ import annotations

import logging
import math
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from storage import (
    Codec,
    Event,
    EventTooLargeError,
    EventTypes,
    InvalidEventError,
    MemorySink,
    ReentrantAppendError,
    Session,
    SessionHeader,
    StorageError,
    Store,
    StoreClosedError,
    UnknownEventTypeError,
    derive_messages,
)
from storage.events import (
    AssistantChunk,
    AssistantMessage,
    AssistantMessageData,
    MessageTrigger,
    RequestConfig,
    RequestHeader,
    StepEnd,
    StepStart,
    SurfaceReplace,
    TextBlock,
    TextDelta,
    TurnStart,
    UserMessageData,
)
from storage.lmdb import compaction as compaction_module
from storage.lmdb import writer as writer_module
from storage.lmdb.env import LmdbEnv
from storage.lmdb.reads import scan_journal
from storage.lmdb.writer import LogWriter
from storage.batch import Fact
from tests.storage import builders
from tests.storage.builders import START_TIME, user_message
from tests.storage.test_session_memory import DurableSink, durable_session

TURN_1 = TurnStart(turn=1, trigger=MessageTrigger())


class Note(msgspec.Struct, frozen=True):
    text: str


def codec() -> Codec:
    types = EventTypes.default()
    types.register("plugin")
    types.register("test/note", Note, ignorable=True)
    return Codec(types, max_event_bytes=1000)


def new_session(**kwargs: Any) -> Session:
    return builders.new_session(codec=codec(), **kwargs)


def one_turn(turn: int = 1) -> list[Fact]:
    """A turn's facts for a session at seq 0: the reply cites the chunks (seqs 3, 4)."""
    reply = AssistantMessage(content=[TextBlock(text="hello")])
    return [
        ("turn/start", TurnStart(turn=turn, trigger=MessageTrigger())),
        ("step/start", StepStart(turn=turn, step=1)),
        ("user/message", UserMessageData(message=user_message("hi"), turn=turn, step=1)),
        ("assistant/chunk", AssistantChunk(turn=turn, step=1, chunk=TextDelta(text="hel"))),
        ("assistant/chunk", AssistantChunk(turn=turn, step=1, chunk=TextDelta(text="lo"))),
        (
            "assistant/message",
            AssistantMessageData(turn=turn, step=1, message=reply, source_event_seqs=[3, 4]),
        ),
        ("step/end", StepEnd(turn=turn, step=1)),
    ]


def test_extend_appends_every_fact_in_order_with_one_hand_over_and_one_time() -> None:
    sink = MemorySink()
    session = new_session(sink=sink)
    session.append("plugin", {"before": True})
    events = session.extend(one_turn())
    assert [e.seq for e in events] == list(range(1, 8))
    assert [e.type for e in events] == [kind for kind, _ in one_turn()]
    assert len({e.time for e in events}) == 1  # one clock reading for the batch
    assert events[0].time >= session.events(0, 0)[0].time
    assert session.events() == [*session.events(0, 0), *events]
    payloads = sink.payloads()
    assert payloads[1:] == [session.codec.encode(e) for e in events]  # as append writes them
    assert session.state.open_step is None
    assert session.state.open_turn == 1


def test_extend_takes_mappings_and_plugin_types_as_append_does() -> None:
    session = new_session()
    facts: list[Fact] = [("turn/start", {"turn": 1, "trigger": {"kind": "message"}})]
    facts += [("plugin", {"n": 1}), ("test/note", Note(text="x"))]
    events = session.extend(facts)
    assert events[0].data == TURN_1
    assert events[1].data == {"n": 1}
    assert b'"ignorable":true' in session.codec.encode(events[2])
    reference = new_session()
    expected = [reference.append(kind, data) for kind, data in facts]
    assert [e.data for e in events] == [e.data for e in expected]


def test_an_empty_batch_writes_nothing() -> None:
    sink = MemorySink()
    session = new_session(sink=sink)
    assert session.extend([]) == []
    assert session.extend(iter(())) == []
    assert sink.records == []
    assert session.last_seq == -1


REPLACE_0 = UserMessageData(message=user_message("x"), surface_op=SurfaceReplace(seq=0))


def refused_batch_leaves_nothing(
    facts: list[Fact], index: int, type: str, error: type[Exception]
) -> Session:
    """Extend a session holding one event (observed) with ``facts``, of which
    ``facts[index]`` is refused with ``error``: the error names it, and nothing was
    written, handed to the sink or observed. Returns the session."""
    sink = MemorySink()
    session = new_session(sink=sink)
    kept = session.append("turn/start", TURN_1)
    seen: list[Event] = []
    session.on_event(seen.append)
    with pytest.raises(error, match=rf"^facts\[{index}\] \({type!r}\): "):
        session.extend(facts)
    assert session.last_seq == 0
    assert session.events() == [kept]
    assert len(sink.records) == 1
    assert seen == []
    return session


@pytest.mark.parametrize(
    ("type", "data", "error"),
    [
        ("nope", {}, UnknownEventTypeError),
        ("plugin", {"x": math.nan}, InvalidEventError),
        ("plugin", {"surfaceOp": {"kind": "append"}}, InvalidEventError),
        ("plugin", {"x": "y" * 2000}, EventTooLargeError),
        ("turn/start", StepStart(turn=1, step=1), InvalidEventError),
        ("test/note", Note(text="y" * 2000), EventTooLargeError),  # the ignorable encoder
        ("user/message", REPLACE_0, InvalidEventError),  # seq 0 is not a surface fact
        (
            "user/message",
            UserMessageData(message=user_message("x"), source_event_seqs=[9]),  # a later seq
            InvalidEventError,
        ),
    ],
)
def test_a_bad_fact_in_the_middle_writes_nothing_and_the_error_names_it(
    type: str, data: object, error: type[Exception]
) -> None:
    facts: list[Fact] = [("plugin", {"n": 1}), ("plugin", {"n": 2}), (type, data)]
    facts += [("plugin", {"n": 4})]
    session = refused_batch_leaves_nothing(facts, 2, type, error)
    assert session.append("plugin", {}).seq == 1  # the session goes on as before


def test_a_replace_may_cite_a_surface_fact_earlier_in_the_same_batch() -> None:
    session = new_session()
    facts = one_turn()
    corrected = UserMessageData(message=user_message("hi!"), surface_op=SurfaceReplace(seq=2))
    again = UserMessageData(message=user_message("hi!!"), surface_op=SurfaceReplace(seq=7))
    facts += [("user/message", corrected), ("user/message", again)]
    events = session.extend(facts)
    assert session.messages() == derive_messages(events)
    assert [m.content[0].text for m in session.messages()] == ["hi!!", "hello"]  # type: ignore[union-attr]


def test_a_replace_citing_a_non_surface_fact_of_the_batch_is_refused() -> None:
    session = new_session()
    facts = [*one_turn(), ("user/message", REPLACE_0)]  # seq 0 is the turn/start
    with pytest.raises(InvalidEventError, match=r"^facts\[7\] \('user/message'\): "):
        session.extend(facts)
    assert session.last_seq == -1
    assert session.messages() == []


# Small batches of typed facts (a turn's back-to-back facts) take a fast path of their own.


def test_a_small_typed_batch_is_written_as_append_writes_it() -> None:
    sink = MemorySink()
    session = new_session(sink=sink)
    reference = new_session()
    facts = one_turn()
    events: list[Event] = []
    for group in (facts[:1], facts[1:3], facts[3:5], facts[5:]):  # the turn machine's shapes
        events += session.extend(iter(group))  # any iterable
    expected = [reference.append(kind, data) for kind, data in facts]
    assert [(e.type, e.seq, e.data) for e in events] == [(e.type, e.seq, e.data) for e in expected]
    assert len({e.time for e in events[1:3]}) == 1
    assert sink.payloads() == [session.codec.encode(e) for e in events]
    assert session.events() == events
    assert session.messages() == reference.messages()
    assert session.state == reference.state


def test_a_small_batch_may_cite_a_surface_fact_earlier_in_the_batch() -> None:
    session = new_session()
    session.extend(one_turn()[:2])
    asked = UserMessageData(message=user_message("hi"), turn=1, step=1)
    fixed = UserMessageData(message=user_message("hi!"), surface_op=SurfaceReplace(seq=2))
    again = UserMessageData(message=user_message("hi!!"), surface_op=SurfaceReplace(seq=3))
    events = session.extend(
        [("user/message", asked), ("user/message", fixed), ("user/message", again)]
    )
    assert [e.seq for e in events] == [2, 3, 4]
    assert [m.content[0].text for m in session.messages()] == ["hi!!"]  # type: ignore[union-attr]
    with pytest.raises(InvalidEventError, match=r"^facts\[1\] \('user/message'\): "):
        session.extend([("step/end", StepEnd(turn=1, step=1)), ("user/message", REPLACE_0)])
    assert session.last_seq == 4


NAN_HEADER = RequestHeader(turn=1, step=1, config=RequestConfig("p", "m", temperature=math.nan))


@pytest.mark.parametrize(
    ("type", "data", "error"),
    [
        ("request/header", NAN_HEADER, InvalidEventError),  # the type's check
        ("user/message", REPLACE_0, InvalidEventError),  # seq 0 is not a surface fact
        (  # a later seq
            "user/message",
            UserMessageData(message=user_message("x"), source_event_seqs=[9]),
            InvalidEventError,
        ),
        ("test/note", Note(text="y" * 2000), EventTooLargeError),  # the ignorable encoder
        (
            "assistant/chunk",
            AssistantChunk(turn=1, step=1, chunk=TextDelta(text="y" * 2000)),
            EventTooLargeError,
        ),
        ("step/start", TURN_1, InvalidEventError),  # the wrong struct: the general path
        ("nope", TURN_1, UnknownEventTypeError),
    ],
)
def test_an_error_in_the_2nd_of_3_typed_facts_leaves_nothing(
    type: str, data: object, error: type[Exception]
) -> None:
    facts: list[Fact] = [("step/start", StepStart(turn=1, step=1)), (type, data)]
    facts.append(("assistant/chunk", AssistantChunk(turn=1, step=1, chunk=TextDelta(text="x"))))
    session = refused_batch_leaves_nothing(facts, 1, type, error)
    assert session.state.open_step is None
    assert session.messages() == []
    assert session.extend(facts[:1])[0].seq == 1  # the session goes on as before


def test_a_small_batch_reports_a_surface_error_before_an_earlier_fact_too_large() -> None:
    """As the general path: every fact's surface rules, then the encoding and size."""
    session = new_session()
    facts: list[Fact] = [("test/note", Note(text="y" * 2000)), ("user/message", REPLACE_0)]
    with pytest.raises(InvalidEventError, match=r"^facts\[1\] ") as refused:
        session.extend(facts)
    assert not isinstance(refused.value, EventTooLargeError)
    assert session.last_seq == -1


def test_a_small_batch_with_a_mapping_reads_the_clock_once() -> None:
    session = new_session()  # a ticking clock: START_TIME, START_TIME + 1, ...
    events = session.extend([("step/start", StepStart(turn=1, step=1)), ("plugin", {"n": 1})])
    events += session.extend([("turn/start", {"turn": 1, "trigger": {"kind": "message"}})])
    assert [e.time for e in events] == [START_TIME, START_TIME, START_TIME + 1]
    assert events[2].data == TURN_1


def test_an_observer_that_disposes_itself_misses_the_rest_of_a_small_batch() -> None:
    session = new_session()
    seen: list[int] = []

    def once(event: Event) -> None:
        seen.append(event.seq)
        dispose()

    dispose = session.on_event(once)
    session.extend(one_turn()[:3])
    assert seen == [0]


def test_observers_see_each_event_once_after_the_whole_batch_is_committed() -> None:
    session = new_session()
    seen: list[tuple[int, int, int]] = []
    session.on_event(lambda e: seen.append((e.seq, session.last_seq, len(session.events()))))
    session.extend(one_turn())
    assert seen == [(seq, 6, 7) for seq in range(7)]


def test_an_observer_cannot_extend(caplog: pytest.LogCaptureFixture) -> None:
    session = new_session()
    refused: list[BaseException] = []

    def reenter(event: Event) -> None:
        try:
            session.extend([("plugin", {})])
        except ReentrantAppendError as err:
            refused.append(err)

    session.on_event(reenter)
    session.extend(one_turn())
    session.append("plugin", {"n": 1})
    assert len(refused) == 8
    assert "observers may not append" in str(refused[0])
    assert session.last_seq == 7


def test_a_failing_observer_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    session = new_session()
    seen: list[int] = []

    def fail(event: Event) -> None:
        raise RuntimeError("observer bug")

    session.on_event(fail)
    session.on_event(lambda e: seen.append(e.seq))
    with caplog.at_level(logging.ERROR, logger="corral.session"):
        session.extend(one_turn())
    assert seen == list(range(7))
    assert len(caplog.records) == 7


def test_a_refusing_sink_leaves_nothing_behind() -> None:
    sink = MemorySink()
    session = new_session(sink=sink)
    session.append("turn/start", TURN_1)
    sink.close()
    with pytest.raises(StoreClosedError, match="memory sink is closed"):
        session.extend([("plugin", {"n": 1}), ("plugin", {"n": 2})])
    assert session.last_seq == 0
    assert len(session.events()) == 1


def test_a_batch_refused_by_a_closed_store_leaves_nothing(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s")
    session = store.create_session("s")
    session.append("turn/start", TURN_1)
    store.close()
    with pytest.raises(StoreClosedError, match=r"is closed(:|;) open it again"):
        session.extend([("step/start", StepStart(turn=1, step=1))])
    assert session.last_seq == 0
    assert session.state.open_step is None
    assert [e.seq for e in session.events()] == [0]  # still in memory (never flushed)


def chunks(count: int) -> list[Fact]:
    return [
        ("assistant/chunk", AssistantChunk(turn=1, step=1, chunk=TextDelta(text=f"{n}")))
        for n in range(count)
    ]


def test_the_memory_tail_stays_bounded_after_a_large_batch() -> None:
    sink = DurableSink()
    session = durable_session(sink, tail_bound=8)
    session.extend(chunks(100))
    assert session.resident_events <= 8
    assert [e.data for e in session.events()] == [data for _, data in chunks(100)]


def test_a_batch_of_a_durability_none_session_asks_its_sink_once() -> None:
    sink = DurableSink(manual=True)
    session = durable_session(sink, tail_bound=8)
    session.extend(chunks(100))
    assert sink.flushes == 1
    assert session.resident_events == 100  # nothing is known durable yet
    sink.resolve()
    session.extend(chunks(1))
    assert session.resident_events <= 8


@pytest.mark.parametrize("direct", [1, 1 << 62])
def test_a_batch_is_stored_and_read_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: int
) -> None:
    """Straight to ``events`` (``direct=1``) or through the journal, interleaved with
    single appends and another session's records."""
    monkeypatch.setattr(compaction_module, "DIRECT_MIN_BYTES", direct)
    path = tmp_path / "s"
    types = codec().types
    with Store.open(path, event_types=types) as store:
        session = store.create_session("s")
        other = store.create_session("o")
        written = [session.append("plugin", {"first": True})]
        for turn in range(1, 4):
            other.append("plugin", {"turn": turn})
            written += session.extend([(kind, data) for kind, data in one_turn()][:1])
            written += session.extend(
                ("plugin", {"turn": turn, "n": n, "pad": "x" * 100}) for n in range(50)
            )
        session.flush()
        assert session.resident_events == 0
        assert session.events() == written
    with Store.open(path, readonly=True, event_types=types) as store:
        assert store.read("s") == written
        assert [e.data for e in store.read("o")] == [{"turn": t} for t in (1, 2, 3)]


def test_the_writer_refuses_a_batch_out_of_order_and_queues_none_of_it(tmp_path: Path) -> None:
    env = LmdbEnv(tmp_path / "env", readonly=False, map_size=1 << 20, sync=True)
    writer = LogWriter(env, sync_on_flush=False)
    try:
        writer.track(SessionHeader(id="w", key=1, created=START_TIME), next_seq=0, new=True)
        with pytest.raises(StorageError, match="out of order"):
            writer.submit_many(1, 1, [b"{}", b"{}"])
        with pytest.raises(StorageError, match="unknown session key 2"):
            writer.submit_many(2, 0, [b"{}"])
        writer.submit_many(1, 0, [b'{"a":0}', b'{"a":1}'])
        writer.submit_many(1, 2, [])  # nothing to queue: accepted
        with pytest.raises(StorageError, match="expects seq 2"):
            writer.submit_many(1, 0, [b"{}"])
        writer.flush()
        assert writer.statistics().events_written == 2
    finally:
        writer.close()
    with pytest.raises(StoreClosedError, match=r"is closed(:|;) open it again"):
        writer.submit_many(1, 2, [b"{}"])
    env.close()


def test_the_writer_joins_a_batch_to_the_pending_run_of_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    run = LogWriter._run

    def gated(writer: LogWriter) -> None:  # the writer thread drains nothing until the gate
        gate.wait()
        run(writer)

    monkeypatch.setattr(LogWriter, "_run", gated)
    env = LmdbEnv(tmp_path / "env", readonly=False, map_size=1 << 20, sync=True)
    writer = LogWriter(env, sync_on_flush=False)
    try:
        for key in (1, 2):
            header = SessionHeader(id=f"w{key}", key=key, created=START_TIME)
            writer.track(header, next_seq=0, new=True)
        writer.submit((1, 0, b'{"a":0}'))
        writer.submit_many(1, 1, [b'{"a":1}', b'{"a":2}'])
        writer.submit_many(2, 0, (b'{"b":0}',))  # another session: a run of its own
        writer.submit_many(1, 3, [b'{"a":3}'])
        writer.submit((1, 4, b'{"a":4}'))
        assert [(key, first, list(payloads)) for key, first, payloads in writer._runs] == [
            (1, 0, [b'{"a":%d}' % n for n in range(3)]),
            (2, 0, [b'{"b":0}']),
            (1, 3, [b'{"a":3}', b'{"a":4}']),
        ]
        gate.set()
        writer.flush()
        assert writer.statistics().events_written == 6
    finally:
        gate.set()
        writer.close()
    env.close()


def journal_entries(env: LmdbEnv) -> int:
    """Records in the journal (its frames hold a commit's records each)."""
    with env.reading() as txn:
        return sum(len(t.records) for t in scan_journal(txn, env.dbs.journal, None).values())


def test_a_large_run_of_a_session_with_nothing_in_the_journal_goes_straight_to_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "JOURNAL_IDLE_S", 3600.0)  # no compaction meanwhile
    env = LmdbEnv(tmp_path / "env", readonly=False, map_size=1 << 20, sync=True)
    writer = LogWriter(env, sync_on_flush=False)
    big = [b'{"pad":"%s"}' % (b"x" * 1000)] * (compaction_module.DIRECT_MIN_BYTES // 1000 + 1)
    try:
        for key in (1, 2):
            writer.track(
                SessionHeader(id=f"w{key}", key=key, created=START_TIME), next_seq=0, new=True
            )
        writer.submit_many(1, 0, big)  # large, nothing journaled: straight to events
        writer.submit_many(2, 0, [b"{}"])  # small: the journal
        writer.flush()
        assert set(env.tails) == {2}
        assert journal_entries(env) == 1
        writer.submit_many(2, 1, big)  # large, but behind journaled records: the journal
        writer.flush()
        assert journal_entries(env) == 1 + len(big)
        assert env.rows()[0].last_seq == len(big) - 1  # its row says where it ends
        assert env.tails[2].first == 0
        assert len(env.tails[2].records) == 1 + len(big)
    finally:
        writer.close()
    env.close()
