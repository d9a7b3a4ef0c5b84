"""What ``corral acp`` adds to a prompt: the same turns in process and through ACP.

One agent, ``--prompts`` sequential prompts, each answered by ``ScriptedModel`` in
``--chunks`` streamed chunks, write-ahead, on a fresh store:

- ``in process``: ``agent.followup`` and wait for ``agent/settled`` (the floor);
- ``corral acp``: ``session/prompt`` from the SDK's client to ``corral acp`` as a
  subprocess over stdio, every chunk an ``agent_message_chunk`` notification, the
  prompt answered with its stop reason.

Reported: per-prompt latency (median, p95), streamed chunks/s, and the ratio of the
ACP median to the in-process one (both measured in this run).

    python benchmarks/bench_acp.py [--prompts 200] [--chunks 20] [--json PATH]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # (also when corral acp loads it)

from benchmarks._common import median, parser, percentile, print_table, system_info, write_json
from runtime import Runtime, ScriptedModel

ROOT = Path(__file__).resolve().parent.parent

CHUNKS_ENV = "CORRAL_BENCH_ACP_CHUNKS"


def make_model() -> ScriptedModel:
    """The model of both cases (``corral acp --model benchmarks/bench_acp.py:make_model``)."""
    chunks = int(os.environ.get(CHUNKS_ENV, "20"))
    return ScriptedModel([], chunks=chunks)  # echoes the prompt, split in ``chunks``


PROMPT = "a prompt of about eighty characters, which the scripted model streams back " * 2


def in_process(store: Path, prompts: int) -> list[float]:
    rt = Runtime.open(store)
    try:
        settled = threading.Semaphore(0)
        agent = rt.spawn(model=make_model())
        agent.on("agent/settled", lambda _e: settled.release())
        latencies = []
        for _ in range(prompts):
            start = time.perf_counter()
            agent.followup(PROMPT)
            if not settled.acquire(timeout=60):
                raise TimeoutError("a turn did not settle within 60 s")
            latencies.append(time.perf_counter() - start)
        return latencies
    finally:
        rt.close()


class _Client:
    def __init__(self) -> None:
        self.chunks = 0

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.chunks += 1

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no tool asks here")


async def through_acp(store: Path, prompts: int, chunks: int) -> tuple[list[float], int]:
    from acp import PROTOCOL_VERSION, spawn_agent_process, text_block

    client = _Client()
    env = {**os.environ, "PYTHONPATH": str(ROOT), CHUNKS_ENV: str(chunks)}
    model = f"{Path(__file__).resolve()}:make_model"
    args = ["-m", "runtime.cli", "acp", "--model", model, "--store", str(store)]
    async with spawn_agent_process(
        client, sys.executable, *args, env=env, transport_kwargs={"stderr": None}
    ) as (conn, _):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        session = await conn.new_session(cwd=str(store.parent), mcp_servers=[])
        latencies = []
        for _ in range(prompts):
            start = time.perf_counter()
            answer = await conn.prompt(session_id=session.session_id, prompt=[text_block(PROMPT)])
            latencies.append(time.perf_counter() - start)
            assert answer.stop_reason == "end_turn", answer
    return latencies, client.chunks


def main() -> None:
    p = parser(__doc__.splitlines()[0], repeats=1)
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--chunks", type=int, default=20)
    args = p.parse_args()
    os.environ[CHUNKS_ENV] = str(args.chunks)
    with tempfile.TemporaryDirectory() as root:
        local = in_process(Path(root) / "local", args.prompts)
        remote, streamed = asyncio.run(through_acp(Path(root) / "acp", args.prompts, args.chunks))
    size = -(-len(PROMPT) // args.chunks)  # how ScriptedModel splits a reply
    per_prompt = -(-len(PROMPT) // size)
    assert streamed == args.prompts * per_prompt, (streamed, args.prompts * per_prompt)
    rows, results = [], {"prompts": args.prompts, "chunks": per_prompt, "cases": {}}
    base = median(local)
    for name, latencies in (("in process", local), ("corral acp", remote)):
        med, p95 = median(latencies), percentile(latencies, 95)
        rate = per_prompt / med
        results["cases"][name] = {
            "median_ms": med * 1000,
            "p95_ms": p95 * 1000,
            "chunks_per_s": rate,
        }
        rows.append([name, med * 1000, p95 * 1000, rate, med / base])
    print(f"{args.prompts} sequential prompts, {per_prompt} chunks each")
    print_table(["case", "median ms", "p95 ms", "chunks/s", "x in process"], rows)
    results["system"] = system_info()
    write_json(args.json, "bench_acp", results)


if __name__ == "__main__":
    main()
