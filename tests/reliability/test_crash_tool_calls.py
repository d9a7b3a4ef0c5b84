"""A SIGKILL after tool bodies ran while their ``tool/call`` facts were not durable.

Under ``turn`` and ``none`` durability a tool body runs without waiting for its
``tool/call`` to be durable, so a crash can leave the reply's tool-call blocks in the log
without the ``tool/call`` facts of bodies that ran. The resume must not answer such a
call "it did not run" (``TOOL_NOT_STARTED``): a model told a payment did not run may run
it again. Under write-ahead the same kill finds no body run, and ``TOOL_NOT_STARTED`` is
true.

The child (``load_child.py held-calls``) makes the window certain instead of likely: its
log writer commits the reply, then never commits the batch that holds the ``tool/call``
facts (as a writer the kill finds behind the turn), and each ``pay`` body prints
``ran <k>`` before it waits for good.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime import Runtime, ScriptedModel
from storage import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, check_invariants
from storage.events import ToolCallBlock
from storage.lmdb.store import Store

from .conftest import after_lines, assert_killed, child_command, run_until_killed


@pytest.mark.parametrize("durability", ["write-ahead", "turn", "none"])
def test_a_call_whose_body_ran_before_the_kill_is_never_repaired_as_not_started(
    tmp_path: Path, durability: str
) -> None:
    path = tmp_path / "store"
    if durability == "write-ahead":  # no body can run: give one a moment to show it did
        cue = after_lines("held", 1, 0.05)
    else:
        cue = after_lines("ran ", 3, 0.0)
    run = run_until_killed(child_command("held-calls", str(path), "--durability", durability), cue)
    assert_killed(run)
    ran = {int(line.split()[1]) for line in run.lines if line.startswith("ran ")}

    with Store.open(path, readonly=True) as store:
        crashed = store.read("payer")
    assert not [e for e in crashed if e.type == "tool/call"], "the writer held them back"
    (reply,) = [e.data for e in crashed if e.type == "assistant/message"]
    call_of = {
        json.loads(block.arguments)["k"]: block.call_id
        for block in reply.message.content
        if isinstance(block, ToolCallBlock)
    }
    assert sorted(call_of) == [0, 1, 2]
    (start,) = [e.data for e in crashed if e.type == "turn/start"]
    assert start.durability == (None if durability == "write-ahead" else durability)

    with Runtime.open(path, durability=durability) as rt:  # type: ignore[arg-type]
        agent = rt.resume("payer", model=ScriptedModel.echo())
        repaired = agent.session.events()
    assert repaired[: len(crashed)] == crashed
    codes = {
        e.data.message.call_id: e.data.error.code
        for e in repaired[len(crashed) :]
        if e.type == "tool/result"
    }
    assert set(codes) == set(call_of.values()), "every call gets one synthetic result"
    for k in ran:  # the property, whatever the schedule: a call that ran did not "not run"
        assert codes[call_of[k]] != TOOL_NOT_STARTED, f"pay({k}) ran, repaired as not started"
    if durability == "write-ahead":
        assert ran == set()
        assert set(codes.values()) == {TOOL_NOT_STARTED}
    else:
        assert ran == {0, 1, 2}
        assert set(codes.values()) == {TOOL_OUTCOME_UNKNOWN}
    assert repaired[-1].type == "turn/end"
    assert repaired[-1].data.reason.kind == "interrupted"
    assert check_invariants(repaired) == []
