"""Runtime-checkable protocol checks, remembered per class.

``isinstance`` against a ``runtime_checkable`` protocol looks up every member by name
(~20 µs); the runtime checks each spawned agent's model and tools that way, so a
spawn of 10,000 agents that share one model made 20,000 such checks.
"""

from __future__ import annotations

from typing import Any

__all__ = ["implements"]


_CONFORMING: dict[tuple[type, Any], bool] = {}
"""(class, protocol) pairs whose class itself has every member of the protocol."""


def implements(obj: object, protocol: Any) -> bool:
    """``isinstance(obj, protocol)`` for a runtime-checkable protocol, remembered per
    class once the class itself has every member (then so does each of its instances);
    members set per instance are checked on each instance."""
    cls = type(obj)
    if _CONFORMING.get((cls, protocol)):
        return True
    if not isinstance(obj, protocol):
        return False
    if isinstance(cls, protocol):  # the members are the class's, not the instance's
        _CONFORMING[(cls, protocol)] = True
    return True
