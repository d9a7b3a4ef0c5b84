"""The runtime's own error: a closed runtime refuses everything."""

from __future__ import annotations

from actors import AgentDisposedError
from storage import StoreClosedError

__all__ = ["RuntimeClosedError"]


class RuntimeClosedError(AgentDisposedError, StoreClosedError, RuntimeError):
    """The runtime is closed: every public method of it and of its agents' handles
    raises this (``close()`` and ``dispose()`` are idempotent, ``wait_idle()`` returns
    True: a closed runtime's agents are idle for good).

    It is each of the errors these calls raised before it existed, so code that
    catches them goes on working: a ``RuntimeError`` (``spawn``, ``resume``, ``fork``,
    ``on``), a ``StoreClosedError`` (``flush``, ``aflush``), an ``AgentDisposedError``
    (an agent's verbs: close disposed every agent)."""

    def __init__(self) -> None:
        super().__init__("this runtime is closed; open a new one with Runtime.open()")
