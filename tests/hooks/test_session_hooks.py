"""SessionStart, UserPromptSubmit, Stop and SessionEnd hooks; the wire; the settings."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime import Runtime, ScriptedModel, ToolCall, tool
from runtime.hooks import HOOK_RUN, HookRun, HookSettingsError, load_settings
from storage import Store, TurnEnd, UserMessageData

from .conftest import checked, hook_runs, settings

DUMP = (
    "import json, pathlib, sys\n"
    "data = json.load(sys.stdin)\n"
    "out = pathlib.Path({path!r})\n"
    "with out.open('a') as f:\n"
    "    f.write(json.dumps(data) + '\\n')\n"
)


def _user_messages(rt: Runtime, agent_id: str) -> list[UserMessageData]:
    return [e.data for e in rt.get(agent_id).session.events() if e.type == "user/message"]


def _turn_ends(rt: Runtime, agent_id: str) -> list[TurnEnd]:
    return [e.data for e in rt.get(agent_id).session.events() if e.type == "turn/end"]


def test_a_stop_hook_that_blocks_steers_the_agent_once(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    log = tmp_path / "stop.jsonl"
    stop = script(
        "stop.py",
        DUMP.format(path=str(log))
        + "if not data['stop_hook_active']:\n"
        "    print(json.dumps({'decision': 'block', 'reason': 'run the tests first'}))\n",
    )
    rt = open_runtime(settings("Stop", stop))
    model = ScriptedModel(["I am done.", "Tests pass; now I am done."])
    agent = rt.spawn(model=model)
    agent.followup("fix the bug")
    assert agent.wait_idle(30)
    inputs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [i["stop_hook_active"] for i in inputs] == [False, True]
    assert {i["hook_event_name"] for i in inputs} == {"Stop"}
    messages = _user_messages(rt, agent.id)
    assert [m.message.source for m in messages] == ["user", "plugin"]
    assert messages[1].message.content[0].text == "run the tests first"
    [end] = _turn_ends(rt, agent.id)  # one turn, two steps: the loop decided from the steer
    assert end.reason.kind == "completed" and model.requests == 2
    events = checked(agent.session.events())
    assert [r["decision"] for r in hook_runs(events) if "decision" in r] == ["block"]


def test_a_user_prompt_submit_hook_blocks_with_exit_2_or_adds_logged_context(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime]
) -> None:
    gate = script(
        "gate.py",
        "import json, sys\n"
        "data = json.load(sys.stdin)\n"
        "if 'password' in data['prompt']:\n"
        "    print('prompts may not hold secrets', file=sys.stderr)\n"
        "    sys.exit(2)\n"
        "print('The repository uses tabs.')\n",  # plain stdout: context
    )
    rt = open_runtime(settings("UserPromptSubmit", gate))
    model = ScriptedModel.echo()
    agent = rt.spawn(model=model)
    agent.followup("my password is hunter2")
    assert agent.wait_idle(30)
    agent.followup("indent this")
    assert agent.wait_idle(30)
    ends = _turn_ends(rt, agent.id)
    assert [e.reason.kind for e in ends] == ["blocked", "completed"]
    texts = [(m.message.source, m.message.content[0].text) for m in _user_messages(rt, agent.id)]
    assert texts == [("user", "indent this"), ("plugin", "The repository uses tabs.")]
    runs = hook_runs(checked(agent.session.events()))
    assert [(r["exitCode"], r.get("decision"), r.get("context", False)) for r in runs] == [
        (2, "block", False),
        (0, None, True),
    ]
    assert runs[0]["reason"] == "prompts may not hold secrets"


def test_session_start_context_joins_the_first_prompt_and_session_end_runs_at_dispose(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    log = tmp_path / "session.jsonl"
    dump = script("dump.py", DUMP.format(path=str(log)))
    start = script(
        "start.py",
        "import json\n"
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'SessionStart',"
        " 'additionalContext': 'Today is a holiday.'}}))\n",
    )
    hooks = {
        "hooks": {
            "SessionStart": [{"matcher": "startup", "hooks": [{"command": start}]}],
            "SessionEnd": [{"hooks": [{"command": dump}]}],
        }
    }
    rt = open_runtime(hooks)
    agent = rt.spawn(model=ScriptedModel.echo())
    agent.followup("hello")
    assert agent.wait_idle(30)
    texts = [m.message.content[0].text for m in _user_messages(rt, agent.id)]
    assert texts == ["hello", "Today is a holiday."]
    assert agent.dispose(30)
    rt.close()  # the SessionEnd run (an async listener of agent/disposed) ends within it
    [end] = [json.loads(line) for line in log.read_text().splitlines()]
    assert end["hook_event_name"] == "SessionEnd" and end["reason"] == "other"
    assert end["session_id"] == agent.id
    store = Store.open(tmp_path / "store", readonly=True)  # what the close made durable
    try:
        store.register_event_type(HOOK_RUN, HookRun, ignorable=True)
        runs = hook_runs(checked(store.read(agent.id)))
    finally:
        store.close()
    assert [r["event"] for r in runs] == ["SessionStart", "SessionEnd"]


def test_the_hook_input_has_the_documented_fields_and_a_transcript_of_the_log(
    script: Callable[[str, str], str], open_runtime: Callable[..., Runtime], tmp_path: Path
) -> None:
    log = tmp_path / "pre.jsonl"
    dump = script("dump.py", DUMP.format(path=str(log)))
    seen: list[int] = []

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        seen.append(a + b)
        return a + b

    for dialect in ("claude", "codex"):
        rt = open_runtime({**settings("PreToolUse", dump), "dialect": dialect})
        model = ScriptedModel([[ToolCall(name="add", arguments={"a": 2, "b": 3})], "5"])
        agent = rt.spawn(model=model, tools=[add])
        agent.followup("add")
        assert agent.wait_idle(30)
        data = json.loads(log.read_text().splitlines()[-1])
        assert data["session_id"] == agent.id and data["hook_event_name"] == "PreToolUse"
        assert data["cwd"] == str(Path.cwd()) and data["permission_mode"] == "default"
        assert data["tool_name"] == "add" and data["tool_input"] == {"a": 2, "b": 3}
        [call] = [e.data for e in agent.session.events() if e.type == "tool/call"]
        assert data["tool_use_id"] == call.call_id
        if dialect == "codex":
            assert data["model"] == "scripted" and data["turn_id"] == "1"
        else:
            assert "model" not in data and "turn_id" not in data
        records = [json.loads(line) for line in Path(data["transcript_path"]).read_text().splitlines()]
        assert [r["seq"] for r in records] == list(range(len(records)))
        assert records[-1]["type"] == "tool/call"  # the log as it was when the hook ran
        rt.close()
    assert seen == [5, 5]


def test_bad_settings_are_refused_naming_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(HookSettingsError, match="are not JSON"):
        load_settings(path)
    for raw, message in (
        ({"hooks": {"PreToolUse": [{"matcher": "(", "hooks": []}]}}, "not a regular expression"),
        ({"hooks": {"Stop": [{"hooks": [{"command": "x", "timeout": -1}]}]}}, "timeout"),
        ({"hooks": {"Stop": [{"hooks": [{"command": ""}]}]}}, "'command'"),
        ({"dialect": "gemini"}, "dialect"),
    ):
        with pytest.raises(HookSettingsError, match=message):
            load_settings(raw)
    loaded = load_settings(
        {
            "hooks": {
                "Notification": [{"hooks": [{"command": "x"}]}],
                "Stop": [{"hooks": [{"type": "prompt", "prompt": "?"}, {"command": "y"}]}],
            }
        }
    )
    assert loaded.ignored == ("Notification", "hook settings: Stop[0].hooks[0] (prompt)")
    assert [c.command for c in loaded.commands("Stop")] == ["y"]
    with pytest.raises(HookSettingsError, match="cannot read"):
        Runtime.open(tmp_path / "store", hooks=tmp_path / "missing.json")
