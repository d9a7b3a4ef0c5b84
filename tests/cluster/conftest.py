"""One real multi-node Ray cluster for every cluster test (``ray.cluster_utils.Cluster``):
a head node that runs nothing (0 CPUs) and two worker nodes of one CPU each, so that a
two-shard cluster puts one shard on each node, as on two machines. Every node is a real
raylet with its own worker processes; a test SIGKILLs one of those.

Ray's start costs ~5-10 s on this machine, so the cluster is made once per session of
these tests and shut down at the end; each test opens its own ``Cluster`` (its own store
in ``tmp_path``, its own shard actors) on it and closes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip(
    "ray", reason="the cluster tests need the ray extra: pip install 'corral[ray]'"
)


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster as RayCluster

    # Ray's workers inherit the environment of the raylets started here: with the repo
    # root on their path they import this tree and tests.cluster.stack's factories; at
    # niceness 0 (Ray's default is 15) as the test process.
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "RAY_worker_niceness")}
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *(p for p in paths if p != root)])
    os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112 - Ray reads this exact name
    common = {"object_store_memory": 80 << 20}
    cluster = None
    try:
        cluster = RayCluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "include_dashboard": False, **common},
        )
        for _ in range(2):
            cluster.add_node(num_cpus=1, **common)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
