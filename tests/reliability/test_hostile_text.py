"""The last hostile inputs of issue 32: a message nested 100,000 deep, bidirectional
controls in logged text and in session ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import InvalidMessageError, Runtime, ScriptedModel, TextBlock, UserMessage
from storage import BIDI_CONTROLS, InvalidSessionIdError, Store

from .conftest import WAIT, corral

SPOOF = "invoice \u202eexe.txt\u202c and \u2066isolated\u2069 \u2067rtl\u2069 \u2068first\u2069"


def deep(depth: int) -> object:
    value: object = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("where", ["content", "text"])
def test_a_message_nested_100k_deep_is_refused_typed_and_nothing_is_written(
    rt: Runtime, where: str
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo())
    nested = deep(100_000)
    message = (
        UserMessage(id="m", content=nested)  # type: ignore[arg-type]
        if where == "content"
        else UserMessage(id="m", content=(TextBlock(text=nested),))  # type: ignore[arg-type]
    )
    with pytest.raises(InvalidMessageError, match="nested too deeply"):
        agent.followup(message)
    assert agent.session.last_seq == -1  # nothing logged
    agent.followup("still fine")
    assert agent.wait_idle(WAIT)
    assert agent.session.events()[-1].data.reason.kind == "completed"


@pytest.mark.parametrize("char", sorted(BIDI_CONTROLS))
def test_a_session_id_with_a_bidirectional_control_is_refused(tmp_path: Path, char: str) -> None:
    with Store.open(tmp_path / "store") as store:
        with pytest.raises(
            InvalidSessionIdError, match=f"bidirectional control U\\+{ord(char):04X}"
        ):
            store.create_session(f"agent{char}1")
        assert store.sessions() == []


def test_log_show_tail_and_ls_print_bidirectional_controls_visibly(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with Runtime.open(path) as rt:
        agent = rt.spawn(model=ScriptedModel.echo(), session_id="spoofed")
        agent.followup(SPOOF)
        assert agent.wait_idle(WAIT)
    outputs = {
        "show": corral("log", "show", "spoofed", "--store", path),
        "show -v": corral("log", "show", "spoofed", "-v", "--store", path),
        "show --raw": corral("log", "show", "spoofed", "--raw", "--store", path),
        "tail": corral("log", "tail", "spoofed", "-n", "20", "--store", path),
        "ls": corral("log", "ls", "--store", path),
    }
    for name, done in outputs.items():
        assert done.returncode == 0, (name, done.stderr)
        raw = [char for char in done.stdout if char in BIDI_CONTROLS]
        assert raw == [], f"log {name} printed {len(raw)} bidirectional controls raw"
    for name in ("show", "show -v", "show --raw", "tail"):
        assert "\\u202e" in outputs[name].stdout, name
        assert "\\u2066" in outputs[name].stdout and "\\u2069" in outputs[name].stdout, name
