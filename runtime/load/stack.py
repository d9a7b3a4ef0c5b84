"""What a load run hosts: an :class:`AgentStack` (what ``spawn`` takes), from your own
factory (``package.module:factory``) or the built-in scripted stack, and the prompts it
is sent (:class:`Prompts`: a file's lines, or generated text).

A factory is called once per run with the :class:`~runtime.Runtime` (before any agent
is spawned, so it may register listeners with ``rt.on``) and returns an
:class:`AgentStack`; every agent of the run is spawned with it. A stack without a
model gets the run's model (the simulated one of ``--ttft`` & co., else the scripted
one).
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from actors import Model, ModelRequest, Tool, UsageLimits
from storage import CorralError, LlmFailure, ToolMessage

from ..scripted import ScriptedModel, ScriptItem, ToolCall, last_user_text
from ..tool import FunctionTool, tool

if TYPE_CHECKING:
    from ..runtime import Runtime

__all__ = [
    "AgentStack",
    "AgentStackError",
    "Prompts",
    "PromptsError",
    "load_factory",
    "lookup_stack",
    "lookup_tool",
    "read_prompts",
    "scripted_load_model",
]

_FILLER: Final = (
    "The task is done; here is a short, deterministic answer with enough text to be "
    "streamed in several chunks."
)

Factory = Callable[["Runtime"], "AgentStack"]


class AgentStackError(CorralError):
    """A ``--agent`` factory could not be loaded or did not return an AgentStack."""


class PromptsError(CorralError):
    """A ``--prompts`` file could not be read or holds no prompt."""


class AgentStack(msgspec.Struct, frozen=True, kw_only=True):
    """What every agent of a run is spawned with (``Runtime.spawn``'s arguments).

    ``model`` None: the run's model (simulated or scripted)."""

    model: Model | str | None = None
    tools: Sequence[Tool | Callable[..., Any]] = ()
    system: str | None = None
    limits: UsageLimits | None = None


def load_factory(target: str) -> tuple[Factory, str]:
    """The factory named ``package.module:name`` (the current directory importable, as
    for ``python -m``), and that name; :class:`AgentStackError` saying what is wrong."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise AgentStackError(f"--agent takes package.module:factory, got {target!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise AgentStackError(f"--agent {target}: cannot import {module_name}: {err}") from err
    factory: object = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise AgentStackError(f"--agent {target}: {module_name} has no {attr}")
    if not callable(factory):
        raise AgentStackError(f"--agent {target}: {attr} is not callable")
    try:
        inspect.signature(factory).bind(None)
    except (TypeError, ValueError) as err:
        raise AgentStackError(
            f"--agent {target}: a factory takes one argument (the Runtime): {err}"
        ) from None
    return factory, target


def build_stack(factory: Factory, rt: Runtime, name: str) -> AgentStack:
    """Call ``factory(rt)`` and check that it returned an :class:`AgentStack`."""
    try:
        stack = factory(rt)
    except CorralError:
        raise
    except Exception as err:
        raise AgentStackError(f"the factory {name} failed: {type(err).__name__}: {err}") from err
    if not isinstance(stack, AgentStack):
        raise AgentStackError(
            f"the factory {name} must return runtime.load.AgentStack, got {type(stack).__name__}"
        )
    return stack


class Prompts:
    """The prompts of a run: ``texts`` cycled in order or sampled (seeded); without
    texts, ``task N of T for agent X`` (the closed loop's default)."""

    def __init__(
        self,
        texts: Sequence[str] = (),
        *,
        order: Literal["cycle", "sample"] = "cycle",
        seed: int = 0,
    ) -> None:
        self.texts = tuple(texts)
        self.order = order
        self._rng = random.Random(seed)
        self._next = 0
        self._lock = threading.Lock()

    def next(self, agent_id: str, turn: int, turns: int) -> str:
        if not self.texts:
            total = f" of {turns}" if turns else ""
            return f"task {turn}{total} for agent {agent_id[-6:]}"
        with self._lock:
            if self.order == "sample":
                return self._rng.choice(self.texts)
            text = self.texts[self._next % len(self.texts)]
            self._next += 1
            return text


def read_prompts(path: Path) -> list[str]:
    """One prompt per line: a ``.jsonl`` file's lines are JSON (a string, or an object
    with ``prompt`` or ``text``), any other file's lines are text; blank lines skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise PromptsError(f"cannot read prompts from {path}: {err}") from err
    jsonl = path.suffix.lower() in {".jsonl", ".ndjson"}
    prompts: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(line)
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise PromptsError(f"{path}:{number}: not JSON ({err})") from None
        if isinstance(value, dict):
            value = value.get("prompt", value.get("text"))
        if not isinstance(value, str) or not value:
            raise PromptsError(
                f'{path}:{number}: a line is a JSON string or {{"prompt": "..."}}, '
                f"got {line[:80]!r}"
            )
        prompts.append(value)
    if not prompts:
        raise PromptsError(f"{path} holds no prompt (one per line)")
    return prompts


def lookup_tool() -> FunctionTool:
    """The cheap, concurrency-safe tool load runs call."""

    @tool(concurrency_safe=True)
    def lookup(key: str) -> str:
        """Look a key up (instantly; a stand-in for a cheap tool)."""
        return f"value-of-{key}"

    return lookup


def lookup_stack(_rt: Runtime) -> AgentStack:
    """The built-in stack of a simulated model that calls tools: the cheap ``lookup``
    tool (a factory, ``runtime.load.stack:lookup_stack``, so that shards build it too)."""
    return AgentStack(tools=[lookup_tool()])


def scripted_load_model(
    *,
    latency_s: float = 0.0,
    jitter_s: float = 0.0,
    chunks: int = 1,
    tool_calls: int = 0,
    failure_rate: float = 0.0,
    seed: int = 0,
) -> ScriptedModel:
    """The ScriptedModel a load run drives: per request, fail with ``SERVER`` with
    probability ``failure_rate``; else call ``tool_calls`` tools on a turn's first step,
    and answer with text once the tools answered."""
    rng = random.Random(seed)
    calls = [ToolCall("lookup", {"key": f"k{i}"}) for i in range(tool_calls)]

    def reply(request: ModelRequest) -> ScriptItem:
        # ScriptedModel serializes these calls under its lock: rng needs no lock of its own.
        if failure_rate and rng.random() < failure_rate:
            return LlmFailure(message="scripted server error", code="SERVER", status=500)
        last = request.messages[-1] if request.messages else None
        if calls and not isinstance(last, ToolMessage):
            return calls
        return f"{last_user_text(request.messages)}: {_FILLER}"

    latency: float | Callable[[], float] = latency_s
    if jitter_s > 0:
        latency = ScriptedModel.jittered(latency_s, jitter_s, seed=seed)
    return ScriptedModel(reply, latency=latency, chunks=chunks, name="load")
