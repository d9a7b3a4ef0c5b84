"""Limits, so one agent cannot take the process down.

- :class:`UsageLimits` / :class:`UsageMeter`: model requests and tokens, per agent and per
  runtime. A turn that would go past a limit ends ``{kind: "limit"}`` before its next
  request, with a message naming the limit.
- :class:`Admission`: a cap on turn chains running at once in a runtime. Work beyond it
  waits in a FIFO queue (it never fails) and is admitted as running chains finish.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import msgspec

from storage import LimitExceeded, Usage

__all__ = ["Admission", "UsageLimits", "UsageMeter"]


class UsageLimits(msgspec.Struct, frozen=True):
    """Caps on model usage; ``None`` means no cap."""

    max_requests: int | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")


class UsageMeter:
    """Counts requests and tokens against :class:`UsageLimits` (thread-safe)."""

    __slots__ = ("_lock", "limits", "requests", "scope", "tokens")

    def __init__(self, limits: UsageLimits, scope: str) -> None:
        self.limits = limits
        self.scope = scope
        self._lock = threading.Lock()
        self.requests = 0
        self.tokens = 0

    def exceeded(self) -> LimitExceeded | None:
        """Why no further request may be sent, or None."""
        limits = self.limits
        if limits.max_requests is not None and self.requests >= limits.max_requests:
            return LimitExceeded(
                limit="requests",
                message=f"{self.scope} reached its limit of {limits.max_requests} model requests",
            )
        if limits.max_tokens is not None and self.tokens >= limits.max_tokens:
            return LimitExceeded(
                limit="tokens",
                message=f"{self.scope} used {self.tokens} tokens, its limit is {limits.max_tokens}",
            )
        return None

    def take_request(self) -> LimitExceeded | None:
        """Count one request if the request limit allows it (checked and counted in one
        step, so that agents racing for the last requests never send more than the
        limit); else return why not."""
        limit = self.limits.max_requests
        with self._lock:
            if limit is None or self.requests < limit:
                self.requests += 1
                return None
        return self.exceeded()

    def give_back_request(self) -> None:
        """Undo a :meth:`take_request` whose request was not sent after all."""
        with self._lock:
            self.requests -= 1

    def count_usage(self, usage: Usage) -> None:
        with self._lock:
            self.tokens += usage.input_tokens + usage.output_tokens


class Admission:
    """At most ``limit`` holders at once; the others wait their turn, first come first served.

    Invariant: ``holders <= limit``; a waiter is either queued or has been handed a place.
    """

    def __init__(self, limit: int) -> None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_running_turns must be a positive int, got {limit!r}")
        self.limit = limit
        self._lock = threading.Lock()
        self._holders = 0
        self._queue: deque[Callable[[], None]] = deque()

    @property
    def holders(self) -> int:
        return self._holders

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def enter(self, on_admitted: Callable[[], None]) -> bool:
        """Take a place now (True) or queue ``on_admitted``, called once a place is handed
        over (False)."""
        with self._lock:
            if self._holders < self.limit and not self._queue:
                self._holders += 1
                return True
            self._queue.append(on_admitted)
            return False

    def withdraw(self, on_admitted: Callable[[], None]) -> bool:
        """Leave the queue; False if the place was already handed over."""
        with self._lock:
            try:
                self._queue.remove(on_admitted)
            except ValueError:
                return False
            return True

    def leave(self) -> None:
        """Give the place back, or hand it to the first waiter."""
        with self._lock:
            if self._queue:
                successor = self._queue.popleft()
            else:
                self._holders -= 1
                return
        successor()
