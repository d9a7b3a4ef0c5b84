"""Counting a run's failures by code: every failed model request (retried or not) and
every turn that ended in error, with the first message seen for each code."""

from __future__ import annotations

from .report import FailureCount

__all__ = ["FailureTally"]


class FailureTally:
    """Failed requests and turns by code, with the first message of each code (not
    thread-safe: the driver counts under its lock)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.turns: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def request(self, code: str, message: str) -> None:
        self.requests[code] = self.requests.get(code, 0) + 1
        self.examples.setdefault(code, message)

    def turn(self, code: str, message: str) -> None:
        self.turns[code] = self.turns.get(code, 0) + 1
        self.examples.setdefault(code, message)

    def counts(self) -> list[FailureCount]:
        codes = sorted(set(self.requests) | set(self.turns))
        return [
            FailureCount(
                c,
                max(self.requests.get(c, 0), self.turns.get(c, 0)),
                self.turns.get(c, 0),
                FailureCount.clip(self.examples.get(c, "")),
            )
            for c in codes
        ]

    def retried(self) -> int:
        return sum(max(0, n - self.turns.get(c, 0)) for c, n in self.requests.items())
