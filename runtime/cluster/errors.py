"""The errors of a sharded cluster, each a :class:`~storage.errors.CorralError`."""

from __future__ import annotations

from storage import CorralError

__all__ = [
    "ClusterClosedError",
    "ClusterError",
    "ClusterLayoutError",
    "DuplicateAgentError",
    "RayMissingError",
    "ShardStartError",
    "ShardUnavailableError",
    "UnportableError",
    "VerbInterruptedError",
]


class ClusterError(CorralError):
    """Base of every error the cluster facade raises."""


class RayMissingError(ClusterError, ImportError):
    """Ray is not installed in this environment."""

    def __init__(self) -> None:
        super().__init__(
            "corral's cluster runs on Ray, which is not installed: "
            "pip install 'corral[ray]' (on the driver and on every node)"
        )


class UnportableError(ClusterError, TypeError):
    """A model or tool cannot cross the process boundary to a shard: only model strings
    and importable factories (``package.module:function``) can."""


class ClusterLayoutError(ClusterError, ValueError):
    """The store at a path was made by a cluster of another shape (its shard count)."""


class DuplicateAgentError(ClusterError, ValueError):
    """An agent with this id exists in the cluster already."""


class ShardStartError(ClusterError):
    """A shard's runtime could not start (its store, its setup factory, a resume): the
    message says which; every call on that shard raises it."""


class ShardUnavailableError(ClusterError):
    """A shard did not answer: it died for good (out of restarts, its node gone), or it
    was still restarting when the verb's deadline passed."""


class ClusterClosedError(ClusterError, RuntimeError):
    """The cluster is closed: open a new one with ``Cluster.open()``."""

    def __init__(self) -> None:
        super().__init__("this cluster is closed; open a new one with Cluster.open()")


class VerbInterruptedError(ClusterError):
    """A shard's process died with an inbox edit (``remove``, ``replace``, ``splice``) in
    flight: it may or may not have been applied, and applying it twice is not safe, so
    it is not sent again. Read the agent's inbox and edit again."""
