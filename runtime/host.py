"""``RuntimeHost``: what a runtime's agent handles call (``runtime.slots.AgentHost``).

The handle calls nothing else of the runtime: it checks the runtime is open, that the
store's disk has room, and asks the agent table to rehydrate, dispose or listen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from storage import DiskFullError, Store

from .agent import Agent
from .slots import AgentSlot
from .table import AgentTable

__all__ = ["RuntimeHost"]


class RuntimeHost:
    """What a runtime's agent handles call (``runtime.slots.AgentHost``): the handle
    calls nothing else of the runtime."""

    __slots__ = ("_store", "_table")

    def __init__(self, table: AgentTable, store: Store) -> None:
        self._table = table
        self._store = store

    def check_open(self) -> None:
        self._table.check_open()

    def check_released(self) -> None:
        self._table.check_released()

    def check_room(self) -> None:
        full = self._store.disk_full
        if full is not None:
            raise DiskFullError(
                f"the disk that holds the store is full ({full.free:,} bytes free), so a "
                "send is refused and nothing was logged; send again once there is room",
                full.free,
                full.needed,
            ) from full

    def rehydrate(self, slot: AgentSlot[Agent]) -> None:
        self._table.rehydrate(slot)

    def begin_disposal(self, slot: AgentSlot[Agent], *, keep_inbox: bool) -> None:
        self._table.begin_disposal(slot, keep_inbox=keep_inbox)

    def listen(
        self, name: str, listener: Callable[..., Any], slot: AgentSlot[Agent]
    ) -> Callable[[], None]:
        return self._table.listen(name, listener, slot)
