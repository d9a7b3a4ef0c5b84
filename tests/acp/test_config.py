"""What ``corral acp --model`` / ``--tools`` accept, and the errors for what they refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import ScriptedModel
from runtime.acp import AcpConfigError, load_tools, model_factory, needs_permission
from runtime.acp.permission import gated
from tests.acp.factories import TOOLS, write_note
from tests.cli.conftest import assert_one_error_line, corral


def test_a_model_string_and_a_factory_make_a_new_model_per_session(tmp_path: Path) -> None:
    echo = model_factory("scripted:echo")
    assert isinstance(echo(), ScriptedModel) and echo() is not echo()
    slow = model_factory("tests.acp.factories:slow")
    assert slow().name == "slow" and slow() is not slow()
    module = tmp_path / "mymodels.py"
    module.write_text("def make():\n    return 'scripted:echo'\n")  # a model string is resolved
    assert isinstance(model_factory(f"{module}:make")(), ScriptedModel)


def test_tools_come_from_a_name_a_list_or_a_function(tmp_path: Path) -> None:
    module = tmp_path / "mytools.py"
    module.write_text(
        "from runtime import tool\n"
        "@tool\n"
        "def ping() -> str:\n"
        "    '''Ping.'''\n"
        "    return 'pong'\n"
        "def all_tools():\n"
        "    return [ping]\n"
    )
    names = [t.spec.name for t in load_tools([f"{module}:ping", f"{module}:all_tools"])]
    assert names == ["ping", "ping"]
    [gate] = load_tools(["tests.acp.factories:TOOLS"])
    assert gate is TOOLS[0] and gated(gate, frozenset()) and not gated(write_note, frozenset())
    assert gated(write_note, frozenset({"write_note"}))
    with pytest.raises(TypeError, match="takes a Tool"):
        needs_permission(print)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-colon", "is not 'package.module:name'"),
        ("tests.acp.nowhere:x", "cannot import"),
        ("tests.acp.factories:missing", "has no 'missing'"),
        ("tests.acp.factories:NOTES", "neither a model nor a function"),
    ],
)
def test_a_model_spec_that_names_nothing_usable_is_refused(spec: str, message: str) -> None:
    with pytest.raises(AcpConfigError, match=message):
        model_factory(spec)


def test_corral_acp_refuses_a_bad_spec_in_one_error_line(tmp_path: Path) -> None:
    result = corral("acp", "--model", "tests.acp.factories:missing", "--store", tmp_path / "s")
    assert_one_error_line(result, "has no 'missing'")
    result = corral(
        "acp", "--model", "scripted:echo", "--ask", "nothing", "--store", tmp_path / "s"
    )
    assert_one_error_line(result, "--ask names no tool given with --tools: nothing")
