"""What ``corral acp`` makes each session's agent of: a model spec and tool entry points.

- ``--model``: a model string (``scripted:echo``, ``openai:gpt-4.1-mini``, any scheme of
  :mod:`runtime.providers.resolve`) or a factory ``package.module:function`` (or
  ``path/to/file.py:function``) called with no argument for each session; it returns a
  ``Model`` or a model string.
- ``--tools``: ``package.module:NAME`` (or ``file.py:NAME``) naming a tool, a list of
  tools, or a function returning either (called once).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors import Model, Tool
from runtime.providers.resolve import KNOWN_SCHEMES, resolve_model
from storage import CorralError

__all__ = ["AcpConfigError", "load_object", "load_tools", "model_factory"]


class AcpConfigError(CorralError, ValueError):
    """A ``--model`` or ``--tools`` spec that names nothing usable: the message says why."""


def load_object(spec: str) -> Any:
    """The object ``module:attr`` (``attr`` may be dotted; ``module`` may be a ``.py``
    file's path) names."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise AcpConfigError(f"{spec!r} is not 'package.module:name' (or 'file.py:name')")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            loaded = importlib.util.spec_from_file_location(f"_corral_acp_{path.stem}", path)
            if loaded is None or loaded.loader is None:
                raise AcpConfigError(f"cannot load {path} as a Python module")
            module = importlib.util.module_from_spec(loaded)
            sys.modules[loaded.name] = module
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as err:
        raise AcpConfigError(f"cannot import {module_name!r} (from {spec!r}): {err}") from err
    except OSError as err:
        raise AcpConfigError(f"cannot read {module_name!r} (from {spec!r}): {err}") from err
    value: Any = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError as err:
            raise AcpConfigError(f"{module_name!r} has no {attr!r} (from {spec!r})") from err
    return value


def _checked_model(value: object, spec: str) -> Model:
    if isinstance(value, str):
        value = resolve_model(value)
    if not isinstance(value, Model):
        raise AcpConfigError(f"the model factory {spec!r} returned {value!r}, not a Model")
    return value


def model_factory(spec: str) -> Callable[[], Model]:
    """A function making the model of one session from ``spec``; the spec is checked
    (imported, or resolved once) here."""
    scheme = spec.partition(":")[0].strip().lower()
    if scheme in KNOWN_SCHEMES:
        resolve_model(spec)  # a malformed string fails now, not at the first session
        return lambda: resolve_model(spec)
    target = load_object(spec)
    if isinstance(target, Model):
        return lambda: target  # one model object shared by every session
    if not callable(target):
        raise AcpConfigError(f"{spec!r} is neither a model nor a function returning one")
    return lambda: _checked_model(target(), spec)


def load_tools(specs: tuple[str, ...] | list[str]) -> list[Tool]:
    """The tools the entry points ``specs`` name, in order."""
    tools: list[Tool] = []
    for spec in specs:
        value = load_object(spec)
        if callable(value) and not isinstance(value, Tool):
            value = value()
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if not isinstance(item, Tool):
                raise AcpConfigError(f"{spec!r} gave {item!r}, which is not a tool (use @tool)")
            tools.append(item)
    return tools
