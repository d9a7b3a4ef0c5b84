"""What crosses the process boundary to a shard: an agent's recipe, not its objects.

A model is a model string (``"openai:gpt-4.1-mini"``, resolved in the shard like
``Runtime.spawn(model="...")`` does) or an importable factory ``"package.module:function"``
called with no arguments in the shard; a tool is such a factory too (returning a
:class:`~runtime.Tool` or a function ``tool()`` accepts), and so is a shard's ``setup``
(called with the shard's :class:`~runtime.Runtime`, to register waterfalls and other
extension points where the agents run). Live objects are refused with
:class:`UnportableError`: a model holding an HTTP client, a closure over driver state.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from .errors import UnportableError

__all__ = ["AgentRecipe", "build", "check_factory", "load_factory", "recipe"]


class AgentRecipe(msgspec.Struct, frozen=True, kw_only=True):
    """What a shard builds an agent from (and rebuilds it from after a restart)."""

    model: str
    tools: tuple[str, ...] = ()
    system: str | None = None


def _is_model_string(spec: str) -> bool:
    from runtime.providers import KNOWN_SCHEMES  # noqa: PLC0415 - vendor modules, loaded late

    scheme, sep, _rest = spec.partition(":")
    return bool(sep) and scheme.strip().lower() in KNOWN_SCHEMES


def check_factory(spec: object, what: str) -> str:
    """``spec`` if it reads ``package.module:function``; else :class:`UnportableError`."""
    if not isinstance(spec, str):
        raise UnportableError(
            f"{what} must be given as an importable factory 'package.module:function' to "
            f"cross to a shard, got {type(spec).__name__} {spec!r}: a live object cannot "
            "be sent; put a function that builds it in a module every node can import"
        )
    module, sep, name = spec.partition(":")
    if not sep or not module or not name.isidentifier():
        raise UnportableError(
            f"{what} {spec!r} is not a factory: write it as 'package.module:function'"
        )
    return spec


def load_factory(spec: str, what: str) -> Callable[..., Any]:
    """Import the function ``spec`` names (``package.module:function``)."""
    check_factory(spec, what)
    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UnportableError(
            f"{what} {spec!r}: module {module_name!r} cannot be imported in this process "
            f"({err}); install it on every node or put its directory on PYTHONPATH"
        ) from err
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UnportableError(f"{what} {spec!r}: {module_name} has no function {name!r}")
    return factory  # type: ignore[no-any-return]


def recipe(model: object, tools: Sequence[object], system: str | None) -> AgentRecipe:
    """Check, in the driver, that an agent's parts can cross to a shard."""
    if not isinstance(model, str):
        raise UnportableError(
            f"a cluster's agents take a model string ('openai:gpt-4.1-mini') or a factory "
            f"('package.module:function'), got {type(model).__name__} {model!r}: a Model "
            "object cannot be sent to a shard"
        )
    if not _is_model_string(model):
        check_factory(model, "the model")
    if isinstance(tools, str):
        raise UnportableError("tools is a sequence of factory strings, not one string")
    names = tuple(check_factory(spec, "a tool") for spec in tools)
    if system is not None and type(system) is not str:
        raise TypeError(f"system must be a str or None, got {type(system).__name__}")
    return AgentRecipe(model=model, tools=names, system=system)


def build(spec: AgentRecipe) -> tuple[Any, list[Any]]:
    """The model and tools ``spec`` names, made in this process (a shard's)."""
    model: Any = spec.model
    if not _is_model_string(spec.model):
        model = load_factory(spec.model, "the model")()
    tools = [load_factory(name, "a tool")() for name in spec.tools]
    return model, tools
