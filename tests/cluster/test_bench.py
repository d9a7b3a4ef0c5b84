"""``corral bench --shards N --address ADDR``: the load runs inside each shard of a real
Ray cluster and one merged report comes back; the store reads back as one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.cli.conftest import corral


def test_corral_bench_with_shards_runs_the_load_in_every_shard_and_merges_one_report(
    ray_cluster: Any, tmp_path: Path
) -> None:
    store, record = tmp_path / "store", tmp_path / "report.json"
    bench = _bench(
        ray_cluster.address,
        "--agents",
        "40",
        "--turns",
        "3",
        "--store",
        str(store),
        "--json",
        str(record),
    )
    assert bench.returncode == 0, bench.stdout + bench.stderr
    report = json.loads(record.read_text())
    assert report["settled"] == 120
    assert report["sessions_checked"] == 40
    assert report["invariants_ok"] is True
    assert report["turns_per_s"] > 0
    assert (store / "shard-0" / "data.mdb").exists()
    assert (store / "shard-1" / "data.mdb").exists()
    listed = corral("log", "check", "--store", store, timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "40 sessions OK" in listed.stdout


def _bench(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return corral("bench", "--shards", "2", "--address", address, "-q", *args, timeout=300)


def test_a_stack_of_your_own_with_prompts_runs_an_open_loop_split_over_the_shards(
    ray_cluster: Any, tmp_path: Path
) -> None:
    from storage import AgentInboxSpliced, RequestHeader, Store, UserMessageData

    from ..load import stacks

    prompts = tmp_path / "tasks.jsonl"
    texts = ["weather in Oslo?", "weather in Lima?", "weather in Pune?"]
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    store, record = tmp_path / "store", tmp_path / "report.json"
    bench = _bench(
        ray_cluster.address, "--agent", "tests.load.stacks:factory", "--prompts", str(prompts),
        "--agents", "6", "--rate", "20/s", "--arrivals", "constant", "--duration", "2",
        "--store", str(store), "--json", str(record),
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    report = json.loads(record.read_text())
    loop = report["open_loop"]
    # the shards' shares add up to the requested traffic: 20/s for 2 s, 40 arrivals
    assert (report["mode"], loop["rate"], loop["arrivals"]) == ("open", 20.0, 40)
    assert loop["offered_rate"] == 20.0 and loop["shed"] == 0
    assert report["settled"] == 40 and report["stack"] == "tests.load.stacks:factory"
    assert report["sessions_checked"] == 6 and report["invariants_ok"] is True
    breakdown = report["breakdown"]
    assert breakdown["turns"] == 40 and breakdown["commit"] is not None
    assert breakdown["hooks"]["p50"] >= stacks.HOOK_WAIT_S * 1000  # turn-stopping, per turn
    inserted: list[int] = []
    sent: set[str] = set()
    for shard in ("shard-0", "shard-1"):
        with Store.open(store / shard, readonly=True) as st:
            headers = st.sessions()
            assert headers  # each shard hosted its share
            for header in headers:
                for event in st.read(header.id):
                    data = event.data
                    if isinstance(data, AgentInboxSpliced) and data.inserted:
                        inserted.append(event.time)
                    elif isinstance(data, UserMessageData):
                        sent.update(b.text for b in data.message.content)  # type: ignore[union-attr]
                    elif isinstance(data, RequestHeader):  # the factory's listener, in the shard
                        assert data.config.temperature == stacks.TEMPERATURE
    assert sent <= set(texts) and len(sent) == 3
    inserted.sort()
    rate = (len(inserted) - 1) / ((inserted[-1] - inserted[0]) / 1000)
    assert len(inserted) == 40 and abs(rate - 20.0) <= 0.15 * 20.0, rate


def test_a_sweep_over_sharded_points_reports_each_point_merged(
    ray_cluster: Any, tmp_path: Path
) -> None:
    store, record = tmp_path / "store", tmp_path / "sweep.json"
    bench = _bench(
        ray_cluster.address, "--sweep", "rate=10,20", "--duration", "1", "--agents", "4",
        "--ttft", "0.01", "--reply-tokens", "8", "--arrivals", "constant",
        "--store", str(store), "--json", str(record),
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    sweep = json.loads(record.read_text())
    assert sweep["swept"] == "rate" and [p["value"] for p in sweep["points"]] == [10.0, 20.0]
    for point in sweep["points"]:
        report = point["report"]
        assert report["open_loop"]["rate"] == point["value"]
        assert report["settled"] == report["open_loop"]["arrivals"] == int(point["value"])
        assert report["model"] == "simulated:simulated" and report["invariants_ok"] is True
        assert report["sessions_checked"] == 4  # each point its own sessions
    assert sweep["points"][1]["report"]["earlier_sessions"] == 4
    assert "knee" in bench.stdout


def test_fresh_wipes_a_sharded_store_shard_by_shard(tmp_path: Path) -> None:
    from runtime.cli.wipe import wipe_sharded_store
    from runtime.cluster.layout import claim_layout, shard_path
    from storage import Store

    root = tmp_path / "store"
    claim_layout(root, 2)
    for k in range(2):
        with Store.open(shard_path(root, k)) as st:
            st.create_session()
    wipe_sharded_store(root)
    assert list(root.iterdir()) == []
    claim_layout(root, 3)  # the layout is gone with it: a new one may be made
