"""The codec: type registry, lossless-JSON validation, record bytes."""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

import msgspec
import pytest

from storage import (
    Codec,
    Event,
    EventTooLargeError,
    EventTypes,
    InvalidEventError,
    LogCorruptError,
    UnknownEventTypeError,
)
from storage.events import (
    Errored,
    IgnoredRecord,
    LlmFailure,
    LlmRetry,
    MessageTrigger,
    RequestConfig,
    RequestHeader,
    StepStart,
    ToolSpec,
    TurnEnd,
    TurnStart,
)
from storage.lossless import MAX_JSON_DEPTH
from tests.storage.builders import (
    LogBuilder,
    completed_turn,
    open_turn_with_pending_call,
    tool_turn,
)


class Note(msgspec.Struct, frozen=True):
    text: str
    score: float = 0.0


def codec(**kwargs: Any) -> Codec:
    types = EventTypes.default()
    types.register("plugin/note", Note)
    types.register("plugin/blob")
    types.register("plugin/trace", ignorable=True)
    return Codec(types, **kwargs)


def header_with(parameters: dict[str, Any], temperature: float | None = 0.5) -> RequestHeader:
    config = RequestConfig(provider="p", model="m", temperature=temperature)
    return RequestHeader(
        turn=1, step=1, config=config, tools=(ToolSpec(name="t", parameters=parameters),)
    )


def error_of(type: str, data: object) -> str:
    with pytest.raises(InvalidEventError) as caught:
        codec().prepare(type, data)
    return str(caught.value)


# --------------------------------------------------------------------------- registry


def test_each_default_registry_is_a_new_one_not_a_process_global() -> None:
    first, second = EventTypes.default(), EventTypes.default()
    first.register("plugin/x")
    assert first.is_known("plugin/x")
    assert not second.is_known("plugin/x")
    assert second.is_known("turn/start")


def test_registering_the_same_definition_twice_is_a_no_op_but_a_different_one_is_refused() -> None:
    types = EventTypes.default()
    types.register("plugin/x", Note)
    types.register("plugin/x", Note)
    with pytest.raises(InvalidEventError, match="already registered"):
        types.register("plugin/x", Note, ignorable=True)
    with pytest.raises(InvalidEventError, match="already registered"):
        types.register("turn/start", StepStart)


def test_a_plugin_struct_may_not_carry_surface_fields() -> None:
    class Sneaky(msgspec.Struct, rename="camel"):
        surface_op: str = "append"

    with pytest.raises(InvalidEventError, match="surfaceOp"):
        EventTypes.default().register("plugin/sneaky", Sneaky)


def test_a_data_type_must_be_a_struct() -> None:
    with pytest.raises(InvalidEventError, match=r"msgspec\.Struct"):
        EventTypes.default().register("plugin/bad", dict)  # type: ignore[arg-type]


def test_ignorable_is_reported_per_type() -> None:
    types = codec().types
    assert types.is_ignorable("plugin/trace")
    assert not types.is_ignorable("plugin/blob")
    assert not types.is_ignorable("nope")


# --------------------------------------------------------------------------- prepare


def test_a_typed_fact_of_the_right_class_passes_through_unchanged() -> None:
    data = TurnStart(turn=1, trigger=MessageTrigger())
    assert codec().prepare("turn/start", data) is data


def test_a_mapping_in_the_durable_shape_is_converted_to_the_struct() -> None:
    prepared = codec().prepare("turn/start", {"turn": 2, "trigger": {"kind": "retry"}})
    assert isinstance(prepared, TurnStart)
    assert prepared.turn == 2


def test_a_mapping_of_the_wrong_shape_names_the_path() -> None:
    message = error_of("turn/start", {"turn": "two", "trigger": {"kind": "message"}})
    assert "$.data.turn" in message
    assert "int" in message


def test_a_struct_of_another_type_is_refused() -> None:
    message = error_of("turn/start", StepStart(turn=1, step=1))
    assert "expected a TurnStart" in message
    assert "StepStart" in message


def test_an_unknown_type_is_refused_with_a_hint_to_register_it() -> None:
    with pytest.raises(UnknownEventTypeError, match="register"):
        codec().prepare("plugin/unknown", {})


@pytest.mark.parametrize(
    ("data", "path"),
    [
        (header_with({}, temperature=math.nan), "$.data.config.temperature"),
        (header_with({}, temperature=math.inf), "$.data.config.temperature"),
        (header_with({"enum": [1, math.nan]}), "$.data.tools[0].parameters.enum[1]"),
    ],
)
def test_non_finite_floats_are_refused_inside_typed_facts(data: object, path: str) -> None:
    message = error_of("request/header", data)
    assert path in message
    assert "a finite number" in message


def test_a_non_finite_float_deep_inside_a_union_is_found() -> None:
    failure = LlmFailure(message="x", retry_after_s=-math.inf)
    message = error_of("turn/end", TurnEnd(turn=1, reason=Errored(error=failure)))
    assert "$.data.reason.error.retryAfterS" in message
    assert "-Infinity" in message


def test_a_plain_float_field_holding_nan_is_refused() -> None:
    retry = LlmRetry(turn=1, attempt=1, delay_s=math.nan, failure=LlmFailure(message="x"))
    assert "$.data.delayS" in error_of("llm/retry", retry)


class Point(msgspec.Struct, frozen=True):
    x: float


class Segment(msgspec.Struct, frozen=True):
    start: Point
    end: Point  # the same struct twice: its plan is compiled once and used for both


class Tree(msgspec.Struct, frozen=True):
    weight: float
    children: list[Tree] = []


def test_a_struct_used_twice_in_a_schema_is_checked_at_both_places() -> None:
    types = EventTypes.default()
    types.register("plugin/segment", Segment)
    types.register("plugin/tree", Tree)
    refused = Codec(types)
    with pytest.raises(InvalidEventError, match=re.escape("$.data.end.x")):
        refused.prepare("plugin/segment", Segment(Point(1.0), Point(math.nan)))
    deep = Tree(1.0, [Tree(2.0), Tree(3.0, [Tree(math.inf)])])
    with pytest.raises(InvalidEventError, match=re.escape("$.data.children[1].children[0].weight")):
        refused.prepare("plugin/tree", deep)


def test_built_in_facts_without_floats_or_free_form_parts_have_no_plan() -> None:
    kinds = EventTypes.default().kinds
    checked = sorted(name for name, kind in kinds.items() if kind.check is not None)
    assert checked == ["llm/retry", "request/header", "turn/end"]


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ({1, 2}, "a set"),
        (b"raw", "a bytes"),
        ((1, 2), "a tuple"),
        (datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), "a datetime"),
        (object(), "a object"),
        (Note(text="x"), "a Note struct"),
    ],
)
def test_non_plain_objects_are_refused_with_a_hint(value: object, found: str) -> None:
    message = error_of("plugin/blob", {"items": [0, {"x": value}]})
    assert "$.data.items[1].x" in message
    assert found in message
    assert "Nothing was written" in message


def test_non_string_keys_are_refused() -> None:
    message = error_of("request/header", header_with({"properties": {1: "one"}}))
    assert "$.data.tools[0].parameters.properties" in message
    assert "string keys" in message


def test_a_cycle_is_refused_with_a_clear_error_not_a_recursion_error() -> None:
    data: dict[str, Any] = {"a": []}
    data["a"].append(data)
    message = error_of("plugin/blob", data)
    assert "cycle" in message
    assert "$.data.a[0]" in message


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    deep: Any = "leaf"
    for _ in range(MAX_JSON_DEPTH + 5):
        deep = [deep]
    assert "levels of nesting" in error_of("plugin/blob", {"deep": deep})


def test_odd_keys_are_shown_quoted_in_the_path() -> None:
    assert "$.data['a key'][0]" in error_of("plugin/blob", {"a key": [math.nan]})


@pytest.mark.parametrize("key", ["surfaceOp", "sourceEventSeqs"])
def test_a_plugin_object_may_not_carry_surface_fields(key: str) -> None:
    message = error_of("plugin/blob", {key: []})
    assert f"$.data.{key}" in message
    assert "only user/message, assistant/message and tool/result" in message


def test_plugin_data_must_be_a_json_object() -> None:
    assert "expected a JSON object" in error_of("plugin/blob", [1, 2])


def test_plugin_data_is_copied_so_later_mutation_cannot_change_the_event() -> None:
    original = {"items": [1, 2]}
    prepared = codec().prepare("plugin/blob", original)
    original["items"].append(3)
    assert prepared == {"items": [1, 2]}


def test_a_typed_plugin_fact_is_validated_like_a_built_in_one() -> None:
    assert "$.data.score" in error_of("plugin/note", Note(text="x", score=math.nan))


# --------------------------------------------------------------------------- encode


def test_the_record_is_the_envelope_with_camel_case_data() -> None:
    event = Event("step/start", 3, 1000, StepStart(turn=1, step=2))
    payload = codec().encode(event)
    assert payload == b'{"type":"step/start","seq":3,"time":1000,"data":{"turn":1,"step":2}}'


def test_a_turn_start_names_its_durability_only_when_it_is_not_write_ahead() -> None:
    c = codec()
    write_ahead = Event("turn/start", 0, 1, TurnStart(turn=1, trigger=MessageTrigger()))
    old = b'{"type":"turn/start","seq":0,"time":1,"data":{"turn":1,"trigger":{"kind":"message"}}}'
    assert c.encode(write_ahead) == old  # as before the field existed
    assert c.decode(old, session_id="s") == write_ahead  # an old log reads as write-ahead
    turn = Event("turn/start", 0, 1, TurnStart(turn=1, trigger=MessageTrigger(), durability="turn"))
    payload = c.encode(turn)
    assert msgspec.json.decode(payload)["data"]["durability"] == "turn"
    assert c.decode(payload, session_id="s") == turn


def test_ignorable_types_are_marked_in_their_records() -> None:
    payload = codec().encode(Event("plugin/trace", 0, 1, {"x": 1}))
    assert msgspec.json.decode(payload)["ignorable"] is True


def test_an_oversize_event_is_refused_naming_size_and_limit() -> None:
    small = codec(max_event_bytes=100)
    with pytest.raises(EventTooLargeError) as caught:
        small.encode(Event("plugin/blob", 7, 1, {"x": "y" * 200}))
    message = str(caught.value)
    assert "seq 7" in message
    assert "over the limit of 100 bytes" in message


def test_the_size_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Codec(EventTypes.default(), max_event_bytes=0)


# --------------------------------------------------------------------------- decode


def every_kind_of_event() -> list[Event]:
    log = LogBuilder()
    completed_turn(log)
    tool_turn(log, calls=[("c1", "echo", '{"x": 1.5}'), ("c2", "grep", "{}")])
    open_turn_with_pending_call(log)
    log.add("request/header", header_with({"type": "object", "x": [1, 2.5, None, True]}))
    log.plugin("plugin/note", Note(text="n", score=0.1))
    log.plugin("plugin/blob", {"nested": {"list": [1, "two", 3.25, False, None]}, "é": "ü"})
    log.plugin("plugin/trace", {"span": 1})
    return log.events


@pytest.mark.parametrize("event", every_kind_of_event(), ids=lambda e: f"{e.seq}-{e.type}")
def test_records_round_trip_byte_identically(event: Event) -> None:
    c = codec()
    payload = c.encode(event)
    decoded = c.decode(payload, session_id="s")
    assert decoded == event
    assert decoded is not None
    assert c.encode(decoded) == payload


def test_an_unknown_ignorable_record_decodes_as_none() -> None:
    payload = codec().encode(Event("plugin/trace", 4, 1, {"x": 1}))
    assert Codec(EventTypes.default()).decode(payload, session_id="s") is None


def test_an_unknown_record_that_is_not_ignorable_names_session_and_seq() -> None:
    payload = codec().encode(Event("plugin/blob", 4, 1, {"x": 1}))
    with pytest.raises(UnknownEventTypeError, match=r"session 's-9' seq 4.*'plugin/blob'"):
        Codec(EventTypes.default()).decode(payload, session_id="s-9")


def test_an_undecodable_record_is_reported_as_corrupt() -> None:
    with pytest.raises(LogCorruptError, match="session 's-9'"):
        codec().decode(b'{"type": "turn/st', session_id="s-9")


def test_data_that_does_not_match_its_schema_names_session_and_seq() -> None:
    payload = b'{"type":"step/start","seq":5,"time":1,"data":{"turn":"x","step":1}}'
    with pytest.raises(LogCorruptError, match=r"session 's-9' seq 5"):
        codec().decode(payload, session_id="s-9")


def test_a_mapping_for_a_typed_fact_is_checked_before_conversion() -> None:
    data = {
        "turn": 1,
        "step": 1,
        "config": {"provider": "p", "model": "m", "temperature": math.nan},
    }
    assert "$.data.config.temperature" in error_of("request/header", data)


# --------------------------------------------------------------------------- decode_run


def test_decode_run_reads_what_decode_reads_one_record_at_a_time() -> None:
    c = codec()
    events = every_kind_of_event()
    payloads = [c.encode(event) for event in events]
    assert c.decode_run(payloads, first_seq=0, session_id="s") == events
    assert [c.decode(p, session_id="s") for p in payloads] == events


def test_decode_run_skips_unknown_ignorable_records_and_refuses_unknown_others() -> None:
    writer = codec()
    plain = Codec(EventTypes.default())  # knows neither plugin/trace nor plugin/note
    turn = writer.encode(Event("turn/start", 0, 1, TurnStart(turn=1, trigger=MessageTrigger())))
    trace = writer.encode(Event("plugin/trace", 1, 1, {"span": 1}))
    note = writer.encode(Event("plugin/note", 2, 1, Note(text="n")))
    decoded = plain.decode_run([turn, trace], first_seq=0, session_id="s")
    assert [e.type for e in decoded] == ["turn/start"]
    with pytest.raises(UnknownEventTypeError, match=r"session 's' seq 2: unknown event type"):
        plain.decode_run([turn, trace, note], first_seq=0, session_id="s")


def test_unknown_ignorable_records_read_as_placeholders_on_request() -> None:
    writer = codec()
    plain = Codec(EventTypes.default())  # does not know plugin/trace
    turn = writer.encode(Event("turn/start", 0, 1, TurnStart(turn=1, trigger=MessageTrigger())))
    trace = writer.encode(Event("plugin/trace", 1, 7, {"span": 1}))
    placeholder = Event("plugin/trace", 1, 7, IgnoredRecord(raw=trace))
    decoded = plain.decode_run([turn, trace], first_seq=0, session_id="s", include_ignored=True)
    assert [e.type for e in decoded] == ["turn/start", "plugin/trace"]
    assert decoded[1] == placeholder
    assert plain.decode(trace, session_id="s", include_ignored=True) == placeholder
    known = writer.decode_run([turn, trace], first_seq=0, session_id="s", include_ignored=True)
    assert known[1] == Event("plugin/trace", 1, 7, {"span": 1})  # a known type is decoded
    with pytest.raises(LogCorruptError, match="stored at seq 5 says seq 1"):
        plain.decode_run([trace], first_seq=5, session_id="s", include_ignored=True)


def test_a_type_registered_after_the_first_decode_is_decoded_too() -> None:
    types = EventTypes.default()
    c = Codec(types)
    start = Event("step/start", 0, 1, StepStart(turn=1, step=1))
    assert c.decode(c.encode(start), session_id="s") == start  # builds the one-pass decoder
    types.register("plugin/note", Note)
    note = Event("plugin/note", 1, 1, Note(text="later", score=2.5))
    assert c.decode_run([c.encode(note)], first_seq=1, session_id="s") == [note]


def test_decode_run_names_the_seq_of_a_record_stored_at_another_seq() -> None:
    c = codec()
    payload = c.encode(Event("step/start", 7, 1, StepStart(turn=1, step=1)))
    with pytest.raises(LogCorruptError, match="the record stored at seq 3 says seq 7"):
        c.decode_run([payload], first_seq=3, session_id="s")


@pytest.mark.parametrize(
    "payload",
    [
        b'{"type":"step/start","seq":0,"time":1,"data":{"turn":"one","step":1}}',
        b'{"type":"step/start","seq":0,"time":1}',
        b'{"type":"step/start","seq":0,',
        b"[]",
    ],
    ids=["data-off-schema", "no-data", "truncated", "not-an-object"],
)
def test_decode_run_names_the_seq_of_a_record_that_does_not_decode(payload: bytes) -> None:
    c = codec()
    good = c.encode(Event("turn/start", 4, 1, TurnStart(turn=1, trigger=MessageTrigger())))
    with pytest.raises(LogCorruptError, match=r"seq 5") as caught:
        c.decode_run([good, payload], first_seq=4, session_id="s")
    assert "'s'" in str(caught.value)
