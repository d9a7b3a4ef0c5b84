"""The checks of what starts a runtime or an agent, made in the caller's thread before
anything is written: models, tools, a system prompt and the ``request/header`` they
make, counts and flags, listeners' signatures. Each raises ``TypeError`` or
``ValueError`` naming what is wrong and what to do."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, Final, cast

import msgspec

from actors import WATERFALL_EVENTS, Model, Scheduler, Tool, UsageLimits, implements
from storage import (
    Codec,
    Event,
    EventTooLargeError,
    InvalidEventError,
    RequestConfig,
    RequestHeader,
    ToolSpec,
)

from .tool import FunctionTool, check_tool_name

__all__ = [
    "agent_settings",
    "check_agent_options",
    "check_arity",
    "check_clock",
    "check_count",
    "check_flag",
    "check_header",
    "check_limits",
    "check_system",
    "resolve_model",
    "resolve_tools",
]


def resolve_model(model: Model | str, scheduler: Scheduler | None = None) -> Model:
    """``model`` checked, a model string resolved (its provider's limiter on
    ``scheduler``'s clock, if given)."""
    if isinstance(model, str):
        from .providers.resolve import resolve_model as resolve_named  # noqa: PLC0415 - optional vendor SDKs

        return resolve_named(model, scheduler=scheduler)
    if isinstance(model, type):
        raise TypeError(
            f"model must be a Model instance, got the class {model.__name__}: make one "
            f"(e.g. {model.__name__}(...))"
        )
    if not implements(model, Model):
        raise TypeError(
            f"model must be a Model (e.g. ScriptedModel) or a model string, got {model!r}"
        )
    for field in ("provider", "name"):
        value = getattr(model, field)
        if type(value) is not str:
            raise TypeError(
                f"model {model!r}: its {field} must be a str (it is logged in every "
                f"request/header), got {type(value).__name__}"
            )
    return model


def check_system(system: object) -> None:
    if system is not None and type(system) is not str:  # a str subclass cannot be logged
        raise TypeError(f"system must be a str or None, got {type(system).__name__}")
    if system is not None:
        try:
            system.encode()
        except UnicodeEncodeError as err:
            raise ValueError(
                f"system cannot be logged: it is not UTF-8 text ({err.reason} at index "
                f"{err.start}: a lone surrogate)"
            ) from None


_SPEC: Final = msgspec.json.Decoder(ToolSpec)
_ENCODER: Final = msgspec.json.Encoder()
_LARGE: Final = 2**40
"""A turn, step and seq number no session reaches, for the size of a header-to-be."""


def check_header(codec: Codec, model: Model, tools: dict[str, Tool], system: str | None) -> None:
    """Check that the ``request/header`` every request of the agent starts by logging
    (its model's ids, ``system`` and the tools' specs) can be logged, before anything is
    written: else every turn of the agent would end ``error`` at its first request.
    ``TypeError`` for a tool spec that is not well typed (a hand-written ``Tool``'s
    ``description=123``), ``ValueError`` for a header that is not lossless JSON or over
    the store's ``max_event_bytes``. (A resume or fork without ``system`` is checked
    again once its log's system prompt is known: see ``Runtime._start_logged``.)"""
    specs: list[ToolSpec] = []
    for name, item in tools.items():
        try:
            specs.append(_SPEC.decode(_ENCODER.encode(item.spec)))
        except (TypeError, ValueError, msgspec.MsgspecError) as err:
            raise TypeError(
                f"tool {name!r} cannot be logged: its spec (in every request/header) "
                f"is not well typed: {err}"
            ) from None
    config = RequestConfig(provider=model.provider, model=model.name)
    header = RequestHeader(
        turn=_LARGE, step=_LARGE, config=config, system=system, tools=tuple(specs)
    )
    try:
        codec.prepare("request/header", header)
        codec.encode(Event("request/header", _LARGE, _LARGE, header))
    except EventTooLargeError:
        size = len(_ENCODER.encode(header))
        raise ValueError(
            f"the agent's request/header (its system prompt, {len(system or '')} "
            f"characters, and the specs of its {len(specs)} tools) would be about {size} "
            f"bytes, over the store's max_event_bytes ({codec.max_event_bytes}): every "
            "request would fail; shorten them, or open the runtime with a larger "
            "max_event_bytes"
        ) from None
    except InvalidEventError as err:
        raise ValueError(f"the agent's request/header cannot be logged: {err}") from None


def check_agent_options(system: object, limits: object) -> None:
    """The options every way of starting an agent takes, checked before anything is
    written (a bad one would otherwise crash the agent at its first turn, or be logged
    where no reader could read it back); :func:`check_header` checks, once the model
    and tools are resolved, the header they make with ``system``."""
    check_system(system)
    check_limits("limits", limits)


def check_limits(name: str, limits: object) -> None:
    if limits is not None and not isinstance(limits, UsageLimits):
        raise TypeError(f"{name} must be a UsageLimits or None, got {limits!r}")


def check_count(name: str, value: object, *, optional: bool = True) -> None:
    """``value`` must be a positive int (or None where ``optional``)."""
    if value is None and optional:
        return
    if type(value) is not int or value < 1:
        allowed = "a positive int or None" if optional else "a positive int"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def check_arity(name: str, listener: Callable[..., Any]) -> None:
    """``TypeError`` if ``listener`` cannot be called as a listener of ``name`` is:
    ``(event, next)`` for a waterfall, ``(event)`` otherwise (it would fail on every
    event, and a waterfall's failure ends every turn ``error``). A callable whose
    signature cannot be read (some builtins) is accepted. The listener's own signature
    counts, not that of what it wraps (``functools.wraps`` sets ``__wrapped__``: a
    decorator that makes an observer ``(event)`` into middleware ``(event, next)``)."""
    try:
        signature = inspect.signature(listener, follow_wrapped=False)
    except (TypeError, ValueError):
        return
    waterfall = name in WATERFALL_EVENTS
    try:
        signature.bind(*((None, None) if waterfall else (None,)))
    except TypeError:
        called = "listener(event, next), as middleware" if waterfall else "listener(event)"
        raise TypeError(
            f"a listener of {name!r} is called {called}; {listener!r} takes {signature}"
        ) from None


def check_clock(name: str, value: object) -> None:
    """``value`` is None or a clock: ``monotonic()`` and ``time()`` (an ``actors.Clock``,
    e.g. ``ManualClock()``)."""
    if value is None:
        return
    missing = [m for m in ("monotonic", "time") if not callable(getattr(value, m, None))]
    if missing or isinstance(value, type):
        raise TypeError(
            f"{name} must be a clock with monotonic() and time() (e.g. ManualClock()), "
            f"got {value!r}"
        )


def check_flag(name: str, value: object) -> None:
    if type(value) is not bool:
        raise TypeError(f"{name} must be True or False, got {value!r}")


def resolve_tools(tools: Iterable[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    out: dict[str, Tool] = {}
    if isinstance(tools, str | bytes):
        raise TypeError("tools must be a sequence of tools, not a string")
    for item in tools:
        resolved: Tool
        if implements(item, Tool):
            resolved = cast(Tool, item)
        elif callable(item):
            resolved = FunctionTool(item)
        else:
            raise TypeError(f"a tool is a Tool or a typed function, got {item!r}")
        name = check_tool_name(resolved.spec.name)
        if name in out:
            raise ValueError(f"two tools are named {name!r}; tool names must be unique per agent")
        out[name] = resolved
    return out


def agent_settings(
    codec: Codec,
    model: Model | str,
    tools: Iterable[Tool | Callable[..., Any]],
    system: object,
    limits: object,
    scheduler: Scheduler | None = None,
) -> tuple[Model, dict[str, Tool]]:
    """What spawn, resume and fork check before they touch the store: the options,
    the model and tools resolved (a model string's limiter on ``scheduler``'s clock),
    and the ``request/header`` they make with ``system`` (:func:`check_header`);
    returns the model and the tools by name."""
    check_agent_options(system, limits)
    resolved, tool_map = resolve_model(model, scheduler), resolve_tools(tools)
    check_header(codec, resolved, tool_map, cast("str | None", system))
    return resolved, tool_map
