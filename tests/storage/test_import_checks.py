"""An import is all or nothing: a session that fails any check (decoding, references,
the invariant checker) writes nothing, and the error names the first violation; a line
over the size limit is refused without being read whole."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from storage import EventTooLargeError, InvalidEventError, Store
from tests.storage.builders import LogBuilder, completed_turn, ticking_clock, tool_turn

Records = list[dict[str, Any]]


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "target") as store:
        yield store


@pytest.fixture
def records(tmp_path: Path) -> Records:
    """A sound three-turn session with a tool call, as the records of its export."""
    with Store.open(tmp_path / "source", clock=ticking_clock()) as store:
        log = LogBuilder(store.create_session("s"))
        completed_turn(log)
        tool_turn(log)
        completed_turn(log)
        out = io.BytesIO()
        store.export_jsonl("s", out)
    return [json.loads(line) for line in out.getvalue().splitlines()[1:]]


def as_file(records: Records) -> io.BytesIO:
    return io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in records))


def index_of(records: Records, kind: str) -> int:
    return next(i for i, r in enumerate(records) if r["type"] == kind)


def drop_step_start(records: Records) -> Records:
    """The probe's case: a ``step/start`` dropped and the later seqs renumbered, so
    that citations point past where they should."""
    at = index_of(records, "step/start")
    kept = records[:at] + records[at + 1 :]
    for seq, record in enumerate(kept):
        record["seq"] = seq
    return kept


def swap_call_and_result(records: Records) -> Records:
    call, result = index_of(records, "tool/call"), index_of(records, "tool/result")
    records[call], records[result] = records[result], records[call]
    records[call]["seq"], records[result]["seq"] = call, result
    return records


def renumber_turns(records: Records) -> Records:
    for record in records:
        if "turn" in record["data"] and isinstance(record["data"]["turn"], int):
            record["data"]["turn"] = 7
    return records


@pytest.mark.parametrize(
    ("craft", "rule"),
    [
        (drop_step_start, "[outside-step]"),
        (swap_call_and_result, "[tool-result-unmatched]"),
        (renumber_turns, "[turn-number]"),
    ],
)
def test_a_session_that_breaks_an_invariant_imports_nothing_and_the_error_names_it(
    target: Store, records: Records, craft: Callable[[Records], Records], rule: str
) -> None:
    sound = json.loads(json.dumps(records))
    with pytest.raises(InvalidEventError, match="nothing was written") as refused:
        target.import_jsonl(as_file(craft(records)), session_id="s")
    assert rule in str(refused.value)
    target.flush()
    assert target.sessions() == []
    assert target.statistics().events_written == 0
    imported = target.import_jsonl(as_file(sound), session_id="s")  # not "already exists"
    assert imported.last_seq == len(sound) - 1


def test_an_open_tail_turn_imports_for_the_resume_to_repair(
    target: Store, records: Records
) -> None:
    open_tail = records[: index_of(records, "tool/result")]
    imported = target.import_jsonl(as_file(open_tail), session_id="s")
    assert imported.state.open_calls


class CountingReader(io.BytesIO):
    """An input that counts the bytes handed out."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.handed = 0

    def readline(self, size: int | None = -1) -> bytes:
        line = super().readline(size)
        self.handed += len(line)
        return line

    def __iter__(self) -> Iterator[bytes]:  # a whole line at a time would defeat the bound
        raise AssertionError("the import must read with a bound, not line by line whole")


def test_a_line_over_the_limit_is_refused_after_reading_no_more_than_the_limit(
    tmp_path: Path, records: Records
) -> None:
    limit = 64 << 10
    head = as_file(records[:3]).getvalue()
    huge = b'{"type":"plugin/note","seq":3,"time":1,"data":{"x":"' + b"x" * (8 << 20) + b'"}}\n'
    source = CountingReader(head + huge)
    with Store.open(tmp_path / "small", max_event_bytes=limit) as store:
        with pytest.raises(EventTooLargeError, match="line 4: the record is over"):
            store.import_jsonl(source, session_id="s")
        assert store.sessions() == []
    assert source.handed <= len(head) + limit + 2
