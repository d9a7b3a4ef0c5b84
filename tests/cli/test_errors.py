"""The errors a person will meet: one ``corral: error:`` line, a non-zero exit code, and
a traceback only with ``--debug``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import lmdb
import msgspec
import pytest

from storage.lmdb.layout import EVENTS_DB, META_DB, SCHEMA_VERSION_KEY, event_key
from storage.lmdb.store import Store
from tests.cli.conftest import assert_one_error_line, corral, write_script

RECORDS = [
    {
        "type": "turn/start",
        "seq": 0,
        "time": 1,
        "data": {"turn": 1, "trigger": {"kind": "message"}},
    },
    {"type": "turn/end", "seq": 1, "time": 2, "data": {"turn": 1, "reason": {"kind": "completed"}}},
]


RECORDS_BYTES = [json.dumps(r).encode() for r in RECORDS]
TORN = b'{"type": "turn/end", "seq": 1, "ti'


def _store_with_session(path: Path, session_id: str = "s1") -> int:
    """A real store holding one small session; returns the session's key."""
    lines = "".join(json.dumps(r) + "\n" for r in RECORDS).encode()
    with Store.open(path) as store:
        store.import_jsonl(io.BytesIO(lines), session_id=session_id)
        store.flush()
        return next(h.key for h in store.sessions() if h.id == session_id)


def _poke(path: Path, db: bytes, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(path), subdir=True, max_dbs=8)
    try:
        handle = env.open_db(db, create=False)
        with env.begin(write=True) as txn:
            txn.put(key, value, db=handle)
    finally:
        env.close()


READ_COMMANDS = [["log", "ls"], ["log", "stats"], ["log", "check"], ["log", "show", "s1"]]


@pytest.mark.parametrize("command", READ_COMMANDS)
def test_a_missing_store_path(tmp_path: Path, command: list[str]) -> None:
    result = corral(*command, "--store", tmp_path / "nowhere")
    assert_one_error_line(result, "no corral store at", "nowhere")


def test_a_store_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a store")
    result = corral("log", "ls", "--store", tmp_path / "file")
    assert_one_error_line(result, "not a directory")


def test_a_directory_that_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    result = corral("bench", "--store", tmp_path, "--agents", "1", "--turns", "1")
    assert_one_error_line(result, "not a corral store")


def test_a_store_of_an_unknown_schema_version(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _store_with_session(store)
    _poke(store, META_DB, SCHEMA_VERSION_KEY, b"99")
    for command in (["log", "ls"], ["bench", "--agents", "1", "--turns", "1"]):
        result = corral(*command, "--store", store)
        assert_one_error_line(result, "schema version 99")


def test_a_store_whose_data_file_is_garbage(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "data.mdb").write_bytes(b"\x00garbage" * 4096)
    result = corral("log", "ls", "--store", store)
    assert_one_error_line(result, "cannot open the store")


def test_a_corrupt_record(tmp_path: Path) -> None:
    store = tmp_path / "store"
    key = _store_with_session(store)
    _poke(store, EVENTS_DB, event_key(key, 0), msgspec.msgpack.encode([RECORDS_BYTES[0], TORN]))
    result = corral("log", "show", "s1", "--store", store)
    assert_one_error_line(result, "corrupt session log", "s1")
    checked = corral("log", "check", "--store", store)
    assert checked.returncode == 3
    assert "[unreadable]" in checked.stdout
    listed = corral("log", "ls", "--store", store)  # the listing goes on around it
    assert listed.returncode == 0, listed.stderr
    row = listed.stdout.splitlines()[1].split()  # session, date, time, turns, state, ...
    # session, date, time, turns, retries, last turn, state, events
    assert (row[0], row[3], row[4], row[6]) == ("s1", "?", "?", "unreadable")


def test_ls_lists_a_session_of_an_unknown_event_type_as_unreadable_next_to_good_ones(
    tmp_path: Path,
) -> None:
    from runtime import Runtime, ScriptedModel

    store = tmp_path / "store"
    with Runtime.open(store) as rt:
        agent = rt.spawn(model=ScriptedModel.echo(), session_id="good")
        agent.followup("hello")
        assert agent.wait_idle(10)
    with Store.open(store) as st:
        st.register_event_type("plugin/hard", None, ignorable=False)
        st.create_session("hard").append("plugin/hard", {"x": 1})
    listed = corral("log", "ls", "--store", store)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:3]}
    # columns: session, date, time, turns, retries, last turn, state, events
    assert rows["good"][3:7] == ["1", "0", "completed", "idle"]
    assert rows["hard"][3:5] == ["?", "?"] and rows["hard"][6] == "unreadable"


@pytest.mark.parametrize("command", [["show"], ["tail"], ["export"], ["tail", "--follow"]])
def test_a_session_id_that_does_not_exist(tmp_path: Path, command: list[str]) -> None:
    store = tmp_path / "store"
    _store_with_session(store)
    result = corral("log", command[0], "ghost", *command[1:], "--store", store)
    assert_one_error_line(result, "no session 'ghost'", "corral log ls")


def test_an_unknown_model_string(tmp_path: Path) -> None:
    result = corral("bench", "--store", tmp_path / "store", "--model", "nosuch:model")
    assert_one_error_line(result, "cannot resolve model 'nosuch:model'")
    assert not (tmp_path / "store").exists()


def test_a_script_that_does_not_exist(tmp_path: Path) -> None:
    result = corral("run", "--store", tmp_path / "store", tmp_path / "missing.py")
    assert_one_error_line(result, "no script at", "missing.py")


def test_a_script_with_a_syntax_error(tmp_path: Path) -> None:
    script = write_script(tmp_path, "syntax.py", "x = (\n")
    result = corral("run", "--store", tmp_path / "store", script)
    assert_one_error_line(result, "syntax.py:1: SyntaxError")


def test_an_import_file_that_is_missing_or_invalid(tmp_path: Path) -> None:
    store = tmp_path / "store"
    missing = corral("log", "import", tmp_path / "missing.jsonl", "--store", store)
    assert_one_error_line(missing, "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "turn/start", "seq": 5, "time": 1, "data": {}}\n')
    invalid = corral("log", "import", bad, "--store", store)
    assert_one_error_line(invalid, "invalid session log", "line 1")


def test_an_empty_import_file_or_stdin_is_refused_and_creates_no_session(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    _store_with_session(store)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    from_file = corral("log", "import", empty, "--store", store)
    assert_one_error_line(from_file, "invalid session log", "the input is empty")
    from_stdin = corral("log", "import", "-", "--store", store, input="")
    assert_one_error_line(from_stdin, "invalid session log", "the input is empty")
    with Store.open(store, readonly=True) as st:
        assert [h.id for h in st.sessions()] == ["s1"]


def test_a_failed_import_leaves_no_store_where_there_was_none(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not an export\n")
    new = tmp_path / "new" / "deeper" / "store"
    assert_one_error_line(corral("log", "import", bad, "--store", new), "invalid session log")
    assert not (tmp_path / "new").exists()
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    assert_one_error_line(corral("log", "import", bad, "--store", empty_dir), "invalid")
    assert list(empty_dir.iterdir()) == []
    existing = tmp_path / "existing"
    _store_with_session(existing)
    assert_one_error_line(corral("log", "import", bad, "--store", existing), "invalid")
    with Store.open(existing, readonly=True) as st:
        assert [h.id for h in st.sessions()] == ["s1"]


def test_debug_adds_the_traceback_before_the_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _store_with_session(store)
    _poke(store, META_DB, SCHEMA_VERSION_KEY, b"99")
    result = corral("--debug", "log", "ls", "--store", store)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "SchemaVersionError" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("corral: error: ")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["log", "tail", "s1", "-f", "--interval", "nan"], "'nan' is not a finite number"),
        (["log", "tail", "s1", "-f", "--interval", "inf"], "not in the range"),
        (["log", "tail", "s1", "-f", "--interval", "1e300"], "not in the range"),
        (["bench", "--failure-rate", "nan"], "'nan' is not a finite number"),
        (["bench", "--latency", "nan"], "'nan' is not a finite number"),
        (["bench", "--latency-jitter", "inf"], "'inf' is not a finite number"),
        (["bench", "--timeout", "nan"], "'nan' is not a finite number"),
        (["bench", "--timeout", "inf"], "'inf' is not a finite number"),
    ],
)
def test_a_number_option_that_is_not_finite_is_a_usage_error(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    store = tmp_path / "store"
    result = corral(*args, "--store", store)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert not store.exists()  # refused before anything ran


@pytest.mark.parametrize(
    ("args", "needle", "help_of"),
    [
        (["bench", "--agents", "0"], "Invalid value for '--agents'", "corral bench"),
        (["--bogus"], "No such option '--bogus'", "corral"),
        (["nosuch"], "No such command 'nosuch'", "corral"),
        (["log", "shw"], "Did you mean 'show'?", "corral log"),
        (["log", "show"], "Missing argument 'SESSION'", "corral log show"),
        (
            ["log", "tail", "s1", "--interval", "nan"],
            "'nan' is not a finite number",
            "corral log tail",
        ),
        (["run"], "Missing argument 'SCRIPT'", "corral run"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_commands_help(
    tmp_path: Path, args: list[str], needle: str, help_of: str
) -> None:
    result = corral(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    line = assert_one_error_line(result, needle)
    assert line.endswith(f"(see {help_of} --help)"), line
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [["log", "show", "nosuch", "--store", "store"], ["log", "ls", "--store", "nonexist"]],
)
def test_debug_prints_the_traceback_of_an_error_the_cli_detects_itself(
    tmp_path: Path, args: list[str]
) -> None:
    _store_with_session(tmp_path / "store")
    result = corral("--debug", *args, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert "CliError" in result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("corral: error: no ") and ("nosuch" in last or "nonexist" in last)


def test_an_empty_import_session_id_is_a_usage_error_in_cli_words(tmp_path: Path) -> None:
    source = tmp_path / "source"
    _store_with_session(source)
    export = tmp_path / "s1.jsonl"
    assert corral("log", "export", "s1", "-o", export, "--store", source).returncode == 0
    store = tmp_path / "new"
    result = corral("log", "import", export, "--session-id", "", "--store", store)
    assert result.returncode == 2, result.stderr
    line = assert_one_error_line(result, "must not be empty", "leave --session-id out")
    assert "None" not in line
    assert not store.exists()  # refused before the store was made
