"""corral shards on Ray: many runtimes, in many processes and on many nodes, one facade.

A *shard* is a Ray actor hosting one ordinary :class:`~runtime.Runtime` with its own LMDB
store (``<path>/shard-<k>/``); :class:`Cluster` routes each agent id to one shard, batches
verbs per shard and forwards the live events listened to. Ray places and restarts
shards; it never carries the traffic inside one. ``pip install 'corral[ray]'``; see
``docs/cluster.md``.
"""

from .cluster import Cluster
from .errors import (
    ClusterClosedError,
    ClusterError,
    ClusterLayoutError,
    DuplicateAgentError,
    RayMissingError,
    ShardUnavailableError,
    UnportableError,
)
from .events import FORWARDED, ClusterEvent
from .factories import AgentRecipe
from .handle import ClusterAgent
from .layout import is_sharded, shard_stores
from .routing import Router
from .shard import ShardInfo

__all__ = [
    "FORWARDED",
    "AgentRecipe",
    "Cluster",
    "ClusterAgent",
    "ClusterClosedError",
    "ClusterError",
    "ClusterEvent",
    "ClusterLayoutError",
    "DuplicateAgentError",
    "RayMissingError",
    "Router",
    "ShardInfo",
    "ShardUnavailableError",
    "UnportableError",
    "is_sharded",
    "shard_stores",
]
