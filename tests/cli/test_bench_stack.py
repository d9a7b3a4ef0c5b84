"""``corral bench --agent module:factory --prompts FILE``: your stack from the command
line, with your prompts; a factory or a prompts file that cannot be used is one line."""

from __future__ import annotations

import json
from pathlib import Path

from storage import RequestHeader, Store, TextBlock, UserMessageData
from tests.cli.conftest import assert_one_error_line, corral
from tests.load import stacks


def test_a_factorys_stack_and_a_prompts_file_drive_the_run(tmp_path: Path) -> None:
    prompts = tmp_path / "tasks.jsonl"
    prompts.write_text('{"prompt": "weather in Oslo?"}\n"weather in Lima?"\n')
    store, report = tmp_path / "store", tmp_path / "report.json"
    result = corral(
        "bench", "--store", store, "--agent", "tests.load.stacks:factory", "--prompts",
        prompts, "--agents", "3", "--turns", "2", "--json", report, "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "stack tests.load.stacks:factory" in result.stdout
    assert "where the time went (6 turns, ms)" in result.stdout
    data = json.loads(report.read_text())
    assert data["stack"] == "tests.load.stacks:factory" and data["settled"] == 6
    assert data["model"] == "simulated:simulated" and data["invariants_ok"] is True
    with Store.open(store, readonly=True) as st:
        events = [e for h in st.sessions() for e in st.read(h.id)]
    sent = [
        b.text
        for e in events
        if isinstance(e.data, UserMessageData)
        for b in e.data.message.content
        if isinstance(b, TextBlock)
    ]
    assert sorted(sent) == ["weather in Lima?"] * 3 + ["weather in Oslo?"] * 3
    headers = [e.data for e in events if isinstance(e.data, RequestHeader)]
    assert headers and {h.config.temperature for h in headers} == {stacks.TEMPERATURE}
    assert {h.system for h in headers} == {stacks.SYSTEM}
    assert sum(1 for e in events if e.type == "tool/result") == 6  # the weather tool


def test_a_factory_that_cannot_be_imported_is_one_error_line(tmp_path: Path) -> None:
    result = corral("bench", "--store", tmp_path / "store", "--agent", "nosuch.mod:factory")
    assert_one_error_line(result, "--agent nosuch.mod:factory: cannot import nosuch.mod")
    assert "Traceback" not in result.stderr


def test_a_factory_returning_no_stack_is_one_error_line(tmp_path: Path) -> None:
    result = corral(
        "bench", "--store", tmp_path / "store", "--agent", "tests.load.stacks:not_a_stack"
    )
    assert_one_error_line(result, "must return runtime.load.AgentStack, got dict")


def test_an_empty_prompts_file_is_one_error_line(tmp_path: Path) -> None:
    prompts = tmp_path / "none.txt"
    prompts.write_text("\n")
    result = corral("bench", "--store", tmp_path / "store", "--prompts", prompts)
    assert_one_error_line(result, "holds no prompt")
    assert not (tmp_path / "store").exists()
