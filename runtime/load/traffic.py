"""Traffic shapes: when the arrivals of an open-loop run come.

An open loop sends work as production traffic arrives, whether or not the stack keeps
up: ``rate`` arrivals per second for ``duration_s``, spaced evenly (``constant``) or
as a Poisson process (``poisson``: exponential gaps, from a seeded
:class:`random.Random`). A closed loop (``rate`` None) sends an agent's next turn when
its last one settled.
"""

from __future__ import annotations

import math
import random
from typing import Literal

import msgspec

__all__ = ["Traffic", "arrival_times"]


class Traffic(msgspec.Struct, frozen=True, kw_only=True):
    """An open loop's arrivals."""

    rate: float  # arrivals per second
    duration_s: float
    shape: Literal["poisson", "constant"] = "poisson"
    queue_limit: int | None = None  # arrivals waiting for a free agent; None: agents x 10
    phase_s: float = 0.0  # constant arrivals: the first one's offset (a shard's share)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate is arrivals per second > 0, got {self.rate}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.shape not in ("poisson", "constant"):
            raise ValueError(f"shape is 'poisson' or 'constant', got {self.shape!r}")
        if self.queue_limit is not None and self.queue_limit < 0:
            raise ValueError(f"queue_limit must be >= 0, got {self.queue_limit}")
        if not (math.isfinite(self.phase_s) and 0 <= self.phase_s < self.duration_s):
            raise ValueError(f"phase_s must be in [0, duration_s), got {self.phase_s}")

    def share(self, parts: int, index: int) -> Traffic:
        """Part ``index`` of ``parts`` runs that together offer this traffic: each at
        ``rate / parts`` (and its share of ``queue_limit``); constant arrivals are
        interleaved (part k's offset by k arrivals of the whole), Poisson ones are
        independent (a run's seed its own), whose sum is Poisson at ``rate``."""
        if not 0 <= index < parts:
            raise ValueError(f"part {index} of {parts}")
        limit = self.queue_limit
        if limit is not None:
            limit = limit // parts + (1 if index < limit % parts else 0)
        phase = self.phase_s + index / self.rate if self.shape == "constant" else 0.0
        return msgspec.structs.replace(
            self, rate=self.rate / parts, queue_limit=limit, phase_s=phase % self.duration_s
        )

    @staticmethod
    def parse_rate(text: str) -> float:
        """``"200"``, ``"200/s"``, ``"12000/min"`` as arrivals per second."""
        number, _, unit = text.strip().partition("/")
        scale = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 1 / 60, "min": 1 / 60, "h": 1 / 3600}
        if unit not in scale:
            raise ValueError(f"a rate is N, N/s, N/min or N/h, got {text!r}")
        try:
            rate = float(number) * scale[unit]
        except ValueError:
            raise ValueError(f"a rate is N, N/s, N/min or N/h, got {text!r}") from None
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"a rate must be > 0, got {text!r}")
        return rate


def arrival_times(traffic: Traffic, seed: int = 0) -> list[float]:
    """The arrival offsets (seconds from the start) within ``traffic.duration_s``."""
    out: list[float] = []
    if traffic.shape == "constant":
        gap = 1.0 / traffic.rate
        count = math.floor((traffic.duration_s - traffic.phase_s) * traffic.rate - 1e-9) + 1
        return [traffic.phase_s + i * gap for i in range(count)]
    rng = random.Random(seed)
    t = rng.expovariate(traffic.rate)
    while t < traffic.duration_s:
        out.append(t)
        t += rng.expovariate(traffic.rate)
    return out
