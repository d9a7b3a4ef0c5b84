"""``corral bench --shards N --address ADDR``: the load runs inside each shard of a real
Ray cluster and one merged report comes back; the store reads back as one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def test_corral_bench_with_shards_runs_the_load_in_every_shard_and_merges_one_report(
    ray_cluster: Any, tmp_path: Path
) -> None:
    store, record = tmp_path / "store", tmp_path / "report.json"
    bench = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime.cli",
            "bench",
            "--shards",
            "2",
            "--address",
            ray_cluster.address,
            "--agents",
            "40",
            "--turns",
            "3",
            "--store",
            str(store),
            "--json",
            str(record),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert bench.returncode == 0, bench.stdout + bench.stderr
    report = json.loads(record.read_text())
    assert report["settled"] == 120
    assert report["sessions_checked"] == 40
    assert report["invariants_ok"] is True
    assert report["turns_per_s"] > 0
    assert (store / "shard-0" / "data.mdb").exists()
    assert (store / "shard-1" / "data.mdb").exists()
    listed = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "log", "check", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "40 sessions OK" in listed.stdout
