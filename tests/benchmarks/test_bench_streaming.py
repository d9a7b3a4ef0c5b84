"""``benchmarks/bench_streaming.py``'s corral clients, small, against its own server in a
process of its own: every chunk arrives durable, and a ProcessModel's child's CPU is
counted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_streaming  # noqa: E402 -- the benchmarks directory is not a package


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("client", ["corral", "corral-proc"])
def test_a_saturated_run_logs_every_chunk(wire: str, client: str) -> None:
    with bench_streaming.sse_server(5) as port:
        result = bench_streaming.run_client(client, port, wire, 3, 2)
    assert result["chunks"] == 3 * 2 * 5  # the text chunks in the agents' logs
    assert result["cpu_s"] > 0


def test_a_paced_run_through_a_process_model_times_every_chunk() -> None:
    with bench_streaming.sse_server(4, ttft=0.0, tps=200.0) as port:
        result = bench_streaming.run_paced(port, "openai", 3, 1, 0.0, process=True)
    assert (result["completed"], result["failed"]) == (3, 0)
    assert result["chunks"] == 3 * 4  # a delay for every text chunk
    assert 0 <= result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
