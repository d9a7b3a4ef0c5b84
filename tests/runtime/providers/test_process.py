"""ProcessModel: a real provider run in a real child process, against the loopback server.

Where it can, a test compares the model in a child with the same model in this process,
against the same scripted reply: the chunks, the failures, the request the server saw
and an agent's log must not tell them apart. Every child start costs a few hundred ms (its
imports), so a test shares its model across its checks where that reads naturally.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from actors import ModelError, ModelRequest
from actors.model import batches_pushed, checked_chunk, chunks_of
from runtime import Runtime
from runtime.load import LoadSpec
from runtime.load.driver import LoadDriver
from runtime.providers import (
    AnthropicModel,
    MissingCredentialsError,
    OpenAICompatModel,
    ProcessModel,
    Secret,
    UnknownModelError,
    process,
    process_child,
    resolve_model,
)
from storage.events import LlmFailure, StreamChunk, TextDelta

from .support import ANTHROPIC_KEY, KEY, request, run, user
from .wire_formats import anthropic_frames, anthropic_reply, openai_chunk, openai_frames
from .wire_server import JsonReply, Sse, WireServer

# Larger than the 64 KiB a frame reader starts with, both ways: a request's message (to
# the child) and a reply's text piece (from it) each take a frame that must grow it.
BIG = "".join(f"{n:05d} " for n in range(20_000))
CANCEL_BOUND_S = 5.0  # a cancel the child did not honour would take ProcessModel's 10 s


def openai_reply() -> list[bytes]:
    call = {"index": 0, "id": "call_1", "type": "function"}
    chunks = [
        openai_chunk({"role": "assistant", "content": ""}),
        openai_chunk({"reasoning_content": "let me think"}),
        openai_chunk({"content": "Hello"}),
        openai_chunk({"content": BIG}),
        openai_chunk({"content": " there"}),
        openai_chunk({"tool_calls": [{**call, "function": {"name": "add", "arguments": ""}}]}),
        openai_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 2,'}}]}),
        openai_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "b": 3}'}}]}),
        openai_chunk({}, finish="tool_calls"),
        openai_chunk(usage={"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}),
    ]
    return openai_frames(chunks)


def anthropic_reply_frames() -> list[bytes]:
    blocks: list[dict[str, Any]] = [
        {"thinking": ["let me ", "think"], "signature": "sig_1"},
        {"text": ["Hello", BIG, " there"]},
        {"tool": ("toolu_1", "add", ['{"a": 2,', ' "b": 3}'])},
    ]
    return anthropic_frames(anthropic_reply(blocks, stop_reason="tool_use", cache_read=3))


@dataclass(frozen=True)
class Vendor:
    """A provider class and how to build it against the wire server, here or in a child."""

    factory: type[OpenAICompatModel | AnthropicModel]
    model: str
    path: str  # the base URL's path on the wire server
    key: str
    reply: Callable[[], list[bytes]]

    def options(self, url: str) -> dict[str, Any]:
        return {"base_url": url + self.path, "api_key": self.key}

    def here(self, url: str) -> OpenAICompatModel | AnthropicModel:
        return self.factory(self.model, **self.options(url))

    def there(self, url: str) -> ProcessModel:
        return ProcessModel(self.factory, self.model, **self.options(url))


OPENAI = Vendor(OpenAICompatModel, "m", "/v1", KEY, openai_reply)
ANTHROPIC = Vendor(AnthropicModel, "claude-sonnet-4-6", "", ANTHROPIC_KEY, anthropic_reply_frames)
VENDORS = [pytest.param(OPENAI, id="openai"), pytest.param(ANTHROPIC, id="anthropic")]


class CancelMarked:
    """A real provider that leaves the file ``marker`` once it ended a cancelled request
    (its connection closed): the child's side of a cancel, seen from the test."""

    def __init__(self, marker: str, vendor: Vendor, url: str) -> None:
        self._marker = Path(marker)
        self._inner = vendor.here(url)

    @property
    def provider(self) -> str:
        return self._inner.provider

    @property
    def name(self) -> str:
        return self._inner.name

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._inner.stream(request)

    async def stream_into(
        self, request: ModelRequest, push: Callable[[list[StreamChunk]], None]
    ) -> None:
        try:
            await self._inner.stream_into(request, push)
        except asyncio.CancelledError:
            self._marker.touch()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


def big_request() -> ModelRequest:
    return request(user("hi"), user(BIG, "m2"), system="be brief")


def gone(pid: int) -> bool:
    """Whether no process ``pid`` exists (a child is reaped once its exit was awaited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def pushed(
    model: ProcessModel, req: ModelRequest, batches: list[list[StreamChunk]] | None = None
) -> list[StreamChunk]:
    """The chunks ``stream_into`` pushes for ``req`` (each push also kept in ``batches``)."""
    seen: list[list[StreamChunk]] = [] if batches is None else batches
    await model.stream_into(req, seen.append)
    return [chunk for batch in seen for chunk in batch]


async def in_process(vendor: Vendor, url: str, *requests: ModelRequest) -> list[Any]:
    """The chunks (or the failure) of each of ``requests`` with the model in this process."""
    outcomes: list[Any] = []
    async with vendor.here(url) as model:
        for req in requests:
            try:
                outcomes.append([chunk async for chunk in model.stream(req)])
            except ModelError as err:
                outcomes.append(err.failure)
    return outcomes


# --------------------------------------------------------------------------- replies


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_streamed_reply_is_the_same_chunks_in_a_child_as_in_process(
    wire: WireServer, vendor: Vendor
) -> None:
    wire.default = Sse(vendor.reply())

    async def body() -> tuple[list[Any], list[list[StreamChunk]], list[StreamChunk], int]:
        (here,) = await in_process(vendor, wire.url, big_request())
        model = vendor.there(wire.url)
        try:
            batches: list[list[StreamChunk]] = []
            via_push = await pushed(model, big_request(), batches)
            via_stream = [chunk async for chunk in model.stream(big_request())]
            (pid,) = model.pids
        finally:
            await model.aclose()
        assert via_push == here
        return here, batches, via_stream, pid

    here, batches, via_stream, pid = run(body)
    assert via_stream == here
    assert BIG in [c.text for c in here if isinstance(c, TextDelta)]  # the big piece came
    assert all(batches), f"an empty push among {batches}"
    assert pid != os.getpid()
    bodies = [r.body for r in wire.requests]
    assert len(bodies) == 3
    assert bodies[1] == bodies[2] == bodies[0]  # the child sent what this process sends


@pytest.mark.parametrize("vendor", VENDORS)
def test_an_http_failure_is_the_same_model_error_in_a_child_as_in_process(
    wire: WireServer, vendor: Vendor
) -> None:
    limited = JsonReply(
        429,
        {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        {"retry-after": "7", "x-request-id": "req_1", "request-id": "req_1"},
    )
    broken = JsonReply(500, {"type": "error", "error": {"type": "api_error", "message": "oops"}})
    wire.script(broken, limited, broken, limited)  # (a 429 last: its retry-after would hold
    # back the model's next request for 7 s)

    async def body() -> tuple[list[Any], list[Any]]:
        here = await in_process(vendor, wire.url, request(), request())
        model = vendor.there(wire.url)
        there: list[Any] = []
        try:
            for _ in range(2):
                with pytest.raises(ModelError) as failed:
                    await model.stream_into(request(), there.append)
                there.append(failed.value.failure)
        finally:
            await model.aclose()
        return here, there

    here, there = run(body)
    assert [type(f) for f in here] == [LlmFailure, LlmFailure]
    assert [(f.code, f.status, f.retry_after_s) for f in here] == [
        ("SERVER", 500, None),
        ("RATE_LIMIT", 429, 7.0),
    ]
    assert there == here  # code, status, retry_after_s, message and request id alike


# --------------------------------------------------------------------------- cancel, death


@pytest.mark.parametrize("vendor", VENDORS)
def test_cancelling_a_request_in_a_child_returns_once_the_child_closed_its_connection(
    tmp_path: Path, wire: WireServer, vendor: Vendor
) -> None:
    wire.script(Sse(vendor.reply()[:4], then="stall"), Sse(vendor.reply()))
    marker = tmp_path / "cancelled"

    async def body() -> dict[str, Any]:
        model = ProcessModel(CancelMarked, str(marker), vendor, wire.url)
        try:
            first = asyncio.Event()
            received: list[StreamChunk] = []

            def push(chunks: list[StreamChunk]) -> None:
                received.extend(chunks)
                first.set()

            task = asyncio.create_task(model.stream_into(request(), push))
            await asyncio.wait_for(first.wait(), 10)
            loop = asyncio.get_running_loop()
            began = loop.time()
            task.cancel()
            await asyncio.wait([task], timeout=CANCEL_BOUND_S)
            took = loop.time() - began
            ended = task.done() and task.cancelled()
            marked = marker.exists()
            seen = await asyncio.to_thread(wire.requests[0].disconnected.wait, 10)
            pid = model.pids
            after = await pushed(model, request())  # the child goes on with the next one
            return {
                "ended": ended,
                "marked": marked,
                "took": took,
                "seen": seen,
                "received": received,
                "after": after,
                "pids": (pid, model.pids),
            }
        finally:
            await model.aclose()

    outcome = run(body)
    assert outcome["ended"], f"the cancel did not end the task within {CANCEL_BOUND_S} s"
    assert outcome["took"] < CANCEL_BOUND_S
    assert outcome["marked"], "the cancel returned before the child ended the request"
    assert outcome["seen"], "the server did not see the connection close"
    assert outcome["received"], "no chunk arrived before the cancel"
    assert [type(c).__name__ for c in outcome["after"]][-1] == "FinishChunk"
    before, after = outcome["pids"]
    assert len(before) == 1
    assert after == before  # the same child


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_child_killed_mid_stream_fails_the_request_and_the_next_request_starts_another(
    wire: WireServer, vendor: Vendor, caplog: pytest.LogCaptureFixture
) -> None:
    wire.script(Sse(vendor.reply()), Sse(vendor.reply()[:4], then="stall"), Sse(vendor.reply()))

    async def body() -> dict[str, Any]:
        (expected,) = await in_process(vendor, wire.url, request())
        model = vendor.there(wire.url)
        try:
            first = asyncio.Event()
            task = asyncio.create_task(model.stream_into(request(), lambda _: first.set()))
            await asyncio.wait_for(first.wait(), 10)
            (killed,) = model.pids
            os.kill(killed, signal.SIGKILL)
            with pytest.raises(ModelError) as failed:
                await asyncio.wait_for(task, 10)
            dead = gone(killed)  # reaped before the request failed
            seen = await asyncio.to_thread(wire.requests[1].disconnected.wait, 10)
            after = await pushed(model, request())
            return {
                "failure": failed.value.failure,
                "dead": dead,
                "seen": seen,
                "pids": (killed, model.pids),
                "after": after,
                "expected": expected,
            }
        finally:
            await model.aclose()

    outcome = run(body)
    failure = outcome["failure"]
    assert failure.code == "TRANSPORT"
    assert "ended while the request streamed" in failure.message
    assert f"exit code {-signal.SIGKILL}" in failure.message
    # (a kill of the dead child reaped it under asyncio's child watcher: "Unknown child")
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert outcome["dead"], "the killed child was not reaped"
    assert outcome["seen"], "the server did not see the killed child's connection close"
    killed, now = outcome["pids"]
    assert len(now) == 1
    assert now[0] != killed  # a new child
    assert outcome["after"] == outcome["expected"]


def test_aclose_ends_the_child_and_a_request_after_it_starts_a_new_one(wire: WireServer) -> None:
    wire.default = Sse(OPENAI.reply())

    async def body() -> dict[str, Any]:
        model = OPENAI.there(wire.url)
        try:
            await model.start()
            (first,) = model.pids
            alive = not gone(first)
            await model.aclose()
            outcome: dict[str, Any] = {"alive": alive, "first": first}
            outcome["gone"] = gone(first)  # aclose awaited its exit
            outcome["pids_closed"] = model.pids
            await model.aclose()  # idempotent
            outcome["chunks"] = await pushed(model, request())
            outcome["pids_after"] = model.pids
        finally:
            await model.aclose()
        outcome["second_gone"] = [gone(pid) for pid in outcome["pids_after"]]
        return outcome

    outcome = run(body)
    assert outcome["alive"]
    assert outcome["gone"], f"child {outcome['first']} still runs after aclose"
    assert outcome["pids_closed"] == []
    assert [type(c).__name__ for c in outcome["chunks"]][-2:] == ["UsageChunk", "FinishChunk"]
    assert len(outcome["pids_after"]) == 1
    assert outcome["pids_after"] != [outcome["first"]]
    assert outcome["second_gone"] == [True]


def test_aclose_fails_a_request_still_streaming_with_transport(wire: WireServer) -> None:
    wire.script(Sse(OPENAI.reply()[:4], then="stall"))

    async def body() -> tuple[LlmFailure, bool]:
        model = OPENAI.there(wire.url)
        try:
            first = asyncio.Event()
            task = asyncio.create_task(model.stream_into(request(), lambda _: first.set()))
            await asyncio.wait_for(first.wait(), 10)
        finally:
            await model.aclose()
        with pytest.raises(ModelError) as failed:
            await asyncio.wait_for(task, 10)
        seen = await asyncio.to_thread(wire.requests[0].disconnected.wait, 10)
        return failed.value.failure, seen

    failure, seen = run(body)
    assert failure.code == "TRANSPORT"
    assert "closed" in failure.message
    assert seen, "the server did not see the connection close"


# --------------------------------------------------------------------------- construction


def only_in(pid: int, url: str) -> OpenAICompatModel:
    """A model built in process ``pid`` only (the test's): the child cannot build it."""
    if os.getpid() != pid:
        raise RuntimeError(f"no model outside process {pid}")
    return OpenAICompatModel("m", base_url=url + "/v1", api_key=KEY)


def test_what_cannot_be_sent_to_the_child_or_built_raises_at_construction(
    wire: WireServer,
) -> None:
    url = wire.url + "/v1"
    with pytest.raises(TypeError, match="must pickle"):
        ProcessModel(lambda: OpenAICompatModel("m", base_url=url, api_key=KEY))
    with pytest.raises(TypeError, match="must pickle") as secret:
        ProcessModel(OpenAICompatModel, "m", base_url=url, api_key=Secret(KEY))
    assert KEY not in str(secret.value)
    with pytest.raises(TypeError, match="bogus"):
        ProcessModel(OpenAICompatModel, "m", base_url=url, api_key=KEY, bogus=1)
    with pytest.raises(MissingCredentialsError):
        ProcessModel(AnthropicModel, "claude-sonnet-4-6", base_url=wire.url)  # no key at all
    with pytest.raises(TypeError, match="process:openai:m"):
        ProcessModel("openai:m")  # type: ignore[arg-type]  # a string is not a factory: the error says what to write
    with pytest.raises(UnknownModelError):
        ProcessModel(resolve_model, "nope:m")
    model = ProcessModel(resolve_model, f"openai:m@{url}", api_key=KEY)  # resolved here too
    assert (model.provider, model.name, model.pids) == ("openai", "m", [])
    for linger in (-0.001, float("nan"), float("inf"), "4ms", True):
        with pytest.raises(ValueError, match="linger must be a number of seconds"):
            ProcessModel(OpenAICompatModel, "m", base_url=url, api_key=KEY, linger=linger)
    assert wire.requests == []


@pytest.mark.parametrize("linger", [0, 0.05])
def test_the_childs_linger_is_not_the_factorys_and_either_way_the_reply_is_the_same(
    wire: WireServer, linger: float
) -> None:
    # ``linger`` is ProcessModel's (the factory would refuse it: an unknown keyword);
    # without it the child's loop is asyncio's own, with it the lingering one.
    wire.default = Sse(openai_reply())
    model = ProcessModel(OpenAICompatModel, "m", linger=linger, **OPENAI.options(wire.url))
    assert model.linger == linger

    async def body() -> tuple[list[Any], list[StreamChunk]]:
        here = await in_process(OPENAI, wire.url, big_request())
        try:
            return here, await pushed(model, big_request())
        finally:
            await model.aclose()

    here, there = run(body)
    assert there == here[0]


def test_the_lingering_selector_waits_out_the_rest_of_its_linger_after_a_busy_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fake clock: select() first sleeps what is left of the linger since the last
    # select ended (less if the loop's timeout is nearer; not at all for a timeout of 0,
    # when callbacks are ready), then selects with what is left of the timeout.
    now = [100.0]
    slept: list[float] = []
    timeouts: list[float | None] = []

    def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        now[0] += seconds

    monkeypatch.setattr(process_child.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(process_child.time, "sleep", sleep)
    monkeypatch.setattr(
        process_child.selectors.DefaultSelector,
        "select",
        lambda self, timeout=None: timeouts.append(timeout) or [],
    )
    selector = process_child._Lingering(0.004)
    try:
        selector.select(None)  # the first: nothing to wait out
        now[0] += 0.001  # a pass of 1 ms
        selector.select(None)  # 3 ms left of the linger
        now[0] += 0.001
        selector.select(0.002)  # the loop's timer is nearer than the linger's end: 2 ms
        now[0] += 0.001
        selector.select(0)  # callbacks are ready: no wait
        now[0] += 0.010  # a quiet spell longer than the linger
        selector.select(None)
    finally:
        selector.close()
    assert slept == [0.003, 0.002]
    assert timeouts == [None, None, 0.0, 0, None]


def test_a_child_that_cannot_build_its_model_fails_start_and_every_request(
    wire: WireServer,
) -> None:
    model = ProcessModel(only_in, os.getpid(), wire.url)  # built here: fine

    async def body() -> tuple[list[LlmFailure], list[list[StreamChunk]]]:
        failures: list[LlmFailure] = []
        batches: list[list[StreamChunk]] = []
        try:
            with pytest.raises(ModelError) as started:
                await model.start()
            failures.append(started.value.failure)
            for _ in range(2):
                with pytest.raises(ModelError) as failed:
                    await model.stream_into(request(), batches.append)
                failures.append(failed.value.failure)
        finally:
            await model.aclose()
        return failures, batches

    failures, batches = run(body)
    assert len(failures) == 3
    for failure in failures:
        assert "could not build" in failure.message, failure
        assert f"no model outside process {os.getpid()}" in failure.message, failure
    assert batches == []
    assert wire.requests == []


# --------------------------------------------------------------------------- agents, loops


def agent_turn(store: Path, model: Any) -> tuple[list[tuple[str, Any]], list[int]]:
    """One agent turn on a runtime of its own: its log (each event's type, and a chunk's
    or a message's content), and the model's children during the turn."""
    rt = Runtime.open(store, durability="write-ahead")
    try:
        settled = threading.Event()
        rt.on("agent/settled", lambda _event: settled.set())
        agent = rt.spawn(model=model)
        agent.followup("hi")
        assert settled.wait(20), "the turn did not settle"
        pids = list(model.pids) if isinstance(model, ProcessModel) else []
        log: list[tuple[str, Any]] = []
        for event in agent.session.events():
            if event.type == "assistant/chunk":
                log.append((event.type, event.data.chunk))
            elif event.type == "assistant/message":
                log.append((event.type, event.data.message))
            elif event.type == "turn/end":
                log.append((event.type, event.data.reason.kind))
            else:
                log.append((event.type, None))
    finally:
        if isinstance(model, ProcessModel):
            asyncio.run_coroutine_threadsafe(model.aclose(), rt.io.loop).result(30)
        rt.close()
    return log, pids


def test_an_agent_turn_logs_the_same_events_with_the_model_in_a_child(
    tmp_path: Path, wire: WireServer
) -> None:
    pieces = ["Hel", "lo", " there", "!"]
    chunks = [openai_chunk({"role": "assistant", "content": ""})]
    chunks += [openai_chunk({"content": p}) for p in pieces]
    chunks.append(openai_chunk({}, finish="stop"))
    chunks.append(openai_chunk(usage={"prompt_tokens": 5, "completion_tokens": 4}))
    wire.default = Sse(openai_frames(chunks))
    here, _ = agent_turn(tmp_path / "here", OPENAI.here(wire.url))
    model = OPENAI.there(wire.url)
    there, pids = agent_turn(tmp_path / "there", model)
    texts = [c.text for kind, c in here if kind == "assistant/chunk" and isinstance(c, TextDelta)]
    assert texts == pieces
    assert ("turn/end", "completed") in here
    assert there == here
    assert len(pids) == 1
    assert pids[0] != os.getpid()
    assert gone(pids[0])
    assert wire.requests[0].body == wire.requests[1].body


def test_two_event_loops_sharing_one_model_have_a_child_each(wire: WireServer) -> None:
    wire.default = Sse(OPENAI.reply())
    (expected,) = run(lambda: in_process(OPENAI, wire.url, request()))
    model = OPENAI.there(wire.url)
    both = threading.Barrier(2, timeout=20)

    async def on_its_loop() -> tuple[list[StreamChunk], list[int]]:
        try:
            chunks = await pushed(model, request())
            await asyncio.to_thread(both.wait)  # both children are up
            pids = model.pids
            await asyncio.to_thread(both.wait)  # both looked before either closes
        finally:
            await model.aclose()
        return chunks, pids

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run, on_its_loop) for _ in range(2)]
        (chunks_a, pids_a), (chunks_b, pids_b) = [f.result(30) for f in futures]
    assert chunks_a == chunks_b == expected
    assert len(set(pids_a)) == 2
    assert sorted(pids_a) == sorted(pids_b)
    assert all(gone(pid) for pid in pids_a)
    assert model.pids == []
    assert len({r.peer for r in wire.requests[1:]}) == 2  # a connection of each child's own


def test_a_process_model_string_is_one_child_for_every_agent_spawned_with_it(
    tmp_path: Path, wire: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the child inherits the environment
    pieces = ["Hel", "lo"]
    chunks = [openai_chunk({"content": p}) for p in pieces]
    chunks += [openai_chunk({}, finish="stop"), openai_chunk(usage={"prompt_tokens": 1})]
    wire.default = Sse(openai_frames(chunks))
    spec = f"process:openai:m@{wire.url}/v1"
    model = resolve_model(spec)
    assert isinstance(model, ProcessModel)
    assert (model.provider, model.name) == ("openai", "m")
    assert resolve_model(spec) is model  # one a string (and options) in a process
    assert resolve_model(spec, timeout=5.0) is not model
    rt = Runtime.open(tmp_path / "store", durability="write-ahead")
    try:
        settled: list[object] = []
        both = threading.Event()

        def on_settled(event: object) -> None:
            settled.append(event)
            if len(settled) == 2:
                both.set()

        rt.on("agent/settled", on_settled)
        agents = [rt.spawn(model=spec) for _ in range(2)]
        for agent in agents:
            agent.followup("hi")
        assert both.wait(20), "the two turns did not settle"
        pids = model.pids
        for agent in agents:
            texts = [
                e.data.chunk.text
                for e in agent.session.events()
                if e.type == "assistant/chunk" and isinstance(e.data.chunk, TextDelta)
            ]
            assert texts == pieces
    finally:
        asyncio.run_coroutine_threadsafe(model.aclose(), rt.io.loop).result(30)
        rt.close()
    assert len(pids) == 1  # both agents' requests went to the one child
    assert pids[0] != os.getpid()
    assert gone(pids[0])
    assert len(wire.requests) == 2


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("process:", "needs a model string after it"),
        ("process:process:openai:m", "cannot run another one"),
        ("process:nope:m", "unknown scheme 'nope'"),
    ],
)
def test_a_malformed_process_model_string_is_refused(spec: str, says: str) -> None:
    with pytest.raises(UnknownModelError, match=says):
        resolve_model(spec)


class Malformed:
    """A model that does not vouch for its chunks, and streams one that is malformed."""

    provider = "test"
    name = "malformed"

    async def stream_into(self, request: ModelRequest, push: Callable[[list[Any]], None]) -> None:
        push([TextDelta(text="fine")])
        push([TextDelta(text=5)])  # type: ignore[arg-type]  # msgspec does not check it here
        push([TextDelta(text="never")])

    def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        return chunks_of(batches_pushed(self.stream_into, request))


class MalformedStream:
    """The same reply from ``stream()`` alone (no batches, no push), which touches
    ``closed`` once its generator is closed."""

    provider = "test"
    name = "malformed"

    def __init__(self, closed: str) -> None:
        self.closed = closed

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        try:
            yield TextDelta(text="fine")
            yield TextDelta(text=5)  # type: ignore[arg-type]
            yield TextDelta(text="never")
        finally:
            Path(self.closed).touch()


@pytest.mark.parametrize("kind", ["stream_into", "stream"])
def test_a_malformed_chunk_fails_the_request_in_the_child_as_the_agent_would(
    tmp_path: Path, kind: str
) -> None:
    with pytest.raises(ModelError) as in_process:
        checked_chunk(TextDelta(text=5))  # type: ignore[arg-type]  # what the agent checks
    closed = tmp_path / "closed"
    model = (
        ProcessModel(Malformed)
        if kind == "stream_into"
        else ProcessModel(MalformedStream, str(closed))
    )
    assert model.chunks_checked  # the child checks them: what arrives is well formed

    async def body() -> tuple[list[Any], LlmFailure]:
        pushed: list[Any] = []
        try:
            with pytest.raises(ModelError) as failed:
                await model.stream_into(request(), pushed.extend)
        finally:
            await model.aclose()
        return pushed, failed.value.failure

    pushed, failure = run(body)
    assert pushed == [TextDelta(text="fine")]  # the chunks before the malformed one
    assert failure == in_process.value.failure
    if kind == "stream":
        assert closed.exists()  # the model's stream was closed, not left open in the child


def test_a_load_run_starts_a_process_models_child_before_its_load(
    tmp_path: Path, wire: WireServer
) -> None:
    chunks = [openai_chunk({"content": "hi"}), openai_chunk({}, finish="stop")]
    wire.default = Sse(openai_frames(chunks))
    model = OPENAI.there(wire.url)
    at_ready: dict[str, Any] = {}

    def ready() -> None:  # between the spawns and the load
        at_ready.update(pids=model.pids, requests=len(wire.requests))

    rt = Runtime.open(tmp_path / "store", durability="write-ahead")
    try:
        report = LoadDriver(rt, LoadSpec(agents=2, turns=1), model=model).run(ready=ready)
    finally:
        rt.close()  # closes the models its agents used: the child ends
    assert len(at_ready["pids"]) == 1  # up (and built) before the first request
    assert at_ready["requests"] == 0
    assert (report.settled, report.errored) == (2, 0)
    assert gone(at_ready["pids"][0])


def test_a_frame_reader_takes_a_frame_larger_than_its_buffer_then_gives_the_room_back() -> None:
    frames: list[bytes] = []
    reader = process._Frames(lambda view: frames.append(bytes(view)), lambda: None)
    big = os.urandom(3 << 20)
    wire = b"".join(process._framed(p) for p in (b"first", big, b"last"))
    pos = 0
    while pos < len(wire):  # as a transport reads: into what get_buffer offers
        room = reader.get_buffer(-1)
        n = min(len(room), len(wire) - pos, 100_000)
        room[:n] = wire[pos : pos + n]
        reader.buffer_updated(n)
        pos += n
    assert frames == [b"first", big, b"last"]
    assert len(reader.get_buffer(-1)) == process._BUFFER  # the 3 MiB given back
