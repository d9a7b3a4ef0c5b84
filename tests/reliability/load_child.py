"""The child process of ``test_crash_under_load``: a real load until it is killed.

Usage::

    python load_child.py load STORE --agents 50 --seed 7 [--fail-rate 0.1] [--map-size BYTES]
    python load_child.py sends STORE --agents 300
    python load_child.py import STORE JSONL --copies 8

``load`` opens a runtime on ``STORE`` (write-ahead durability, a fast retry policy), resumes
agents ``a00``.. that already have a session (repairing any turn a kill left open) and
spawns the others, then keeps every agent busy: each turn the scripted model calls the
``lookup`` tool, then answers; a fraction of requests fail with ``SERVER`` and are
retried by the policy; each ``agent/settled`` sends the agent its next followup.

Everything it prints is one line, written under a lock to line-buffered stdout, so a
kill can only tear the last line (which acknowledges nothing):

``loaded <id> <last seq>``
    per agent, after resume/spawn (``-1``: an empty session);
``ready``
    once every agent got its first followup;
``ack <n> <resizes> <id>:<seq>:<time>:<type> ... [sent=<id>/<message id>,...]``
    after ``rt.flush()`` returned: for each agent, its last seq *read before the flush
    was called* (so the flush acknowledged it), with that event's time and type;
    ``resizes`` is how often the writer grew the map so far; ``sent=`` lists the
    followups whose send returned since the previous flush was called and before this
    one was (the flush acknowledged them too: each must be in its agent's log);
``settled <id> <turn> <reason kind>``
    from every ``agent/settled`` (emitted only once its ``turn/end`` is durable).

With ``--on-full`` (a store on a small filesystem, see ``test_disk_full``), a flush that
finds the disk full prints ``full <n>`` instead of ending the run; a turn that ends
without settling (its write-ahead flush found the disk full: an ``agent/error``) sends
the agent its next followup too, and a send the full disk refuses (``DiskFullError``)
is sent again after the next acknowledged flush, so the load goes on.

``sends`` spawns ``--agents`` agents, sends each two followups (the second waits behind
the first one's turn), calls ``rt.flush()``, prints ``flushed <id>/<message id> ...``
(the second followups) and SIGKILLs itself: each of them must be in its agent's log.

``held-calls`` runs one agent (``payer``, durability ``--durability``) whose model calls the
``pay`` tool three times (``k`` 0, 1, 2). The log writer commits the reply (a
``session/event`` listener flushes the store as it is appended) and then never commits
a batch holding a ``tool/call``: it prints ``held`` and stops there, as a writer the kill
finds behind the turn. A ``pay`` body prints ``ran <k>`` and then waits for good. Under
write-ahead no body may run (the turn waits for its ``tool/call`` facts to be durable);
under ``turn`` or ``none`` all three run while their ``tool/call`` facts are not durable.

``import`` opens the store with :class:`~storage.Store` and imports the export
``JSONL`` again and again as sessions ``imp<run>-<i>``: it prints ``importing <id>``
before ``store.import_jsonl`` and ``imported <id>`` once the flush after it returned.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runtime import DiskFullError, LlmFailure, RetryPolicy, Runtime, ScriptedModel, ToolCall, tool
from runtime.scripted import ScriptItem
from storage.events import ToolMessage
from storage.lmdb.store import Store
from storage.lmdb.writer import LogWriter

FAST_RETRY = RetryPolicy(max_retries=8, base_s=0.001, cap_s=0.004)
SERVER = LlmFailure(message="scripted server failure", code="SERVER", status=503)


@tool(concurrency_safe=True)
def lookup(key: str) -> str:
    """Look a key up (instantly)."""
    return f"value-of-{key}"


def load_model(seed: int, fail_rate: float, latency: bool = True) -> ScriptedModel:
    """Call ``lookup`` for a user message, answer after a tool result; fail sometimes."""
    rng = random.Random(seed)

    def reply(request: Any) -> ScriptItem:  # ScriptedModel serialises calls under a lock
        last = request.messages[-1] if request.messages else None
        if rng.random() < fail_rate:
            return SERVER
        if isinstance(last, ToolMessage):
            return f"done after {len(request.messages)} messages"
        return [ToolCall(name="lookup", arguments={"key": f"k{rng.randrange(1000)}"})]

    delay = ScriptedModel.jittered(0.002, 0.0015, seed=seed) if latency else 0.0
    return ScriptedModel(reply, latency=delay, chunks=2)


class Out:
    """Whole lines to stdout, one writer at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            sys.stdout.write(text + "\n")


def run_load(opts: argparse.Namespace, out: Out) -> None:
    extra: dict[str, Any] = {}
    if opts.map_size is not None:
        extra["map_size"] = opts.map_size
    rt = Runtime.open(opts.store, retry_policy=FAST_RETRY, **extra)
    model = load_model(opts.seed, opts.fail_rate)
    agents = []
    for index in range(opts.agents):
        agent_id = f"a{index:02d}"
        if rt.store.has_session(agent_id):
            agent = rt.resume(agent_id, model=model, tools=[lookup])
        else:
            agent = rt.spawn(model=model, tools=[lookup], session_id=agent_id)
        out.line(f"loaded {agent_id} {agent.session.last_seq}")
        agents.append(agent)
    counter = [0]
    sent: list[str] = []  # "<agent id>/<message id>" of each followup, once it returned
    sent_lock = threading.Lock()

    starved: dict[str, Any] = {}  # agents whose send the full disk refused (--on-full)

    def send(agent: Any, text: str) -> None:
        try:
            message_id = agent.followup(text)
        except DiskFullError:
            if not opts.on_full:
                raise
            with sent_lock:
                starved[agent.id] = agent  # sent again after the next acknowledged flush
            return
        with sent_lock:
            sent.append(f"{agent.id}/{message_id}")

    def settled(event: Any) -> None:
        out.line(f"settled {event.agent.id} {event.turn} {event.reason.kind}")
        counter[0] += 1
        send(event.agent, f"work {counter[0]}")

    rt.on("agent/settled", settled)
    if opts.on_full:

        def not_durable(event: Any) -> None:
            if "could not be made durable" in event.error.message:
                send(event.agent, "after a full disk")

        rt.on("agent/error", not_durable)
    for agent in agents:
        send(agent, "start")
    out.line("ready")
    rounds = 0
    told = 0  # how many of ``sent`` an earlier ack covered
    fulls = 0
    while True:
        with sent_lock:
            covered = len(sent)  # returned before this flush is called
        marks = []
        for agent in agents:
            session = agent.session
            seq = session.last_seq
            if seq >= 0:
                event = session.events(seq, seq)[0]
                marks.append(f"{agent.id}:{seq}:{event.time}:{event.type}")
        try:
            rt.flush()
        except DiskFullError:
            if not opts.on_full:
                raise
            fulls += 1
            out.line(f"full {fulls}")
            time.sleep(0.02)  # the child's pace while full, not a synchronisation
            continue
        rounds += 1
        resizes = rt.store.statistics().resizes
        with sent_lock:
            sends = ",".join(sent[told:covered])
        told = covered
        out.line(f"ack {rounds} {resizes} " + " ".join(marks) + (f" sent={sends}" if sends else ""))
        with sent_lock:
            again = list(starved.values())
            starved.clear()
        for agent in again:
            send(agent, "after a full disk")


def run_sends(opts: argparse.Namespace, out: Out) -> None:
    rt = Runtime.open(opts.store)
    agents = [rt.spawn(model=ScriptedModel.echo()) for _ in range(opts.agents)]
    rt.flush()
    for agent in agents:
        agent.followup("first")
    second = [f"{agent.id}/{agent.followup('second')}" for agent in agents]
    rt.flush()
    out.line("flushed " + " ".join(second))
    os.kill(os.getpid(), signal.SIGKILL)


def run_held_calls(opts: argparse.Namespace, out: Out) -> None:
    route = LogWriter._route
    forever = threading.Event()

    def holding(writer: LogWriter, runs: Any) -> Any:
        if any(p.startswith(b'{"type":"tool/call"') for _, _, records in runs for p in records):
            out.line("held")
            forever.wait()
        return route(writer, runs)

    LogWriter._route = holding  # type: ignore[method-assign,assignment]

    @tool(concurrency_safe=True)
    def pay(k: int) -> str:
        """Pay (a side effect that must not happen twice)."""
        out.line(f"ran {k}")
        forever.wait()
        return "paid"

    rt = Runtime.open(opts.store, durability=opts.durability)
    script: list[ScriptItem] = [[ToolCall(name="pay", arguments={"k": k}) for k in range(3)]]
    agent = rt.spawn(model=ScriptedModel(script), tools=[pay], session_id="payer")

    def reply_durable(event: Any) -> None:
        if event.event.type == "assistant/message":
            rt.store.flush()  # the reply is durable before its tool/call facts are appended

    agent.on("session/event", reply_durable)
    agent.followup("pay three times")
    out.line("sent")
    forever.wait()


def run_imports(opts: argparse.Namespace, out: Out) -> None:
    store = Store.open(opts.store)
    out.line("ready")
    for index in range(opts.copies):
        session_id = f"imp{opts.run}-{index}"
        out.line(f"importing {session_id}")
        with Path(opts.jsonl).open("rb") as inp:
            store.import_jsonl(inp, session_id=session_id)
        store.flush()
        out.line(f"imported {session_id}")
    store.close()
    out.line("done")


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    load = modes.add_parser("load")
    load.add_argument("store")
    load.add_argument("--agents", type=int, default=50)
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--fail-rate", type=float, default=0.1)
    load.add_argument("--map-size", type=int, default=None)
    load.add_argument("--on-full", action="store_true")
    sends = modes.add_parser("sends")
    sends.add_argument("store")
    sends.add_argument("--agents", type=int, default=300)
    held = modes.add_parser("held-calls")
    held.add_argument("store")
    held.add_argument("--durability", default="write-ahead")
    imports = modes.add_parser("import")
    imports.add_argument("store")
    imports.add_argument("jsonl")
    imports.add_argument("--copies", type=int, default=8)
    imports.add_argument("--run", type=int, default=0)
    opts = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    out = Out()
    if opts.mode == "load":
        run_load(opts, out)
    elif opts.mode == "sends":
        run_sends(opts, out)
    elif opts.mode == "held-calls":
        run_held_calls(opts, out)
    else:
        run_imports(opts, out)


if __name__ == "__main__":
    main()
