"""``corral log``: every subcommand against a store another process wrote."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from storage import Store
from tests.cli.conftest import (
    SESSIONS,
    assert_one_error_line,
    corral,
    run_ok,
    spawn_corral,
    write_script,
)


def test_ls_lists_every_session_with_its_turns_and_last_turn_state(written_store: Path) -> None:
    out = run_ok(["log", "ls", "--store", written_store])
    rows = [
        line.split() for line in out.splitlines() if line.split()[:1] in ([s] for s in SESSIONS)
    ]
    assert [row[0] for row in rows] == list(SESSIONS)
    for row in rows:
        # session, date, time, turns, retries, last turn, state, events: one follow-up is
        # one turn, its failed request's retry turn is counted apart
        assert row[3] == "1"
        assert row[4] == "1"
        assert row[5] == "completed"
        assert row[6] == "idle"
    assert "3 session(s)" in out


def test_show_prints_a_readable_transcript(written_store: Path) -> None:
    out = run_ok(["log", "show", "alpha", "--store", written_store])
    for needle in (
        "turn 1 starts (message)",
        "user: question for alpha",
        "tool call lookup",
        "tool result lookup: value-of-k1",
        "turn 1 ends: error SERVER: overloaded",
        "retry #1",
        "turn 2 starts (retry",
        "assistant: the answer is 42",
        "turn 2 ends: completed",
    ):
        assert needle in out, out


def test_show_raw_prints_every_stored_event_as_a_json_line(written_store: Path) -> None:
    out = run_ok(["log", "show", "beta", "--raw", "--store", written_store])
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert {"turn/start", "tool/call", "tool/result", "llm/retry"} <= {e["type"] for e in events}


def test_tail_without_follow_prints_the_last_events_and_exits(written_store: Path) -> None:
    out = run_ok(["log", "tail", "gamma", "-n", "3", "--store", written_store])
    lines = out.splitlines()
    assert len(lines) == 3
    assert "turn 2 ends: completed" in lines[-1]


def test_export_then_import_round_trips_the_records_byte_for_byte(
    written_store: Path, tmp_path: Path
) -> None:
    exported = tmp_path / "alpha.jsonl"
    result = corral("log", "export", "alpha", "-o", exported, "--store", written_store)
    assert result.returncode == 0, result.stderr
    to_stdout = run_ok(["log", "export", "alpha", "--store", written_store])
    assert to_stdout == exported.read_text()

    other = tmp_path / "other"
    out = run_ok(["log", "import", exported, "--session-id", "copy", "--store", other])
    assert "as session copy" in out
    again = run_ok(["log", "export", "copy", "--store", other])
    assert again.splitlines()[1:] == to_stdout.splitlines()[1:]  # header names the new id

    duplicate = corral("log", "import", exported, "--session-id", "copy", "--store", other)
    assert_one_error_line(duplicate, "copy", "--session-id")


def test_an_import_that_fails_its_checks_leaves_no_session_behind(
    written_store: Path, tmp_path: Path
) -> None:
    exported = tmp_path / "alpha.jsonl"
    run_ok(["log", "export", "alpha", "-o", exported, "--store", written_store])
    lines = exported.read_text().splitlines()
    records = [json.loads(line) for line in lines[1:]]
    at = next(i for i, r in enumerate(records) if r["type"] == "step/start")
    del records[at]  # the probe's case: later records then cite seqs past their own
    for seq, record in enumerate(records):
        record["seq"] = seq
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(json.dumps(r) + "\n" for r in [json.loads(lines[0]), *records]))
    other = tmp_path / "other"
    refused = corral("log", "import", broken, "--session-id", "copy", "--store", other)
    assert_one_error_line(refused, "invariants", "nothing was written")
    assert refused.returncode == 1
    listing = corral("log", "ls", "--store", other)
    assert "copy" not in listing.stdout
    run_ok(["log", "import", exported, "--session-id", "copy", "--store", other])
    assert "invariants: 1 session OK" in run_ok(["log", "check", "--store", other])


def test_check_passes_on_sound_logs(written_store: Path) -> None:
    out = run_ok(["log", "check", "--store", written_store])
    assert "invariants: 3 sessions OK" in out


def test_check_fails_listing_a_step_outside_a_turn(tmp_path: Path) -> None:
    crafted = tmp_path / "bad.jsonl"
    records = [
        {
            "type": "turn/start",
            "seq": 0,
            "time": 1,
            "data": {"turn": 1, "trigger": {"kind": "message"}},
        },
        {
            "type": "turn/end",
            "seq": 1,
            "time": 2,
            "data": {"turn": 1, "reason": {"kind": "completed"}},
        },
        {"type": "step/start", "seq": 2, "time": 3, "data": {"turn": 1, "step": 1}},
        {"type": "step/end", "seq": 3, "time": 4, "data": {"turn": 1, "step": 1}},
    ]
    crafted.write_text("".join(json.dumps(r) + "\n" for r in records))
    store = tmp_path / "store"
    refused = corral("log", "import", crafted, "--session-id", "crafted", "--store", store)
    assert refused.returncode == 1, refused.stderr  # all or nothing: nothing written
    assert "[step-outside-turn]" in refused.stderr
    with Store.open(store) as opened:  # appended one by one, the log takes them
        session = opened.create_session("crafted")
        for record in records:
            session.append(str(record["type"]), record["data"])

    result = corral("log", "check", "--store", store)
    assert result.returncode == 3
    assert "crafted" in result.stdout
    assert "[step-outside-turn]" in result.stdout
    assert_one_error_line(result, "1 of 1 sessions")


def import_log_with_plugin_records(tmp_path: Path) -> Path:
    """A store holding session ``plugged``: one turn whose user message cites a record
    of an ignorable plugin type, another such record after it. The CLI registers no
    plugin type."""
    note = {"type": "plugin/note", "data": {"text": "from a plugin"}, "ignorable": True}
    message = {
        "message": {"role": "user", "id": "m-1", "content": [{"type": "text", "text": "hi"}]},
        "turn": 1,
        "step": 1,
        "surfaceOp": {"kind": "append"},
        "sourceEventSeqs": [2],
    }
    records = [
        {"type": "turn/start", "data": {"turn": 1, "trigger": {"kind": "message"}}},
        {"type": "step/start", "data": {"turn": 1, "step": 1}},
        note,
        {"type": "user/message", "data": message},
        {"type": "step/end", "data": {"turn": 1, "step": 1}},
        {"type": "turn/end", "data": {"turn": 1, "reason": {"kind": "completed"}}},
        note,
    ]
    crafted = tmp_path / "plugged.jsonl"
    lines = [json.dumps({**r, "seq": seq, "time": 1 + seq}) for seq, r in enumerate(records)]
    crafted.write_text("".join(line + "\n" for line in lines))
    store = tmp_path / "store"
    run_ok(["log", "import", crafted, "--session-id", "plugged", "--store", store])
    return store


def test_check_accounts_for_records_of_ignorable_types_it_does_not_know(tmp_path: Path) -> None:
    store = import_log_with_plugin_records(tmp_path)
    out = run_ok(["log", "check", "--store", store])
    assert "invariants: 1 session OK" in out
    assert "checked for their seq only: plugin/note (2)" in out


def test_show_and_tail_print_records_of_unknown_ignorable_types_as_ignored_plugin_events(
    tmp_path: Path,
) -> None:
    store = import_log_with_plugin_records(tmp_path)
    shown = run_ok(["log", "show", "plugged", "--store", store])
    ignored = 'ignored plugin event plugin/note (type not known here): {"text": "from a plugin"}'
    assert shown.count(ignored) == 2, shown
    assert "7 events" in shown
    tail = run_ok(["log", "tail", "plugged", "-n", "2", "--store", store]).splitlines()
    assert len(tail) == 2
    assert tail[0].split()[0] == "5" and "turn 1 ends" in tail[0]
    assert tail[1].split()[0] == "6" and ignored in tail[1]
    raw = run_ok(["log", "tail", "plugged", "-n", "1", "--raw", "--store", store])
    assert json.loads(raw) == {
        "type": "plugin/note",
        "seq": 6,
        "time": 7,
        "data": {"text": "from a plugin"},
        "ignorable": True,
    }


def test_stats_reports_sessions_events_and_sizes(written_store: Path) -> None:
    out = run_ok(["log", "stats", "--store", written_store])
    fields = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert fields["sessions"].split()[-1] == "3"
    assert int(fields["events"].split()[-1].replace(",", "")) > 30
    assert "map" in fields and "bytes" in fields


class _Reader:
    """Collects a stream's lines on a thread so the test can wait for one."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)

    def wait_for(self, needle: str, timeout: float = 30) -> list[str]:
        seen: list[str] = []
        while True:
            line = self.lines.get(timeout=timeout)
            seen.append(line)
            if needle in line:
                return seen


FOLLOWED = """
import sys
from runtime import ScriptedModel

def main(rt, argv):
    agent = rt.spawn(model=ScriptedModel.echo(), session_id="live")
    agent.followup("first message")
    agent.wait_idle(10)
    rt.flush()
    print("ready", flush=True)
    for line in sys.stdin:
        agent.followup(line.strip())
        agent.wait_idle(10)
        rt.flush()
        print("done", flush=True)
"""


def test_tail_follow_prints_events_another_process_appends_and_ctrl_c_ends_it(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    script = write_script(tmp_path, "w.py", FOLLOWED)
    with spawn_corral("run", "--store", store, script) as writer:
        assert writer.stdin is not None and writer.stdout is not None
        written = _Reader(writer.stdout)
        written.wait_for("ready")
        with spawn_corral(
            "log", "tail", "live", "--follow", "--interval", "0.05", "-n", "100", "--store", store
        ) as follower:
            assert follower.stdout is not None and follower.stderr is not None
            followed = _Reader(follower.stdout)
            followed.wait_for("first message")
            writer.stdin.write("second message\n")
            writer.stdin.flush()
            written.wait_for("done")
            seen = followed.wait_for("turn 2 ends: completed")
            assert any("user: second message" in line for line in seen)

            follower.send_signal(signal.SIGINT)  # Ctrl-C
            assert follower.wait(timeout=10) == 0
            followed.thread.join(10)
            assert "Traceback" not in follower.stderr.read()
        writer.stdin.close()
        assert writer.wait(timeout=30) == 0
        written.thread.join(10)


def test_an_export_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    import os
    import stat

    from runtime import Runtime, ScriptedModel

    store = tmp_path / "store"
    with Runtime.open(store) as rt:
        agent = rt.spawn(model=ScriptedModel.echo(), session_id="private")
        agent.followup("a secret plan")
        assert agent.wait_idle(10)
    out = tmp_path / "export.jsonl"
    old = os.umask(0)
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "runtime.cli",
                "log",
                "export",
                "private",
                "--store",
                str(store),
                "-o",
                str(out),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


MARKUP_IDS = ("[/x]", "[red]RED", ":x:[bold]")


def test_ids_paths_and_text_holding_rich_markup_are_printed_as_they_are(tmp_path: Path) -> None:
    from runtime import Runtime, ScriptedModel

    store = Path("p[/x]") / "q[red]:x:"  # relative to tmp_path: one table row, unwrapped
    with Runtime.open(tmp_path / store) as rt:
        for sid in MARKUP_IDS:
            agent = rt.spawn(model=ScriptedModel.echo(), session_id=sid)
            agent.followup(f"say [bold]{sid}[/bold] :x:")
            assert agent.wait_idle(10)

    def ok(*args: str | Path) -> str:
        result = corral(*args, "--store", store, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stdout

    listed = ok("log", "ls")
    assert {line.split()[0] for line in listed.splitlines()[1:4]} == set(MARKUP_IDS)
    assert f"3 session(s) in {store}" in listed
    assert f"{store} (schema version" in ok("log", "stats")
    for sid in MARKUP_IDS:
        shown = ok("log", "show", sid)
        assert shown.startswith(f"session {sid}  created"), shown
        assert f"user: say [bold]{sid}[/bold] :x:" in shown
        assert f"user: say [bold]{sid}[/bold] :x:" in ok("log", "tail", sid)
    assert "invariants: 3 sessions OK" in ok("log", "check")


def _long_store(tmp_path: Path, session_id: str = "long", turns: int = 300) -> Path:
    """A store whose one session's export is far larger than a pipe's buffer."""
    from runtime import Runtime, ScriptedModel

    store = tmp_path / "store"
    with Runtime.open(store) as rt:
        agent = rt.spawn(model=ScriptedModel.echo(chunks=4), session_id=session_id)
        for turn in range(turns):
            agent.followup(f"{turn} " + "x" * 200)
            assert agent.wait_idle(10)
    return store


def test_exporting_into_the_stores_own_data_file_is_refused_and_the_store_survives(
    tmp_path: Path,
) -> None:
    store = _long_store(tmp_path, turns=3)
    for name in ("data.mdb", "lock.mdb"):
        result = corral("log", "export", "long", "--store", store, "-o", store / name)
        assert_one_error_line(result, f"is the store's own {name}")
    link = tmp_path / "link.jsonl"
    link.symlink_to(store / "data.mdb")
    assert_one_error_line(corral("log", "export", "long", "--store", store, "-o", link))
    assert "invariants: 1 session OK" in run_ok(["log", "check", "--store", store])


def test_ls_into_a_pipe_prints_whole_session_ids(tmp_path: Path) -> None:
    sid = "a-session-id-far-longer-than-an-eighty-column-table-leaves-for-it-" + "z" * 20
    store = _long_store(tmp_path, session_id=sid, turns=1)
    listed = run_ok(["log", "ls", "--store", store])  # stdout is a pipe here
    assert listed.splitlines()[1].split()[0] == sid


def test_a_reader_closing_the_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    store = _long_store(tmp_path)
    for args in (["export", "long"], ["tail", "long", "-n", "5000", "--raw"], ["show", "long"]):
        with spawn_corral("log", *args, "--store", store) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.readline()  # like `| head -1`
            proc.stdout.close()
            assert proc.wait(timeout=30) == 1
            assert proc.stderr.read() == "", args


def test_ctrl_c_while_tail_follow_prints_its_first_lines_exits_0(tmp_path: Path) -> None:
    store = _long_store(tmp_path)
    with spawn_corral("log", "tail", "long", "-f", "-n", "5000", "--raw", "--store", store) as p:
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline()  # printing has begun; the rest fills the pipe and waits
        p.send_signal(signal.SIGINT)
        p.stdout.read()  # let the interrupted process flush what it buffered
        assert p.wait(timeout=30) == 0
        assert "Traceback" not in p.stderr.read()


# clears the screen, sets the window title (OSC 0), a fake link (OSC 8), C1 CSI, DEL, NUL, CR
HOSTILE = (
    "\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\"
    "\x9b31m\x85\x7f\x00\rX\tY"
)
TERMINAL_CONTROLS = {chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))} - {"\n", "\t"}


def _hostile_store(tmp_path: Path) -> Path:
    """A session whose user message, reply, tool call arguments, tool result, tool error
    and model failure all hold terminal escape sequences."""
    from runtime import LlmFailure, RetryPolicy, Runtime, ScriptedModel, ToolCall, tool

    @tool(concurrency_safe=True)
    def echo(text: str) -> str:
        """Echo."""
        if text == "fail":
            raise ValueError(HOSTILE)
        return text

    store = tmp_path / "store"
    model = ScriptedModel(
        [
            [ToolCall("echo", {"text": HOSTILE}), ToolCall("echo", {"text": "fail"})],
            LlmFailure(message=HOSTILE, code="SERVER", status=503),
            f"reply {HOSTILE}",
        ]
    )
    with Runtime.open(store, retry_policy=RetryPolicy(base_s=0.01, cap_s=0.01)) as rt:
        agent = rt.spawn(model=model, tools=[echo], session_id="hostile")
        agent.followup(f"user {HOSTILE}")
        assert agent.wait_idle(30)
    return store


def test_show_and_tail_print_logged_escape_sequences_visibly_never_raw(tmp_path: Path) -> None:
    store = _hostile_store(tmp_path)
    readable = [
        run_ok(["log", "show", "hostile", "--store", store]),
        run_ok(["log", "show", "hostile", "-v", "--store", store]),
        run_ok(["log", "tail", "hostile", "-n", "1000", "--store", store]),
    ]
    for out in readable:
        assert not TERMINAL_CONTROLS & set(out), sorted(TERMINAL_CONTROLS & set(out))
        assert r"user \x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil.example\x1b\click" in out
        assert r"\x9b31m\x85\x7f\x00\x0dX" in out  # and the tab as rich shows it, spaces
        for where in ("assistant: reply ", "tool result echo: ", "tool error echo ", "retry #1"):
            line = next(line for line in out.splitlines() if where in line)
            assert r"\x1b[2J" in line, line


def test_raw_json_lines_escape_every_control_character_and_keep_the_logged_text(
    tmp_path: Path,
) -> None:
    store = _hostile_store(tmp_path)
    for args in (["show", "hostile", "--raw"], ["tail", "hostile", "-n", "1000", "--raw"]):
        out = run_ok(["log", *args, "--store", store])
        assert not TERMINAL_CONTROLS & set(out), (args, sorted(TERMINAL_CONTROLS & set(out)))
        records = [json.loads(line) for line in out.splitlines()]
        texts = json.dumps(records, ensure_ascii=False)
        assert json.dumps(f"user {HOSTILE}", ensure_ascii=False)[1:-1] in texts
        assert json.dumps(f"reply {HOSTILE}", ensure_ascii=False)[1:-1] in texts


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x9b31m"


def test_an_error_line_quoting_a_crafted_value_shows_its_controls_visibly(tmp_path: Path) -> None:
    # msgspec quotes the bad value of a tag ("Invalid value '...'"): a crafted export's
    # escape sequences reached the terminal through the one error line.
    records = [{"type": "turn/start", "data": {"turn": 1, "trigger": {"kind": ESCAPES}}}]
    crafted = tmp_path / "crafted.jsonl"
    crafted.write_text(
        "".join(json.dumps({**r, "seq": s, "time": 1}) + "\n" for s, r in enumerate(records))
    )
    result = corral("log", "import", crafted, "--session-id", "x", "--store", tmp_path / "s")
    line = assert_one_error_line(result, "invalid session log", r"\x1b]0;pwned\x07\x1b[2J")
    assert not TERMINAL_CONTROLS & set(line)


def test_a_scripts_error_line_shows_the_controls_of_its_message_visibly(tmp_path: Path) -> None:
    script = write_script(
        tmp_path, "fails.py", f"def main(rt, argv):\n    raise RuntimeError({ESCAPES!r})\n"
    )
    result = corral("run", "--store", tmp_path / "s", script)
    line = assert_one_error_line(result, r"RuntimeError: \x1b]0;pwned\x07\x1b[2J\x9b31m")
    assert not TERMINAL_CONTROLS & set(line)


def test_check_lists_ignorable_types_it_does_not_know_with_their_controls_visible(
    tmp_path: Path,
) -> None:
    records = [
        {"type": "turn/start", "data": {"turn": 1, "trigger": {"kind": "message"}}},
        {"type": "turn/end", "data": {"turn": 1, "reason": {"kind": "completed"}}},
        {"type": f"plugin/{ESCAPES}", "data": {}, "ignorable": True},
    ]
    crafted = tmp_path / "plugged.jsonl"
    crafted.write_text(
        "".join(json.dumps({**r, "seq": s, "time": 1}) + "\n" for s, r in enumerate(records))
    )
    store = tmp_path / "store"
    run_ok(["log", "import", crafted, "--session-id", "plugged", "--store", store])
    out = run_ok(["log", "check", "--store", store])
    assert r"plugin/\x1b]0;pwned\x07\x1b[2J\x9b31m (1)" in out
    assert not TERMINAL_CONTROLS & set(out)
