"""What a load run is asked to do: :class:`LoadSpec` (the pool, the closed loop's
turns, the built-in scripted model's shape, the seed and the time limit)."""

from __future__ import annotations

import msgspec

from actors import Model

from .stack import scripted_load_model

__all__ = ["LoadSpec"]


class LoadSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What to run. ``latency_s`` .. ``failure_rate`` shape the built-in scripted model
    (used when neither ``model`` nor the stack names one)."""

    agents: int = 1000
    turns: int = 10  # per agent, closed loop (an open loop runs for its duration)
    latency_s: float = 0.0  # model latency (the mean, with jitter_s)
    jitter_s: float = 0.0  # uniform spread around latency_s
    chunks: int = 1  # streamed chunks per reply
    tool_calls: int = 0  # calls of the cheap `lookup` tool per turn (one extra step)
    failure_rate: float = 0.0  # fraction of model requests failing with SERVER
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.agents < 1 or self.turns < 1:
            raise ValueError(f"agents and turns must be >= 1, got {self.agents} and {self.turns}")
        if not 0.0 <= self.failure_rate < 1.0:
            raise ValueError(f"failure_rate must be in [0, 1), got {self.failure_rate}")
        if self.latency_s < 0 or self.jitter_s < 0:
            raise ValueError("latency and jitter are seconds >= 0")
        if self.chunks < 1 or self.tool_calls < 0:
            raise ValueError("chunks must be >= 1 and tool_calls >= 0")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")

    def scripted_model(self) -> Model:
        return scripted_load_model(
            latency_s=self.latency_s,
            jitter_s=self.jitter_s,
            chunks=self.chunks,
            tool_calls=self.tool_calls,
            failure_rate=self.failure_rate,
            seed=self.seed,
        )
