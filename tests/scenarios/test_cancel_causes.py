"""Scenario tests of cancel causes: every cause a turn ends with is logged in its
``turn/end`` (CONTRACT 3: ``{kind:"user"}``, ``{kind:"parent"}``, ``{kind:"hook",
reason}``, ``{kind:"disposed"}``), so one that cannot be logged is refused where it
enters, and one that slips through still gives a ``turn/end`` that reads back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from runtime import HookCause, InvalidMessageError, Runtime, ScriptedModel, UserCause
from storage.events import CancelCause, DisposedCause, ParentCause

from .conftest import WAIT, Timeline, check_store
from .models import GateModel

BAD_CAUSES: dict[str, object] = {
    "reason=123": HookCause(reason=123),  # type: ignore[arg-type]
    "reason=None": HookCause(reason=None),  # type: ignore[arg-type]
    "lone surrogate": HookCause(reason="\ud800"),
    "reason over the limit": HookCause(reason="r" * 16_385),  # MAX_CAUSE_REASON_CHARS + 1
    "a look-alike": SimpleNamespace(kind="user"),
    "a str": "user",
    "a dict": {"kind": "hook", "reason": "x"},
    # dispose()'s own cause: before, the actor took it as its disposal and never started
    # a turn again, while the handle (never disposed) went on taking sends
    "DisposedCause()": DisposedCause(),
}


def end_reasons(agent: Any) -> list[Any]:
    return [e.data.reason for e in agent.session.events() if e.type == "turn/end"]


# What each refusal says (its regex).
REFUSALS: dict[str, str] = {
    "reason=123": "HookCause.reason is a str, got 123",
    "reason=None": "HookCause.reason is a str, got None",
    "lone surrogate": r"the cancel cause HookCause\(reason=.*\) cannot be logged",
    "reason over the limit": "HookCause.reason holds 16385 characters, over the limit of 16384",
    "a look-alike": "a cancel cause is UserCause",
    "a str": "a cancel cause is UserCause.*got 'user'",
    "a dict": "a cancel cause is UserCause",
    "DisposedCause()": r"DisposedCause\(\) is the cause of agent.dispose\(\); call dispose\(\)",
}


@pytest.mark.parametrize("name", list(BAD_CAUSES))
def test_a_cancel_cause_that_cannot_be_logged_is_refused_in_the_callers_thread(
    rt: Runtime, name: str
) -> None:
    cause = BAD_CAUSES[name]
    model = GateModel()
    agent = rt.spawn(model=model)
    agent.followup("hi")
    assert model.wait_reached(1)
    with pytest.raises(InvalidMessageError, match=REFUSALS[name]):
        agent.cancel(cause)  # type: ignore[arg-type]
    assert agent.status == "running"  # nothing was cancelled
    agent.cancel(HookCause(reason="a good reason"))
    assert agent.wait_idle(WAIT)
    [reason] = end_reasons(agent)
    assert (reason.kind, reason.reason) == ("aborted", HookCause(reason="a good reason"))
    # the rt fixture reads every log back (it could not be before the fix)


@pytest.mark.parametrize("event", ["agent/pre-step", "agent/request"])
@pytest.mark.parametrize(
    "cause",
    ["oops", HookCause(reason=123), HookCause(reason="\ud800"), SimpleNamespace(kind="user")],  # type: ignore[arg-type]
    ids=["a str", "reason=123", "lone surrogate", "a look-alike"],
)
def test_a_listener_aborting_with_a_cause_that_cannot_be_logged_fails_and_its_turn_ends_as_error(
    rt: Runtime, timeline: Timeline, event: str, cause: object
) -> None:
    def abort(e: Any, next_: Callable[[], Any]) -> Any:
        e.signal.abort(cause)
        return next_()

    agent = rt.spawn(model=ScriptedModel(["never sent", "fine"]))
    off = agent.on(event, abort)
    agent.followup("hi")
    assert agent.wait_idle(WAIT)
    assert [r.kind for r in end_reasons(agent)] == ["error"]  # a raising listener's turn
    assert "InvalidMessageError" in timeline.wait_for("agent/error")[0].error.message
    assert agent.crash is None
    off()
    agent.followup("again")
    assert agent.wait_idle(WAIT)
    assert [r.kind for r in end_reasons(agent)] == ["error", "completed"]


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        (123, "an unloggable cancel cause: 123"),
        ("\ud800", "?"),
        ("r" * 100_000, None),  # cut to fit the store's max_event_bytes
    ],
    ids=["reason=123", "lone surrogate", "reason over the event limit"],
)
def test_a_cause_changed_after_its_check_still_ends_the_turn_with_a_turn_end_that_reads_back(
    tmp_path: Path, changed: object, expected: str | None
) -> None:
    store_path = tmp_path / "store"

    def abort(e: Any, next_: Callable[[], Any]) -> Any:
        e.signal.abort(HookCause(reason="checked"))
        msgspec.structs.force_setattr(e.signal.reason, "reason", changed)
        return next_()

    with Runtime.open(store_path, max_event_bytes=32 << 10) as rt:
        agent = rt.spawn(model=ScriptedModel(["never sent", "fine"]))
        agent.on("agent/pre-step", abort)
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
        assert agent.crash is None
        [reason] = [e.data.reason for e in rt.store.read(agent.id) if e.type == "turn/end"]
        assert reason.kind == "aborted" and isinstance(reason.reason, HookCause)
        if expected is not None:
            assert reason.reason.reason == expected
        else:
            assert 0 < len(reason.reason.reason) < 32 << 10
    check_store(store_path)


@pytest.mark.parametrize(
    ("cause", "expected"),
    [
        (UserCause(), UserCause()),
        (ParentCause(), ParentCause()),
        (DisposedCause(), DisposedCause()),
        (HookCause(reason="why"), HookCause(reason="why")),
        (SimpleNamespace(kind="parent"), ParentCause()),
        (
            SimpleNamespace(kind="hook", reason=b"x"),
            HookCause(reason="an unloggable cancel cause: b'x'"),
        ),
        ("oops", HookCause(reason="an unloggable cancel cause: 'oops'")),
        (HookCause(reason='"' * 100), HookCause(reason='"' * 16)),  # an escape takes 2 bytes
    ],
    ids=["user", "parent", "disposed", "hook", "look-alike", "bytes reason", "a str", "escapes"],
)
def test_loggable_cause_gives_a_cause_that_fits_its_budget_and_reads_back(
    cause: object, expected: CancelCause
) -> None:
    from actors.signal import loggable_cause

    got = loggable_cause(cause, 100)
    assert got == expected
    assert msgspec.json.decode(msgspec.json.encode(got), type=CancelCause) == got
