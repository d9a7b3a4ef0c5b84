"""``benchmarks/bench_acp.py``, small: both cases answer every prompt, and every chunk
of every reply reaches the ACP client."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_acp  # noqa: E402 -- the benchmarks directory is not a package


def test_both_cases_answer_every_prompt_and_stream_every_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(bench_acp.CHUNKS_ENV, "5")
    assert len(bench_acp.in_process(tmp_path / "local", 3)) == 3
    latencies, chunks = asyncio.run(bench_acp.through_acp(tmp_path / "acp", 3, 5))
    assert len(latencies) == 3 and all(t > 0 for t in latencies)
    assert chunks == 3 * 5  # 150 characters in 5 chunks of 30
