"""Dead letters: messages that reached an actor which had already stopped (or whose
dispatcher had), counted and the latest kept, one sink per dispatcher."""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

__all__ = ["DeadLetter", "DeadLetters"]

logger = logging.getLogger("corral.actors")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that reached an actor which had already stopped."""

    actor: str
    message: object
    reason: str


class DeadLetters:
    """A sink that counts undeliverable messages and keeps the most recent ones."""

    def __init__(self, capacity: int = 100) -> None:
        self._lock = threading.Lock()
        self._count = 0  # Invariant: only changed under _lock.
        self._recent: deque[DeadLetter] = deque(maxlen=capacity)

    def record(self, actor: str, message: object, reason: str) -> None:
        letter = DeadLetter(actor=actor, message=message, reason=reason)
        with self._lock:
            self._count += 1
            self._recent.append(letter)
        logger.debug("dead letter for %s (%s): %r", actor, reason, message)

    @property
    def count(self) -> int:
        return self._count

    def recent(self) -> tuple[DeadLetter, ...]:
        with self._lock:
            return tuple(self._recent)
