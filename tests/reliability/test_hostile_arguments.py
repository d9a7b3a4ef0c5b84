"""Wrong types and values to every public verb, tool option, agent setting and runtime
option: refused with a typed error naming what was wrong, before anything is written."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runtime import (
    Agent,
    InvalidMessageError,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolCall,
    UnknownMessageError,
    UserMessage,
    tool,
)
from storage import (
    InvalidSessionIdError,
    StorageError,
    UnknownSessionError,
)
from storage.events import ToolSpec

from .conftest import WAIT, check_whole_store
from .hostile_support import assert_alive, facts, probe, run_turn


def _wrong_calls(rt: Runtime, agent: Agent) -> list[tuple[str, Callable[[], Any], type]]:
    echo = ScriptedModel.echo()
    bad_content = UserMessage(id="bad-content", content="text")
    bad_text = UserMessage(id="bad-text", content=[TextBlock(text=5)])
    no_blocks = UserMessage(id="no-blocks", content=[])
    pending = agent.inbox.ids()[0]
    return [
        ("followup(123)", lambda: agent.followup(123), InvalidMessageError),
        ("followup(None)", lambda: agent.followup(None), InvalidMessageError),
        ("followup(b'x')", lambda: agent.followup(b"x"), InvalidMessageError),
        ("followup([])", lambda: agent.followup([]), InvalidMessageError),
        ("followup(['x'])", lambda: agent.followup(["x"]), InvalidMessageError),
        ("followup(x, id=123)", lambda: agent.followup("x", id=123), InvalidMessageError),
        ("followup(x, source=1)", lambda: agent.followup("x", source=1), InvalidMessageError),
        ("followup(content=str)", lambda: agent.followup(bad_content), InvalidMessageError),
        ("followup(text=int)", lambda: agent.followup(bad_text), InvalidMessageError),
        (
            "inject(UserMessage, source=)",
            lambda: agent.inject(
                UserMessage(id="m", content=[TextBlock(text="x")]), source="plugin"
            ),
            InvalidMessageError,
        ),
        ("followup(surrogate)", lambda: agent.followup("a \udc00"), InvalidMessageError),
        ("steer({})", lambda: agent.steer({}), InvalidMessageError),
        ("inject(1.5)", lambda: agent.inject(1.5), InvalidMessageError),
        ("remove(None)", lambda: agent.remove(None), InvalidMessageError),
        ("remove(123)", lambda: agent.remove(123), InvalidMessageError),
        ("remove('nope')", lambda: agent.remove("nope"), UnknownMessageError),
        ("replace(None, x)", lambda: agent.replace(None, "x"), InvalidMessageError),
        ("replace('nope', x)", lambda: agent.replace("nope", "x"), UnknownMessageError),
        ("replace('nope', 5)", lambda: agent.replace("nope", 5), InvalidMessageError),
        ("cancel('user')", lambda: agent.cancel("user"), InvalidMessageError),
        ("cancel(123)", lambda: agent.cancel(123), InvalidMessageError),
        ("on('nope', f)", lambda: agent.on("nope", print), ValueError),
        ("on(name, 'x')", lambda: agent.on("agent/settled", "x"), TypeError),
        ("rt.on(123, f)", lambda: rt.on(123, print), TypeError),
        ("rt.on(name, None)", lambda: rt.on("agent/status", None), TypeError),
        ("spawn(model=123)", lambda: rt.spawn(model=123), TypeError),
        ("spawn(model='nonsense')", lambda: rt.spawn(model="nonsense"), ValueError),
        ("spawn(tools=[123])", lambda: rt.spawn(model=echo, tools=[123]), TypeError),
        ("spawn(tools='ab')", lambda: rt.spawn(model=echo, tools="ab"), TypeError),
        (
            "spawn(session_id=123)",
            lambda: rt.spawn(model=echo, session_id=123),
            InvalidSessionIdError,
        ),
        (
            "spawn(session_id='')",
            lambda: rt.spawn(model=echo, session_id=""),
            InvalidSessionIdError,
        ),
        (
            "spawn(session_id=ctrl)",
            lambda: rt.spawn(model=echo, session_id="a\x00b"),
            InvalidSessionIdError,
        ),
        ("spawn(system=123)", lambda: rt.spawn(model=echo, system=123), TypeError),
        ("spawn(duplicate id)", lambda: rt.spawn(model=echo, session_id=agent.id), StorageError),
        ("resume('missing')", lambda: rt.resume("missing", model=echo), UnknownSessionError),
        ("resume(123)", lambda: rt.resume(123, model=echo), InvalidSessionIdError),
        ("resume(live id)", lambda: rt.resume(agent.id, model=echo), ValueError),
        ("resume(system=1)", lambda: rt.resume("missing", model=echo, system=1), TypeError),
        ("fork(boundary='3')", lambda: rt.fork(agent.id, "3", model=echo), TypeError),  # type: ignore[arg-type]
        ("fork(boundary=None)", lambda: rt.fork(agent.id, None, model=echo), TypeError),  # type: ignore[arg-type]
        ("fork(system=123)", lambda: rt.fork(agent.id, 0, model=echo, system=123), TypeError),  # type: ignore[arg-type]
        ("fork(5, 0)", lambda: rt.fork(5, 0, model=echo), InvalidSessionIdError),  # type: ignore[arg-type]
        ("spawn(limits=5)", lambda: rt.spawn(model=echo, limits=5), TypeError),  # type: ignore[arg-type]
        ("resume(limits=5)", lambda: rt.resume("missing", model=echo, limits=5), TypeError),  # type: ignore[arg-type]
        ("fork(limits=5)", lambda: rt.fork(agent.id, 0, model=echo, limits=5), TypeError),  # type: ignore[arg-type]
        (
            "splice(messages='abc')",
            lambda: agent.splice("next-turn", 0, 0, "abc"),
            InvalidMessageError,
        ),
        ("splice(messages=5)", lambda: agent.splice("next-turn", 0, 0, 5), InvalidMessageError),  # type: ignore[arg-type]
        ("wait_idle('1')", lambda: agent.wait_idle("1"), TypeError),  # type: ignore[arg-type]
        ("wait_idle(nan)", lambda: agent.wait_idle(math.nan), TypeError),
        ("followup(x, id='')", lambda: agent.followup("x", id=""), InvalidMessageError),
        (
            "followup([block], id='')",
            lambda: agent.followup([TextBlock(text="x")], id=""),
            InvalidMessageError,
        ),
        ("followup(content=[])", lambda: agent.followup(no_blocks), InvalidMessageError),
        ("replace(x, content=[])", lambda: agent.replace(pending, no_blocks), InvalidMessageError),
        (
            "splice(start=True)",
            lambda: agent.splice("next-step", True, 0, ["x"]),
            InvalidMessageError,
        ),
        (
            "splice(removed_count=True)",
            lambda: agent.splice("next-step", 0, True, []),
            InvalidMessageError,
        ),
        (
            "splice(messages=dict)",
            lambda: agent.splice("next-step", 0, 0, {"key": 1}),  # type: ignore[arg-type]
            InvalidMessageError,
        ),
        (
            "splice(messages=set)",
            lambda: agent.splice("next-step", 0, 0, {"a", "b"}),  # type: ignore[arg-type]
            InvalidMessageError,
        ),
        ("cancel(keep_inbox='no')", lambda: agent.cancel(keep_inbox="no"), TypeError),  # type: ignore[arg-type]
        ("cancel(keep_inbox=1)", lambda: agent.cancel(keep_inbox=1), TypeError),  # type: ignore[arg-type]
        ("clear(timeout='1')", lambda: agent.clear(timeout="1"), TypeError),  # type: ignore[arg-type]
        ("remove(p, timeout='1')", lambda: agent.remove(pending, timeout="1"), TypeError),  # type: ignore[arg-type]
        (
            "replace(p, x, timeout=nan)",
            lambda: agent.replace(pending, "x", timeout=math.nan),
            TypeError,
        ),
        (
            "splice(timeout=True)",
            lambda: agent.splice("next-step", 0, 1, [], timeout=True),
            TypeError,
        ),
        ("spawn(tools=[lambda])", lambda: rt.spawn(model=echo, tools=[lambda x: x]), ValueError),
        ("tool(name='a b')", lambda: tool(name="a b")(probe.fn), ValueError),
        ("tool(name='x' * 65)", lambda: tool(name="x" * 65)(probe.fn), ValueError),
        ("tool(name='ns.get')", lambda: tool(name="ns.get")(probe.fn), ValueError),
    ]


def test_every_public_verb_refuses_wrong_types_with_a_typed_error_and_writes_nothing(
    rt: Runtime,
) -> None:
    agent = rt.spawn(model=ScriptedModel.echo(), session_id="target")
    pending = agent.inject("pending")
    assert agent.wait_idle(WAIT)
    before = agent.session.last_seq
    sessions = {h.id for h in rt.store.sessions()}
    wrong: list[str] = []
    for label, call, expected in _wrong_calls(rt, agent):
        try:
            call()
        except expected:
            continue
        except Exception as err:
            wrong.append(f"{label}: {type(err).__name__}: {err}")
        else:
            wrong.append(f"{label}: accepted")
    assert wrong == [], "\n".join(wrong)
    assert agent.wait_idle(WAIT)
    assert agent.session.last_seq == before, "a refused call wrote to the session"
    assert agent.inbox.ids() == [pending]
    assert {h.id for h in rt.store.sessions()} == sessions, "a refused spawn left a session"
    assert_alive(rt, agent)
    # the rt fixture reads every session back from the store when the test ends


def _typed(x: int) -> int:
    """Return x."""
    return x


BAD_TOOL_OPTIONS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "timeout=nan": ({"timeout": math.nan}, TypeError, "timeout is a number of seconds"),
    "timeout=True": ({"timeout": True}, TypeError, "timeout is a number of seconds"),
    "timeout='5'": ({"timeout": "5"}, TypeError, "timeout is a number of seconds"),
    "timeout=-1": ({"timeout": -1}, ValueError, "timeout is a number of seconds >= 0"),
    "timeout=0": ({"timeout": 0}, ValueError, "timeout must be > 0 seconds"),
    "concurrency_safe='no'": (
        {"concurrency_safe": "no"},
        TypeError,
        "concurrency_safe must be True or False",
    ),
    "concurrency_safe=1": (
        {"concurrency_safe": 1},
        TypeError,
        "concurrency_safe must be True or False",
    ),
    "description=123": ({"description": 123}, TypeError, "description must be a str"),
}


@pytest.mark.parametrize("case", list(BAD_TOOL_OPTIONS))
def test_a_tool_option_of_the_wrong_type_or_value_is_refused_when_the_tool_is_made(
    case: str,
) -> None:
    # Before, timeout=nan made every call time out at once, True was taken as 1 s, '5'
    # raised a bare TypeError from a comparison, concurrency_safe="no" was taken as
    # true, and description=123 made every request fail to log its header.
    options, expected, match = BAD_TOOL_OPTIONS[case]
    with pytest.raises(expected, match=f"tool _typed: {match}"):
        tool(**options)(_typed)


@pytest.mark.parametrize("timeout", [math.inf, 1e300], ids=["inf", "1e300"])
def test_an_infinite_tool_timeout_is_no_limit(rt: Runtime, timeout: float) -> None:
    made = tool(timeout=timeout)(_typed)
    assert made.timeout_s is None
    call = ToolCall(name="_typed", arguments={"x": 1})
    agent = run_turn(rt, ScriptedModel([[call], "done"]), [made])
    (result,) = facts(agent, "tool/result")
    assert result.error is None
    assert result.message.content[0].text == "1"


class _Calc:
    base = 10

    def add(self, x: int) -> int:
        """Add to base."""
        return self.base + x

    @staticmethod
    def double(x: int) -> int:
        """Double x."""
        return 2 * x

    def __call__(self, x: int) -> int:
        return x


def _dunder(x: int, __y: int = 0) -> int:
    return x


def _nan_default(x: float = math.nan) -> float:
    return x


def _inf_default(x: float = -math.inf) -> float:
    return x


UNDESCRIBABLE: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "a method in its class body": (
        lambda: tool(_Calc.add),
        TypeError,
        r"tool add: _Calc.add is a method: its 'self' .*tool\(obj.add\)",
    ),
    "a parameter named __y": (lambda: tool(_dunder), TypeError, "tool _dunder: .*'__y'.* rename"),
    "a functools.partial": (
        lambda: tool(functools.partial(_typed, x=1)),
        TypeError,
        "tool partial: .*decorate a typed function that calls it",
    ),
    "a callable object": (
        lambda: tool(_Calc()),
        TypeError,
        "tool _Calc: .*decorate a typed function that calls it",
    ),
    "a NaN default": (lambda: tool(_nan_default), ValueError, "tool _nan_default: .*NaN"),
    "a -Infinity default": (lambda: tool(_inf_default), ValueError, "finite default"),
}


@pytest.mark.parametrize("case", list(UNDESCRIBABLE))
def test_a_function_a_model_cannot_be_told_about_is_refused_naming_the_tool_and_the_fix(
    case: str,
) -> None:
    # Before, a method decorated in its class body advertised `self` to the model, a
    # NaN default was advertised in the schema but logged as null, and __y, a partial
    # or a callable object failed with msgspec's or typing's own words.
    make, expected, match = UNDESCRIBABLE[case]
    with pytest.raises(expected, match=match):
        make()


def test_a_bound_method_and_a_staticmethod_make_tools_that_run(rt: Runtime) -> None:
    add, double = tool(_Calc().add), tool(_Calc.double)
    assert add.spec.parameters["required"] == ["x"] == double.spec.parameters["required"]
    calls = [ToolCall(name="add", arguments={"x": 1}), ToolCall(name="double", arguments={"x": 4})]
    agent = run_turn(rt, ScriptedModel([calls, "done"]), [add, double])
    assert [r.message.content[0].text for r in facts(agent, "tool/result")] == ["11", "8"]


class _StrSub(str):
    pass


class _HandWrittenTool:
    """A hand-written ``Tool`` whose spec is not well typed (msgspec does not check
    a struct's field types at construction)."""

    spec = ToolSpec(name="hand", description=123)  # type: ignore[arg-type]
    concurrency_safe = False
    timeout_s = None
    is_async = False

    def prepare(self, arguments: Any) -> Any:
        return arguments

    def run(self, prepared: Any) -> Any:
        return "ok"


class _NumberNamed(ScriptedModel):
    """A model whose name is not a str (``ScriptedModel(name=5)`` is refused itself)."""

    @property
    def name(self) -> Any:
        return 5


UNLOGGABLE_SETTINGS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "system lone surrogate": ({"system": "\ud800"}, ValueError, "not UTF-8"),
    "system str subclass": ({"system": _StrSub("x")}, TypeError, "must be a str"),
    "system 5 MiB": ({"system": "s" * (5 << 20)}, ValueError, "over the store's max_event_bytes"),
    "tool spec description=123": ({"tools": [_HandWrittenTool()]}, TypeError, "'hand'"),
    "model name=5": ({"model": _NumberNamed.echo()}, TypeError, "its name must be a str"),
    "model class": ({"model": ScriptedModel}, TypeError, "got the class ScriptedModel"),
}


@pytest.mark.parametrize("verb", ["spawn", "resume", "fork"])
@pytest.mark.parametrize("case", list(UNLOGGABLE_SETTINGS))
def test_agent_settings_that_cannot_be_logged_are_refused_before_anything_is_written(
    rt: Runtime, case: str, verb: str
) -> None:
    # Before, each was accepted, and every turn of the agent then ended error at its
    # first request: its request/header could not be logged.
    settings, expected, match = UNLOGGABLE_SETTINGS[case]
    settings = {"model": ScriptedModel.echo(), **settings}
    source = run_turn(rt, ScriptedModel.echo())
    assert source.dispose(WAIT)
    sessions = {h.id for h in rt.store.sessions()}
    last = rt.store.open_session(source.id).last_seq
    with pytest.raises(expected, match=match):
        if verb == "spawn":
            rt.spawn(**settings)
        elif verb == "resume":
            rt.resume(source.id, **settings)
        else:
            rt.fork(source.id, last, **settings)
    assert {h.id for h in rt.store.sessions()} == sessions, "a refused start left a session"
    resumed = rt.resume(source.id, model=ScriptedModel.echo())
    assert resumed.session.last_seq == last, "a refused start wrote to the session"
    assert_alive(rt, resumed)


@pytest.mark.parametrize("verb", ["resume", "fork"])
def test_a_logged_system_prompt_that_no_longer_fits_with_the_tools_given_is_refused(
    tmp_path: Path, verb: str
) -> None:
    # The header check at the start counted the system= given, not the one the log
    # recorded: a resume (or fork) without system= adding a tool was accepted, and
    # every turn then ended error ("request/header ... over the limit").
    with Runtime.open(tmp_path / "store", max_event_bytes=4096) as rt:
        source = rt.spawn(model=ScriptedModel.echo(), system="s" * 3_900)
        source.followup("go")  # its first request logs the system prompt
        assert source.wait_idle(WAIT) and source.dispose(WAIT)
        last = source.session.last_seq
        start: Callable[[], Agent] = (
            (lambda: rt.resume(source.id, model=ScriptedModel.echo(), tools=[probe]))
            if verb == "resume"
            else (lambda: rt.fork(source.id, last, model=ScriptedModel.echo(), tools=[probe]))
        )
        with pytest.raises(ValueError, match=r"system prompt (resumed from|forked into)"):
            start()
        again = rt.resume(source.id, model=ScriptedModel.echo(), tools=[probe], system="short")
        again.followup("and now")
        assert again.wait_idle(WAIT)
        assert [e.data.reason.kind for e in again.session.events() if e.type == "turn/end"] == [
            "completed",
            "completed",
        ]
    check_whole_store(tmp_path / "store")


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("threads", "2", ValueError),
        ("threads", 0, ValueError),
        ("blocking_workers", 0, ValueError),
        ("blocking_workers", None, ValueError),
        ("max_steps", "3", ValueError),
        ("max_steps", 0, ValueError),
        ("inbox_limit", -1, ValueError),
        ("inbox_limit", True, ValueError),
        ("limits", 5, TypeError),
        ("agent_limits", {"max_requests": 2}, TypeError),
        ("retry_policy", 5, TypeError),
        ("max_running_turns", 0, ValueError),
        ("map_size", -1, ValueError),
        ("map_size", 0, ValueError),
        ("map_size", 1.5, ValueError),
        ("map_size", "1", ValueError),
        ("max_event_bytes", True, ValueError),
        ("max_event_bytes", 0, ValueError),
        ("tune_gc", "no", TypeError),
        ("tune_gc", None, TypeError),
    ],
)
def test_runtime_options_of_the_wrong_type_are_refused_when_the_runtime_opens(
    tmp_path: Path, option: str, value: Any, expected: type[Exception]
) -> None:
    store_path = tmp_path / "store"
    # Before, most were accepted and crashed every agent at its first turn (max_steps,
    # limits, agent_limits), refused every send (inbox_limit=-1), or failed deep inside
    # with a bare TypeError (threads).
    with pytest.raises(expected, match=option):
        Runtime.open(store_path, **{option: value})
    with Runtime.open(store_path) as rt:  # nothing was left open or locked
        agent = rt.spawn(model=ScriptedModel.echo())
        agent.followup("hi")
        assert agent.wait_idle(WAIT)
