"""The batch spawn's pieces that are not the runtime's (see ``Runtime.spawn_many``): how
many agents one registry message starts, and the countdown the spawning thread waits on
while each new agent's actor runs its announcement."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final, Generic, TypeVar

__all__ = ["SPAWN_BATCH", "Announcements"]

SPAWN_BATCH: Final = 500
"""Agents one registry message of ``rt.spawn_many`` starts (the registry's handler stays
short, like an actor's batch of messages)."""

H = TypeVar("H")


class Announcements(Generic[H]):
    """The announcements of one batch: each runs on its agent's actor (told, not asked:
    one wake-up of the spawning thread for the whole batch, not a future per agent, each
    of which took the interpreter lock from the worker running the next announcement);
    the spawning thread waits for the last one."""

    def __init__(self, count: int) -> None:
        self._left = count
        self._lock = threading.Lock()
        self._all = threading.Event()
        self.done: list[H] = []
        """The agents announced, in the order they were."""
        self.failure: BaseException | None = None
        """The first announcement's failure, if any (the spawning thread raises it)."""

    def run(self, agent: H, announce: Callable[[], None]) -> None:
        """On ``agent``'s actor: run its announcement, count it."""
        try:
            announce()
        except BaseException as err:  # noqa: BLE001 -- the spawning thread raises it
            with self._lock:
                self.failure = self.failure or err
        else:
            with self._lock:
                self.done.append(agent)
        finally:
            with self._lock:
                self._left -= 1
                if not self._left:
                    self._all.set()

    def wait(self) -> None:
        """Until every announcement of the batch has run."""
        if self._left:
            self._all.wait()
