"""What one streamed chunk costs a client: corral against the HTTP floor, side by side.

A pre-rendered loopback SSE server runs in its own process (``_sse_server.py``: OpenAI
and Anthropic wire formats); each client runs in a fresh process of its own and reports
its own CPU time (user + system, ``getrusage``) over the streaming work only, so imports
and start-up are not counted. S concurrent streams x R requests each x C text chunks:

- ``floor``: asyncio streams + msgspec, no HTTP library (HTTP/1.1 keep-alive and chunked
  decoding written out by hand): the least a Python client can pay;
- ``aiohttp``: ``aiohttp.ClientSession`` + msgspec;
- ``sdk``: the official SDK's stream loop (``openai`` / ``anthropic``), what a user
  writes without corral;
- ``corral``: S agents (spawned together with ``rt.spawn_many``, as ``corral bench``
  spawns its fleet), each R turns, through ``OpenAICompatModel`` / ``AnthropicModel``,
  write-ahead durability, every chunk a durable ``assistant/chunk`` fact on disk.

Reported per client: CPU us per chunk, chunks/s, and ratios against ``aiohttp`` and
``sdk`` measured in the same run.

The **paced** mode (``--paced``) asks how many agents one process can host at a
realistic token rate: the server writes each agent's deltas at ``--tps`` tokens/s after
``--ttft`` seconds, stamping each with the time it wrote it; corral's ``session/event``
listener sees each ``assistant/chunk`` and records how much later that was. Each agent
runs ``--turns`` turns back to back; their first requests are spread evenly over
``--ramp`` seconds, as independent users' requests arrive (``--ramp 0`` sends them all at
once, so that every stream's deltas come in the same server tick: a burst, not a
load). For each N in ``--agents`` it reports the p50/p99 extra delay, the cores the
client and the server used, and whether p99 < ``--budget-ms``, for corral beside two
clients on the same schedule: a bare aiohttp + msgspec client (no log, no actors) and the
floor (a raw ``asyncio.Protocol`` that only finds the stamps in the bytes): what any
Python client, and the least one, sees on this machine at that moment.

    python benchmarks/bench_streaming.py                       # 200 x 5 x 50, both wires
    python benchmarks/bench_streaming.py --wire openai --streams 200 --requests 5
    python benchmarks/bench_streaming.py --paced --agents 250,500,1000 --tps 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import median, parser, percentile, print_table, write_json

# corral-proc: corral with its model in a process of its own (runtime.providers.ProcessModel);
# its CPU is both processes'.
CLIENTS = ("floor", "aiohttp", "sdk", "corral", "corral-proc")
PACED_CLIENTS = ("floor", "aiohttp", "corral", "corral-proc")
WIRES = ("openai", "anthropic")
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _body(wire: str) -> bytes:
    if wire == "openai":
        return json.dumps({
            "model": "bench", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hello"}],
        }).encode()
    return json.dumps({
        "model": "bench", "stream": True, "max_tokens": 1024,
        "messages": [{"role": "user", "content": "hello"}],
    }).encode()


def _count_text(wire: str, data: bytes, decoder: Any) -> int:
    """1 when the SSE ``data`` payload is a text delta (what every client counts)."""
    if data == b"[DONE]":
        return 0
    event = decoder.decode(data)
    if wire == "openai":
        choices = event.get("choices") or ()
        return 1 if choices and choices[0].get("delta", {}).get("content") else 0
    return 1 if event.get("type") == "content_block_delta" else 0


def _sse_data(event: bytes) -> bytes:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].lstrip()
    return b""


# --------------------------------------------------------------------------- clients


async def _floor(port: int, wire: str, streams: int, requests: int) -> int:
    import msgspec

    decoder = msgspec.json.Decoder()
    body = _body(wire)
    head = (
        f"POST {PATHS[wire]} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def one() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        seen = 0
        try:
            for _ in range(requests):
                writer.write(head)
                await reader.readuntil(b"\r\n\r\n")  # status + headers (chunked, by the server)
                pending = b""
                while True:
                    size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
                    if size == 0:
                        await reader.readexactly(2)
                        break
                    pending += (await reader.readexactly(size + 2))[:-2]
                    *events, pending = pending.split(b"\n\n")
                    for event in events:
                        seen += _count_text(wire, _sse_data(event), decoder)
        finally:
            writer.close()
        return seen

    return sum(await asyncio.gather(*(one() for _ in range(streams))))


async def _aiohttp(port: int, wire: str, streams: int, requests: int) -> int:
    import aiohttp
    import msgspec

    decoder = msgspec.json.Decoder()
    body = _body(wire)
    url = f"http://127.0.0.1:{port}{PATHS[wire]}"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> int:
            seen = 0
            for _ in range(requests):
                async with session.post(
                    url, data=body, headers={"content-type": "application/json"}
                ) as response:
                    pending = b""
                    async for part in response.content.iter_any():
                        pending += part
                        *events, pending = pending.split(b"\n\n")
                        for event in events:
                            seen += _count_text(wire, _sse_data(event), decoder)
            return seen

        return sum(await asyncio.gather(*(one() for _ in range(streams))))


async def _sdk(port: int, wire: str, streams: int, requests: int) -> int:
    messages: Any = [{"role": "user", "content": "hello"}]
    if wire == "openai":
        import openai

        client: Any = openai.AsyncOpenAI(
            api_key="bench", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0
        )

        async def one() -> int:
            seen = 0
            for _ in range(requests):
                stream = await client.chat.completions.create(
                    model="bench", messages=messages, stream=True
                )
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        seen += 1
            return seen
    else:
        import anthropic

        client = anthropic.AsyncAnthropic(
            api_key="bench", base_url=f"http://127.0.0.1:{port}", max_retries=0
        )

        async def one() -> int:
            seen = 0
            for _ in range(requests):
                stream = await client.messages.create(
                    model="bench", messages=messages, max_tokens=1024, stream=True
                )
                async for event in stream:
                    if event.type == "content_block_delta":
                        seen += 1
            return seen

    try:
        return sum(await asyncio.gather(*(one() for _ in range(streams))))
    finally:
        await client.close()


def _corral_model(wire: str, port: int, process: bool = False) -> Any:
    from runtime.providers import AnthropicModel, OpenAICompatModel, ProcessModel

    if wire == "openai":
        factory, kwargs = OpenAICompatModel, {"base_url": f"http://127.0.0.1:{port}/v1"}
    else:
        factory, kwargs = AnthropicModel, {"base_url": f"http://127.0.0.1:{port}", "api_key": "bench"}
    if process:
        return ProcessModel(factory, "bench", timeout=300, **kwargs)
    return factory("bench", timeout=300, **kwargs)


class _ModelCpu:
    """CPU seconds of a ProcessModel's child (0 for a model in this process): started
    (its imports done) before the measured part, as this process's own are."""

    def __init__(self, rt: Any, model: Any) -> None:
        self.model = model
        self.start = 0.0
        if hasattr(model, "pids"):
            asyncio.run_coroutine_threadsafe(model.start(), rt.io.loop).result(60)
            self.start = self.now()

    def now(self) -> float:
        pids = getattr(self.model, "pids", [])
        return sum(_process_cpu_s(pid) for pid in pids)

    def used(self) -> float:
        return self.now() - self.start


def _drive(
    rt: Any, model: Any, agents: int, requests: int, timeout: float, ramp: float = 0.0
) -> tuple[int, int]:
    """Spawn ``agents``; each runs ``requests`` turns back to back, the first ones sent
    evenly over ``ramp`` seconds (0: all at once). (completed, failed)."""
    done = threading.Event()
    lock = threading.Lock()
    left: dict[str, int] = {}
    tally = {"completed": 0, "failed": 0, "finished": 0}

    def settled(event: Any) -> None:
        agent = event.agent
        with lock:
            tally["completed" if event.reason.kind == "completed" else "failed"] += 1
            left[agent.id] -= 1
            more = left[agent.id] > 0
            if not more:
                tally["finished"] += 1
                if tally["finished"] == agents:
                    done.set()
        if more:
            agent.followup("hello")

    rt.on("agent/settled", settled)
    handles = rt.spawn_many(agents, model=model)
    for handle in handles:
        left[handle.id] = requests
    start = time.perf_counter()
    for n, handle in enumerate(handles):
        wait = start + ramp * n / agents - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        handle.followup("hello")
    if not done.wait(timeout):
        raise TimeoutError(f"corral: not every agent finished within {timeout} s")
    return tally["completed"], tally["failed"]


def _corral(
    port: int, wire: str, streams: int, requests: int, store: Path, process: bool = False
) -> tuple[int, float, float, int]:
    from runtime import Runtime

    model = _corral_model(wire, port, process)
    rt = Runtime.open(store, durability="write-ahead")
    try:
        model_cpu = _ModelCpu(rt, model)
        cpu0, wall0 = _cpu_s(), time.perf_counter()
        completed, failed = _drive(rt, model, streams, requests, timeout=900)
        rt.flush()
        cpu, wall = _cpu_s() - cpu0 + model_cpu.used(), time.perf_counter() - wall0
        chunks = sum(
            1
            for agent in rt.agents()
            for event in agent.session.events()
            if event.type == "assistant/chunk"
            and getattr(event.data.chunk, "kind", None) == "text"
        )
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(model.aclose(), rt.io.loop).result(30)
        rt.close()
    if failed:
        raise RuntimeError(f"corral: {failed} of {completed + failed} turns failed")
    return chunks, cpu, wall, completed


def run_client(client: str, port: int, wire: str, streams: int, requests: int) -> dict[str, Any]:
    if client in ("corral", "corral-proc"):
        with tempfile.TemporaryDirectory() as tmp:
            chunks, cpu, wall, _ = _corral(
                port, wire, streams, requests, Path(tmp) / "store", client == "corral-proc"
            )
    else:
        fn = {"floor": _floor, "aiohttp": _aiohttp, "sdk": _sdk}[client]
        cpu0, wall0 = _cpu_s(), time.perf_counter()
        chunks = asyncio.run(fn(port, wire, streams, requests))
        cpu, wall = _cpu_s() - cpu0, time.perf_counter() - wall0
    return {"client": client, "wire": wire, "chunks": chunks, "cpu_s": cpu, "wall_s": wall}


# --------------------------------------------------------------------------- paced mode

STAMP = re.compile(r"@(\d+\.\d+)")
STAMP_BYTES = re.compile(rb"@(\d+\.\d+)")


def run_paced(
    port: int, wire: str, agents: int, turns: int, ramp: float, process: bool = False
) -> dict[str, Any]:
    """N agents, ``turns`` turns each, the first requests spread over ``ramp`` seconds,
    against the paced server: the delay of every chunk."""
    from runtime import Runtime

    model = _corral_model(wire, port, process)
    seen_at: list[tuple[float, Any]] = []  # (when, chunk): the stamps are read after the run

    def seen(event: Any) -> None:
        fact = event.event
        if fact.type == "assistant/chunk":
            seen_at.append((time.time(), fact.data.chunk))

    with tempfile.TemporaryDirectory() as tmp:
        rt = Runtime.open(Path(tmp) / "store", durability="write-ahead")
        try:
            rt.on("session/event", seen)
            model_cpu = _ModelCpu(rt, model)
            cpu0, wall0 = _cpu_s(), time.perf_counter()
            completed, failed = _drive(rt, model, agents, turns, timeout=900, ramp=ramp)
            cpu, wall = _cpu_s() - cpu0 + model_cpu.used(), time.perf_counter() - wall0
        finally:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(model.aclose(), rt.io.loop).result(30)
            rt.close()
    delays = []
    for when, chunk in seen_at:
        match = STAMP.search(chunk.text) if getattr(chunk, "kind", None) == "text" else None
        if match:
            delays.append(when - float(match.group(1)))
    return _paced_result(agents, completed, failed, delays, cpu, wall)


def run_paced_aiohttp(
    port: int, wire: str, agents: int, turns: int, ramp: float
) -> dict[str, Any]:
    """The same schedule through a bare aiohttp + msgspec client (no log, no actors): the
    delay any Python client sees on this machine now, for reading corral's against."""
    import aiohttp

    body = _body(wire)
    url = f"http://127.0.0.1:{port}{PATHS[wire]}"
    delays: list[float] = []

    async def run() -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(n: int) -> None:
                await asyncio.sleep(ramp * n / agents)
                for _ in range(turns):
                    async with session.post(
                        url, data=body, headers={"content-type": "application/json"}
                    ) as response:
                        async for part in response.content.iter_any():
                            now = time.time()
                            delays.extend(
                                now - float(m.group(1)) for m in STAMP_BYTES.finditer(part)
                            )

            await asyncio.gather(*(one(n) for n in range(agents)))

    cpu0, wall0 = _cpu_s(), time.perf_counter()
    asyncio.run(run())
    cpu, wall = _cpu_s() - cpu0, time.perf_counter() - wall0
    return _paced_result(agents, agents * turns, 0, delays, cpu, wall)


def run_paced_floor(port: int, wire: str, agents: int, turns: int, ramp: float) -> dict[str, Any]:
    """The same schedule through the least a Python client can do: a raw
    ``asyncio.Protocol`` per agent (one keep-alive connection, the request written out by
    hand, each read's stamps found in its bytes; no HTTP library, no JSON decoding): how
    late *any* Python client on this machine sees the chunks, whatever it does with them."""
    body = _body(wire)
    request = (
        f"POST {PATHS[wire]} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    delays: list[float] = []

    class Reader(asyncio.Protocol):
        def __init__(self) -> None:
            self.pending = b""  # after the last complete event (a stamp may be split)
            self.done: asyncio.Future[None] | None = None

        def data_received(self, data: bytes) -> None:
            now = time.time()
            data = self.pending + data
            end = data.rfind(b"\n\n")  # events end in a blank line
            end = 0 if end < 0 else end + 2
            delays.extend(now - float(m.group(1)) for m in STAMP_BYTES.finditer(data, 0, end))
            self.pending = data[end:]
            if self.pending.endswith(b"\r\n0\r\n\r\n") and self.done is not None:
                self.pending = b""
                self.done.set_result(None)  # the last chunk of chunked encoding

    async def run() -> None:
        loop = asyncio.get_running_loop()

        async def one(n: int) -> None:
            await asyncio.sleep(ramp * n / agents)
            transport, reader = await loop.create_connection(Reader, "127.0.0.1", port)
            try:
                for _ in range(turns):
                    reader.done = loop.create_future()
                    transport.write(request)
                    await reader.done
            finally:
                transport.close()

        await asyncio.gather(*(one(n) for n in range(agents)))

    cpu0, wall0 = _cpu_s(), time.perf_counter()
    asyncio.run(run())
    cpu, wall = _cpu_s() - cpu0, time.perf_counter() - wall0
    return _paced_result(agents, agents * turns, 0, delays, cpu, wall)


def _paced_result(
    agents: int, completed: int, failed: int, delays: list[float], cpu: float, wall: float
) -> dict[str, Any]:
    return {
        "agents": agents,
        "completed": completed,
        "failed": failed,
        "chunks": len(delays),
        "cpu_s": cpu,
        "wall_s": wall,
        "p50_ms": percentile(delays, 50) * 1e3 if delays else 0.0,
        "p99_ms": percentile(delays, 99) * 1e3 if delays else 0.0,
        "max_ms": max(delays) * 1e3 if delays else 0.0,
    }


# --------------------------------------------------------------------------- driver


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def sse_server(
    chunks: int, *, ttft: float = 0.0, tps: float | None = None, info: dict[str, Any] | None = None
) -> Iterator[int]:
    """The loopback server in its own process; yields its port. ``info``, if given, gets
    ``cpu_s``: the server's CPU seconds while the block ran."""
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "_sse_server.py"),
               "--port-file", str(port_file), "--chunks", str(chunks), "--ttft", str(ttft)]
        if tps is not None:
            cmd += ["--tps", str(tps)]
        proc = subprocess.Popen(cmd)
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the SSE server did not start")
                time.sleep(0.02)
            cpu0 = _process_cpu_s(proc.pid)
            yield int(port_file.read_text())
            if info is not None:
                info["cpu_s"] = _process_cpu_s(proc.pid) - cpu0
        finally:
            proc.kill()
            proc.wait()


def _child(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True, text=True, env=env, check=False, timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _paced_case(args: argparse.Namespace, wire: str, client: str, agents: int) -> dict[str, Any]:
    """One paced run of ``client`` with ``agents`` agents against a fresh server."""
    kind = f"paced-{client}"
    server: dict[str, Any] = {}
    with sse_server(args.chunks, ttft=args.ttft, tps=args.tps, info=server) as port:
        r = _child([kind, str(port), wire, str(agents), str(args.turns), str(args.ramp)])
    r["wire"], r["client"] = wire, client
    r["server_cpu_s"] = server["cpu_s"]
    r["ok"] = r["p99_ms"] < args.budget_ms and not r["failed"]
    return r


def _find_largest(
    run: Any, start: int = 250, low: int = 25, high: int = 4000, resolution: float = 1.1
) -> tuple[int | None, list[dict[str, Any]]]:
    """The largest N for which ``run(N)["ok"]``: doubling (or halving) from ``start``
    to a bracket, then bisecting it to within ``resolution`` (one run a probe: a probe
    near the boundary can go either way on a noisy machine, so the answer is +-1 step).
    (None if not even ``low`` passes.)"""
    probes: list[dict[str, Any]] = []

    def ok(n: int) -> bool:
        probes.append(run(n))
        return bool(probes[-1]["ok"])

    good: int | None = None
    bad: int | None = None
    n = start
    while good is None or bad is None:
        if ok(n):
            good = n
            if n >= high:
                return good, probes
            n = min(high, n * 2) if bad is None else n
        else:
            bad = n
            if n <= low:
                return None, probes
            n = max(low, n // 2) if good is None else n
        if good is not None and bad is not None:
            break
    while bad / good > resolution:
        middle = (good + bad) // 2
        if middle in (good, bad):
            break
        if ok(middle):
            good = middle
        else:
            bad = middle
    return good, probes


def main() -> None:
    p = parser(__doc__.split("\n\n")[0], repeats=1)
    p.add_argument("--wire", choices=(*WIRES, "both"), default="both")
    p.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated subset")
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--requests", type=int, default=5)
    p.add_argument("--chunks", type=int, default=50)
    p.add_argument("--paced", action="store_true", help="the realistic-rate mode")
    p.add_argument("--agents", default="250,500,1000", help="paced mode: agent counts")
    p.add_argument("--tps", type=float, default=50.0, help="paced mode: tokens/s per agent")
    p.add_argument("--ttft", type=float, default=0.5, help="paced mode: time to first token")
    p.add_argument("--turns", type=int, default=2, help="paced mode: turns per agent")
    p.add_argument("--ramp", type=float, default=1.0,
                   help="paced mode: seconds over which the agents' first requests are "
                        "spread (0: all at once, every stream in step)")
    p.add_argument("--budget-ms", type=float, default=50.0)
    p.add_argument("--find", action="store_true",
                   help="paced mode: search for each client's largest N with p99 under "
                        "--budget-ms (doubling, then bisecting to within 10%%)")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        kind, *rest = args.child
        if kind in ("paced-corral", "paced-corral-proc"):
            port, wire, agents = int(rest[0]), rest[1], int(rest[2])
            turns, ramp = int(rest[3]), float(rest[4])
            print(json.dumps(run_paced(port, wire, agents, turns, ramp, kind == "paced-corral-proc")))
        elif kind in ("paced-aiohttp", "paced-floor"):
            port, wire, agents = int(rest[0]), rest[1], int(rest[2])
            turns, ramp = int(rest[3]), float(rest[4])
            run = run_paced_aiohttp if kind == "paced-aiohttp" else run_paced_floor
            print(json.dumps(run(port, wire, agents, turns, ramp)))
        else:
            port, wire, streams, requests = int(rest[0]), rest[1], int(rest[2]), int(rest[3])
            print(json.dumps(run_client(kind, port, wire, streams, requests)))
        return

    wires = WIRES if args.wire == "both" else (args.wire,)
    record: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}}
    if args.paced:
        paced_clients = [c for c in args.clients.split(",") if c in PACED_CLIENTS]
        if not paced_clients:
            p.error(f"--paced runs the clients {', '.join(PACED_CLIENTS)}; --clients named none")
        rows, results = [], []
        if args.find:
            found = []
            for wire in wires:
                for client in paced_clients:
                    largest, probes = _find_largest(
                        lambda n, w=wire, c=client: _paced_case(args, w, c, n)
                    )
                    results += probes
                    found.append({"wire": wire, "client": client, "largest": largest})
                    rows.append([wire, client, largest or "-",
                                 ", ".join(f"{r['agents']}{'+' if r['ok'] else '-'}"
                                           for r in probes)])
            print_table(["wire", "client", f"largest N with p99 < {args.budget_ms:g} ms",
                         "probes (+ met, - not)"], rows)
            record["largest"] = found
        for wire in wires if not args.find else ():
            for agents in [int(n) for n in args.agents.split(",")]:
                for client in paced_clients:
                    r = _paced_case(args, wire, client, agents)
                    results.append(r)
                    rows.append([wire, agents, client, r["chunks"], r["p50_ms"], r["p99_ms"],
                                 r["max_ms"], r["cpu_s"] / r["wall_s"],
                                 r["server_cpu_s"] / r["wall_s"], "yes" if r["ok"] else "no"])
        if not args.find:
            print_table(["wire", "agents", "client", "chunks", "p50 ms", "p99 ms", "max ms",
                         "cores", "server cores", f"p99 < {args.budget_ms:g} ms"], rows)
        record["paced"] = results
    else:
        clients = [c for c in args.clients.split(",") if c]
        rows, results = [], []
        for wire in wires:
            per: dict[str, dict[str, Any]] = {}
            for client in clients:
                runs = []
                for _ in range(args.repeats):
                    with sse_server(args.chunks) as port:
                        runs.append(_child([client, str(port), wire, str(args.streams),
                                            str(args.requests)]))
                expected = args.streams * args.requests * args.chunks
                for r in runs:
                    if r["chunks"] != expected:
                        raise RuntimeError(f"{client}/{wire}: {r['chunks']} chunks, expected {expected}")
                cpu_us = median([r["cpu_s"] / r["chunks"] * 1e6 for r in runs])
                rate = median([r["chunks"] / r["wall_s"] for r in runs])
                per[client] = {"client": client, "wire": wire, "cpu_us_per_chunk": cpu_us,
                               "chunks_per_s": rate, "runs": runs}
            for client, r in per.items():
                vs_aio = r["cpu_us_per_chunk"] / per["aiohttp"]["cpu_us_per_chunk"] if "aiohttp" in per else None
                vs_sdk = per["sdk"]["cpu_us_per_chunk"] / r["cpu_us_per_chunk"] if "sdk" in per else None
                r["x_aiohttp_cpu"], r["sdk_cpu_over_this"] = vs_aio, vs_sdk
                rows.append([wire, client, r["cpu_us_per_chunk"], r["chunks_per_s"],
                             "-" if vs_aio is None else f"{vs_aio:.2f}x",
                             "-" if vs_sdk is None else f"{vs_sdk:.1f}x"])
                results.append(r)
        print_table(["wire", "client", "CPU us/chunk", "chunks/s", "CPU vs aiohttp",
                     "sdk CPU / this"], rows)
        record["clients"] = results
    if args.json:
        write_json(args.json, "bench_streaming", record)


if __name__ == "__main__":
    main()
