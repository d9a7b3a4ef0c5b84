"""Your own stack under load: a factory's tools, listeners, system prompt and model
are what every agent runs, the prompts are the file's, and only this run's sessions
are reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.load import (
    AgentStack,
    AgentStackError,
    LoadSpec,
    Prompts,
    PromptsError,
    build_stack,
    load_factory,
    read_prompts,
    run_bench,
)
from storage import RequestHeader, Store, TextBlock, ToolResultData, UserMessageData
from tests.load import stacks


def _texts(store: Path, kind: str) -> list[object]:
    with Store.open(store, readonly=True) as st:
        return [e.data for h in st.sessions() for e in st.read(h.id) if e.type == kind]


def test_a_factorys_stack_runs_with_its_tool_listeners_system_and_model(tmp_path: Path) -> None:
    store = tmp_path / "store"
    factory, name = load_factory("tests.load.stacks:factory")
    before = dict(stacks.calls)
    report, _ = run_bench(store, LoadSpec(agents=4, turns=3), factory=factory, factory_name=name)
    assert report.invariants_ok, report.violations
    assert report.stack == "tests.load.stacks:factory"
    assert report.model == "simulated:simulated"
    assert report.settled == 12 and report.errored == 0
    # the tool ran on every turn (the simulated model calls it with probability 1)
    results = [d for d in _texts(store, "tool/result") if isinstance(d, ToolResultData)]
    assert len(results) == 12
    assert all(r.message.name == "weather" and not r.message.is_error for r in results)
    assert all(r.message.content[0].text == "sunny in x" for r in results)  # type: ignore[union-attr]
    # the request listener shaped every request, the stopping listener saw every turn
    headers = [d for d in _texts(store, "request/header") if isinstance(d, RequestHeader)]
    assert headers and all(h.config.temperature == stacks.TEMPERATURE for h in headers)
    assert all(h.system == stacks.SYSTEM for h in headers)
    assert stacks.calls["request"] - before["request"] == 24  # two steps a turn
    assert stacks.calls["stopping"] - before["stopping"] == 12
    # the breakdown saw every turn, and the stopping listener's wait as hook time
    assert report.breakdown is not None and report.breakdown.turns == 12
    assert report.breakdown.hooks.p50 >= stacks.HOOK_WAIT_S * 1000 - 1


def test_prompts_from_a_jsonl_file_are_sent_in_order_then_cycled(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text('"first task"\n\n{"prompt": "second task"}\n{"text": "third task"}\n')
    prompts = read_prompts(path)
    assert prompts == ["first task", "second task", "third task"]
    store = tmp_path / "store"
    report, _ = run_bench(store, LoadSpec(agents=1, turns=5), prompts=Prompts(prompts))
    assert report.invariants_ok
    sent = [
        b.text
        for d in _texts(store, "user/message")
        if isinstance(d, UserMessageData)
        for b in d.message.content
        if isinstance(b, TextBlock)
    ]
    assert sent == ["first task", "second task", "third task", "first task", "second task"]


def test_sampled_prompts_are_the_files_and_the_same_for_the_same_seed() -> None:
    texts = [f"p{i}" for i in range(10)]
    a, b = Prompts(texts, order="sample", seed=3), Prompts(texts, order="sample", seed=3)
    drawn = [a.next("x", i, 0) for i in range(50)]
    assert drawn == [b.next("x", i, 0) for i in range(50)]
    assert set(drawn) <= set(texts) and len(set(drawn)) > 3
    assert drawn != texts * 5  # not the cycle


def test_a_text_prompts_file_is_one_prompt_a_line_and_an_empty_one_is_refused(
    tmp_path: Path,
) -> None:
    text = tmp_path / "prompts.txt"
    text.write_text('say "hi"\n\n{not json: a text line}\n')
    assert read_prompts(text) == ['say "hi"', "{not json: a text line}"]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(PromptsError, match="holds no prompt"):
        read_prompts(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": 3}) + "\n")
    with pytest.raises(PromptsError, match=r"bad.jsonl:1"):
        read_prompts(bad)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.load.stacks", "package.module:factory"),
        ("tests.load.no_such_module:factory", "cannot import"),
        ("tests.load.stacks:missing", "has no missing"),
        ("tests.load.stacks:TEMPERATURE", "not callable"),
    ],
)
def test_a_factory_that_cannot_be_loaded_says_why(target: str, message: str) -> None:
    with pytest.raises(AgentStackError, match=message):
        load_factory(target)


def test_a_factory_returning_something_else_than_a_stack_is_refused(tmp_path: Path) -> None:
    factory, name = load_factory("tests.load.stacks:not_a_stack")
    with pytest.raises(AgentStackError, match="must return runtime.load.AgentStack, got dict"):
        build_stack(factory, None, name)  # type: ignore[arg-type]
    assert isinstance(AgentStack(), AgentStack)


def test_a_run_on_a_store_with_earlier_sessions_reports_its_own_only(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first, _ = run_bench(store, LoadSpec(agents=3, turns=2))
    second, _ = run_bench(store, LoadSpec(agents=2, turns=1))
    assert first.sessions_checked == 3 and first.earlier_sessions == 0
    assert second.sessions_checked == 2 and second.earlier_sessions == 3
    assert second.settled == 2 and second.turns_total == 2
    assert second.events < first.events  # its own sessions' events only
