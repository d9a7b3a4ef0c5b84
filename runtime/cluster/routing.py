"""Which shard hosts an agent: rendezvous (highest random weight) hashing of its id.

Every driver computes the same answer with no shared state: the shard ``k`` with the
highest ``blake2b(k, id)`` wins. Rendezvous hashing moves only ``1/N`` of the ids when a
shard is added, but corral does not reshard a store (a store remembers its shard count:
see :mod:`runtime.cluster.layout`), so what matters here is that it is stable, uniform and
cheap (~1 us per shard per id).
"""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import blake2b

__all__ = ["Router"]


class Router:
    """Routes agent ids over ``shards`` shards."""

    def __init__(self, shards: int) -> None:
        if type(shards) is not int or shards < 1:
            raise ValueError(f"shards must be an int >= 1, got {shards!r}")
        self.shards = shards
        self._salts = [k.to_bytes(4, "big") for k in range(shards)]

    def shard_of(self, agent_id: str) -> int:
        """The shard that hosts ``agent_id``."""
        if self.shards == 1:
            return 0
        key = agent_id.encode()
        best, best_weight = 0, b""
        for k, salt in enumerate(self._salts):
            weight = blake2b(key, digest_size=8, salt=salt).digest()
            if weight > best_weight:
                best, best_weight = k, weight
        return best

    def group(self, agent_ids: Iterable[str]) -> dict[int, list[str]]:
        """``agent_ids`` by shard, each list in the order given."""
        groups: dict[int, list[str]] = {}
        for agent_id in agent_ids:
            groups.setdefault(self.shard_of(agent_id), []).append(agent_id)
        return groups
