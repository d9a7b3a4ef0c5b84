"""The check that ``storage`` and ``actors``, which ``runtime`` imports, are corral's own
packages: a user's ``storage.py`` (or ``actors.py``, or a package of that name) beside
their script sits first on ``sys.path`` and would be imported in their place, failing
deep inside corral with ``'storage' is not a package``. ``runtime/__init__`` calls
:func:`check_not_shadowed` before it imports either of them.

(A user's own ``runtime.py`` beside the script is imported in place of this package, so
nothing here runs; Python's own error then names that file: ``cannot import name
'Runtime' from 'runtime' (.../runtime.py)``.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["PackageShadowedError", "check_not_shadowed"]

_ROOT = Path(__file__).resolve().parent.parent
"""The directory that holds corral's three packages."""
_PACKAGES = ("storage", "actors")


class PackageShadowedError(ImportError):
    """A file or package of the user's is imported in place of one of corral's. An
    ``ImportError``, and the one error of corral's not under ``CorralError``: it is
    raised before ``storage``, which defines that base, can be imported."""


def _found_at(name: str) -> tuple[Path | None, list[Path]]:
    """Where ``import name`` finds (or found) its module: (its file, its package
    directories: none for a plain module)."""
    module = sys.modules.get(name)
    if module is not None:
        file = getattr(module, "__file__", None)
        locations = list(getattr(module, "__path__", ()))
    else:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None, []
        if spec is None:
            return None, []
        file = spec.origin
        locations = list(spec.submodule_search_locations or ())
    return (None if file is None else Path(file)), [Path(p) for p in locations]


def check_not_shadowed() -> None:
    """Raise :class:`PackageShadowedError`, naming the file to rename, if ``import
    storage`` or ``import actors`` would not find corral's package of that name."""
    for name in _PACKAGES:
        file, locations = _found_at(name)
        ours = _ROOT / name
        if any(location.resolve() == ours for location in locations):
            continue
        if file is None and not locations:
            continue  # not found at all: the import's own error says so
        where = locations[0] if locations else file  # a package: its directory
        assert where is not None
        raise PackageShadowedError(
            f"{where} is imported in place of corral's {name!r} package (its directory "
            f"comes first on sys.path); rename it, e.g. to my_{name}"
            f"{'.py' if where.suffix == '.py' else ''}, and delete any __pycache__ beside it",
            name=name,
            path=str(where),
        )
