"""corral shards on Ray: many runtimes, in many processes and on many nodes, one facade.

A *shard* is a Ray actor hosting one ordinary :class:`~runtime.Runtime` with its own LMDB
store (``<path>/shard-<k>/``); :class:`Cluster` routes each agent id to one shard, batches
verbs per shard and forwards the live events listened to. Ray places and restarts
shards; it never carries the traffic inside one, nor an agent's verbs (each shard has a
direct connection: :mod:`runtime.cluster.connection`). ``pip install 'corral[ray]'``; see
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
    VerbInterruptedError,
)
from .events import FORWARDED, ClusterEvent
from .factories import AgentRecipe
from .handle import ClusterAgent
from .layout import is_sharded, shard_stores
from .reshard import ReshardReport
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
    "ReshardReport",
    "Router",
    "ShardInfo",
    "ShardUnavailableError",
    "UnportableError",
    "VerbInterruptedError",
    "is_sharded",
    "shard_stores",
]
