"""``@tool``: turn a typed function (sync or ``async def``) into a corral tool.

The JSON schema of the parameters is derived from the type hints with msgspec; the
model's arguments are validated and converted with the same types before the body
runs. A body concludes the turn by returning :func:`conclude` (``ToolReturn``).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, Final, TypeVar, get_type_hints, overload

import msgspec

from actors import ToolArgumentError, ToolReturn
from storage import ToolSpec, check_timeout, lossless_problem

__all__ = ["FunctionTool", "check_tool_name", "conclude", "tool"]

F = TypeVar("F", bound=Callable[..., Any])

_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What both OpenAI (function names) and Anthropic (``^[a-zA-Z0-9_-]{1,64}$``) accept."""


def check_tool_name(name: object) -> str:
    """``name`` if model providers accept it as a tool name; else ``ValueError`` (a
    provider would refuse every request that offers the tool, 400 INVALID_REQUEST)."""
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise ValueError(
            f"tool name {name!r}: model providers accept 1 to 64 letters, digits, '_' or "
            "'-' (OpenAI and Anthropic refuse anything else); name it with tool(name=...)"
        )
    return name


def conclude(output: Any = None) -> ToolReturn:
    """Return this from a tool body to end the tool loop at its step."""
    return ToolReturn(output=output, concludes_turn=True)


def _inline_refs(schema: Any, defs: dict[str, Any]) -> Any:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline_refs(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline_refs(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline_refs(v, defs) for v in schema]
    return schema


def _checked_flag(label: str, concurrency_safe: object) -> bool:
    if type(concurrency_safe) is not bool:
        raise TypeError(
            f"tool {label}: concurrency_safe must be True or False, got {concurrency_safe!r}"
        )
    return concurrency_safe


def _checked_timeout(label: str, timeout: object) -> float | None:
    """A tool's ``timeout``, by the verbs' rules (``check_timeout``: None or a number of
    seconds; ``inf``, or one too long for the platform, is None: no limit), and > 0:
    a body cannot run in no time."""
    try:
        checked = check_timeout(timeout)
    except (TypeError, ValueError) as err:
        raise type(err)(f"tool {label}: {err}") from None
    if checked is not None and checked <= 0:
        raise ValueError(f"tool {label}: timeout must be > 0 seconds or None, got {timeout!r}")
    return checked


def _type_hints(label: str, fn: Callable[..., Any]) -> dict[str, Any]:
    if isinstance(fn, classmethod):
        raise TypeError(
            f"tool {label}: a classmethod in its class body; decorate it bound, once the "
            f"class exists (tool(TheClass.{label}))"
        )
    try:
        return get_type_hints(fn)
    except TypeError as err:
        if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn):
            raise
        raise TypeError(
            f"tool {label}: a {type(fn).__name__} object is not a function, so its "
            "parameters cannot be described to a model; decorate a typed function that "
            "calls it instead (for a callable object, its bound method will do: "
            "tool(obj.__call__, name=...))"
        ) from err


def _refuse_unbound_method(
    label: str, fn: Callable[..., Any], parameters: list[inspect.Parameter]
) -> None:
    """``@tool`` on a method in its class body: its ``self`` (or ``cls``) would be
    described to the model as an argument to give."""
    if not parameters or parameters[0].name not in ("self", "cls"):
        return
    qualname = getattr(fn, "__qualname__", "").split(".")
    if len(qualname) < 2 or qualname[-2] == "<locals>":  # a function, not a method
        return
    raise TypeError(
        f"tool {label}: {'.'.join(qualname)} is a method: its {parameters[0].name!r} "
        "would be described to the model as an argument; decorate the bound method "
        f"instead (tool(obj.{qualname[-1]}), once the object exists), or make it a "
        "@staticmethod"
    )


class FunctionTool:
    """A tool backed by a Python function."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        concurrency_safe: bool = False,
        timeout: float | None = None,
    ) -> None:
        label = name if isinstance(name, str) else getattr(fn, "__name__", type(fn).__name__)
        self.fn = fn
        self._is_async = inspect.iscoroutinefunction(fn)
        self._concurrency_safe = _checked_flag(label, concurrency_safe)
        self._timeout = _checked_timeout(label, timeout)
        if description is not None and type(description) is not str:
            raise TypeError(
                f"tool {label}: description must be a str or None, got {type(description).__name__}"
            )
        hints = _type_hints(label, fn)
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        positional: list[str] = []  # positional-only parameters, passed by position
        parameters = list(inspect.signature(fn).parameters.values())
        _refuse_unbound_method(label, fn, parameters)
        for param in parameters:
            if param.kind is param.POSITIONAL_ONLY:
                positional.append(param.name)
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {label}: *args/**kwargs cannot be described to a model")
            if param.name.startswith("__"):
                raise TypeError(
                    f"tool {label}: parameter {param.name!r} cannot be described to a model "
                    "(a name starting with '__' is mangled in a class: msgspec refuses it); "
                    "rename it"
                )
            annotation = hints.get(param.name, Any)
            if param.default is inspect.Parameter.empty:
                fields.append((param.name, annotation))
            else:
                fields.append((param.name, annotation, param.default))
        self._positional = tuple(positional)
        tool_name = check_tool_name(name or getattr(fn, "__name__", repr(fn)))
        self._args = msgspec.defstruct(f"{tool_name}_arguments", fields, forbid_unknown_fields=True)
        schema = msgspec.json.schema(self._args)
        parameters_schema = _inline_refs(schema, schema.get("$defs", {}))
        parameters_schema.pop("title", None)
        problem = lossless_problem(parameters_schema)
        if problem is not None:
            raise ValueError(
                f"tool {tool_name}: its parameters' JSON schema cannot be sent or logged "
                f"as it is: {problem} (a NaN or infinite default would reach the model as "
                "null): give a finite default, or None"
            )
        doc = inspect.getdoc(fn) or ""
        self._spec = ToolSpec(
            name=tool_name,
            description=description or doc.split("\n\n")[0],
            parameters=parameters_schema,
        )

    def __repr__(self) -> str:
        return f"FunctionTool({self._spec.name!r})"

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    @property
    def concurrency_safe(self) -> bool:
        return self._concurrency_safe

    @property
    def timeout_s(self) -> float | None:
        return self._timeout

    @property
    def is_async(self) -> bool:
        return self._is_async

    def prepare(self, arguments: Any) -> Any:
        if not isinstance(arguments, dict):
            found = type(arguments).__name__
            raise ToolArgumentError(
                f"tool {self._spec.name!r} takes a JSON object of arguments, got {found}"
            )
        try:
            return msgspec.convert(arguments, type=self._args)
        except msgspec.ValidationError as err:
            raise ToolArgumentError(f"tool {self._spec.name!r}: {err}") from err

    def run(self, prepared: Any) -> Any:
        kwargs = {f: getattr(prepared, f) for f in prepared.__struct_fields__}
        if self._positional:  # the model names them all; the function takes these by position
            return self.fn(*[kwargs.pop(p) for p in self._positional], **kwargs)
        return self.fn(**kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    concurrency_safe: bool = False,
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    concurrency_safe: bool = False,
    timeout: float | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Decorate a typed function to make it a tool (``@tool`` or ``@tool(...)``)."""

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(
            f,
            name=name,
            description=description,
            concurrency_safe=concurrency_safe,
            timeout=timeout,
        )

    return wrap(fn) if fn is not None else wrap
