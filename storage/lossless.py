"""Lossless-JSON validation of event data, with JSON paths in its errors.

Data is *lossless* when it survives a JSON round trip unchanged: plain ``dict`` (string
keys), ``list``, ``str``, ``int``, finite ``float``, ``bool`` and ``None``, no cycles,
bounded nesting. :func:`check_plain_json` walks arbitrary data; :func:`struct_check`
compiles, once per struct class, a plan that looks only at the parts of a typed fact
that could break the rule (float fields and ``Any``/``dict`` parts): a struct whose
schema cannot hold a non-finite float or an odd key gets no plan at all (``None``).
:func:`run_check` turns a failure into an :class:`InvalidEventError` naming the path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import msgspec

from storage.errors import InvalidEventError

__all__ = [
    "MAX_JSON_DEPTH",
    "Check",
    "check_plain_json",
    "describe",
    "lossless_problem",
    "run_check",
    "struct_check",
]

MAX_JSON_DEPTH: Final = 256
"""Deepest nesting of dicts and lists accepted inside event data."""

_JSON_VALUE: Final = "a JSON value (dict, list, str, int, float, bool or None)"
_HINTS: Final[dict[type, str]] = {
    tuple: "use a list",
    set: "use a sorted list",
    frozenset: "use a sorted list",
    bytes: "encode it as a base64 string",
    bytearray: "encode it as a base64 string",
}

Check = Callable[[Any], None]
"""Raises an internal path-carrying error when the value is not lossless."""
_Memo = dict[type, list[Any]]  # class -> [its plan or None, compiled yet]


class _Bad(Exception):
    """Internal: a validation failure, with the JSON path collected while unwinding."""

    def __init__(self, expected: str, found: str, hint: str = "") -> None:
        super().__init__(expected)
        self.expected = expected
        self.found = found
        self.hint = hint
        self.parts: list[str | int] = []


def _format_path(parts: list[str | int], root: str = "$.data") -> str:
    out = [root]
    for part in reversed(parts):
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif part.isidentifier():
            out.append(f".{part}")
        else:
            out.append(f"[{part!r}]")
    return "".join(out)


def describe(value: object) -> str:
    if isinstance(value, float):
        return repr(value).replace("nan", "NaN").replace("inf", "Infinity")
    if isinstance(value, msgspec.Struct):
        return f"a {type(value).__name__} struct"
    return f"a {type(value).__name__}"


def _hint(value: object) -> str:
    for kind, hint in _HINTS.items():
        if isinstance(value, kind):
            return hint
    if isinstance(value, msgspec.Struct):
        return "convert it with msgspec.to_builtins() or register a typed event"
    if hasattr(value, "isoformat"):
        return "store an ISO-8601 string or epoch milliseconds"
    return "convert it to plain JSON data first"


def _walk(value: object, depth: int, active: set[int]) -> None:
    """Check that ``value`` is plain JSON that survives a round trip unchanged."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise _Bad("a finite number", describe(value), "JSON has no NaN or Infinity")
        return
    if kind is not dict and kind is not list:
        raise _Bad(_JSON_VALUE, describe(value), _hint(value))
    if depth >= MAX_JSON_DEPTH:
        raise _Bad(f"at most {MAX_JSON_DEPTH} levels of nesting", "deeper nesting")
    if id(value) in active:
        raise _Bad("a tree of values", "a cycle (a container that contains itself)")
    active.add(id(value))
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                bad = _Bad("string keys", f"the {type(key).__name__} key {key!r}")
                bad.hint = "JSON object keys are strings"
                raise bad
            try:
                _walk(item, depth + 1, active)
            except _Bad as err:
                err.parts.append(key)
                raise
    else:
        for index, item in enumerate(value):  # type: ignore[arg-type]
            try:
                _walk(item, depth + 1, active)
            except _Bad as err:
                err.parts.append(index)
                raise
    active.discard(id(value))


def check_plain_json(value: object) -> None:
    _walk(value, 0, set())


def lossless_problem(value: object, root: str = "$") -> str | None:
    """What keeps ``value`` from being lossless JSON, its path written from ``root``
    (``"at $.x[0]: expected a finite number, found NaN; JSON has no NaN or
    Infinity"``), or None if it is lossless: for data checked before it reaches an
    event (a tool's schema, a scripted tool call's arguments)."""
    try:
        check_plain_json(value)
    except _Bad as err:
        hint = f"; {err.hint}" if err.hint else ""
        where = _format_path(err.parts, root)
        return f"at {where}: expected {err.expected}, found {err.found}{hint}"
    return None


def _check_float(value: object) -> None:
    kind = type(value)
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise _Bad("a finite number", describe(value), "JSON has no NaN or Infinity")
    elif kind is not int:
        raise _Bad("a float", describe(value))


def _compile(info: msgspec.inspect.Type, memo: _Memo) -> Check | None:
    """Build the validation plan for one schema node; ``None`` means nothing to check."""
    mi = msgspec.inspect
    if isinstance(info, mi.FloatType):
        return _check_float
    if isinstance(info, mi.AnyType):
        return check_plain_json
    if isinstance(info, mi.DictType):
        if isinstance(info.value_type, mi.AnyType) or not isinstance(info.key_type, mi.StrType):
            return check_plain_json
        inner = _compile(info.value_type, memo)
        return None if inner is None else _each_value(inner)
    if isinstance(info, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        inner = _compile(info.item_type, memo)
        return None if inner is None else _each_item(inner)
    if isinstance(info, mi.UnionType):
        return _compile_union(info, memo)
    if isinstance(info, mi.StructType):
        return _compile_struct(info, memo)
    return None


def _each_value(inner: Check) -> Check:
    def check(value: Any) -> None:
        for key, item in value.items():
            try:
                inner(item)
            except _Bad as err:
                err.parts.append(key)
                raise

    return check


def _each_item(inner: Check) -> Check:
    def check(value: Any) -> None:
        for index, item in enumerate(value):
            try:
                inner(item)
            except _Bad as err:
                err.parts.append(index)
                raise

    return check


def _compile_union(info: msgspec.inspect.UnionType, memo: _Memo) -> Check | None:
    mi = msgspec.inspect
    table: dict[type, Check] = {}
    for member in info.types:
        check = _compile(member, memo)
        if check is None:
            continue
        if check is check_plain_json:
            return check_plain_json
        if isinstance(member, mi.FloatType):
            table[float] = check
        elif isinstance(member, mi.StructType):
            table[member.cls] = check
        elif isinstance(member, mi.DictType):
            table[dict] = check
        elif isinstance(member, mi.ListType | mi.VarTupleType):
            table[list] = check  # a tuple-typed field may be given a list, and the reverse
            table[tuple] = check
        else:
            return check_plain_json  # conservative: an exotic member that needs checking
    if not table:
        return None

    def check_member(value: Any) -> None:
        found = table.get(type(value))
        if found is not None:
            found(value)

    return check_member


def _compile_struct(info: msgspec.inspect.StructType, memo: _Memo) -> Check | None:
    seen = memo.get(info.cls)
    if seen is not None:
        if seen[1]:  # compiled already (the struct appears twice in the schema)
            compiled: Check | None = seen[0]
            return compiled
        # A recursive schema: resolve through the box once it is built.
        return lambda value: seen[0](value) if seen[0] is not None else None
    box: list[Any] = [None, False]  # [plan or None, compiled]
    memo[info.cls] = box
    plan: list[tuple[str, str, Check]] = []
    for field in info.fields:
        check = _compile(field.type, memo)
        if check is not None:
            plan.append((field.name, field.encode_name, check))
    box[1] = True
    if not plan:
        return None

    def check_struct(value: Any) -> None:
        for attr, name, check in plan:
            try:
                check(getattr(value, attr))
            except _Bad as err:
                err.parts.append(name)
                raise

    box[0] = check_struct
    return check_struct


def run_check(type: str, check: Check, data: object) -> None:
    try:
        check(data)
    except _Bad as err:
        hint = f"; {err.hint}" if err.hint else ""
        raise InvalidEventError(
            f"{type!r} event at {_format_path(err.parts)}: expected {err.expected}, "
            f"found {err.found}{hint}. Nothing was written."
        ) from None


def struct_check(data_type: type[msgspec.Struct]) -> Check | None:
    """The validation plan of a struct class; ``None`` when nothing needs checking."""
    info = msgspec.inspect.type_info(data_type)
    assert isinstance(info, msgspec.inspect.StructType)
    return _compile_struct(info, {})
