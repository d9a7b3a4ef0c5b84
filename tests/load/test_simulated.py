"""The simulated model streams like a vendor: its time to first token, speed, reply
length and tool calls drawn from seeded distributions, chunk by chunk on the I/O side."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from actors import ModelRequest
from runtime import Runtime, tool
from runtime.load import Dist, SimulatedModel
from storage import AssistantChunk, RequestConfig, TextBlock, TextDelta, ToolSpec, UserMessage

_CONFIG = RequestConfig(provider="simulated", model="simulated")
_HELLO = UserMessage(id="m", content=(TextBlock(text="hello"),))


def test_a_distribution_is_a_mean_and_a_spread_never_below_zero() -> None:
    assert Dist.parse("0.3") == Dist(0.3, 0.0)
    assert Dist.parse("0.3~0.1") == Dist(0.3, 0.1)
    rng = random.Random(0)
    draws = [Dist(0.1, 0.5).draw(rng) for _ in range(200)]
    assert min(draws) == 0.0 and max(draws) <= 0.6 and len(set(draws)) > 100
    for bad in ("fast", "1~x", "-1", "0.3~-0.1", "nan"):
        with pytest.raises(ValueError, match="MEAN"):
            Dist.parse(bad)


def _plans(model: SimulatedModel, n: int) -> list[tuple[float, float, int]]:
    request = ModelRequest(config=_CONFIG, messages=[_HELLO])
    return [
        (d.ttft_s, d.tokens_per_s, d.reply_tokens) for d in (model.plan(request) for _ in range(n))
    ]


def test_the_same_seed_draws_the_same_requests() -> None:
    a, b = SimulatedModel(seed=5), SimulatedModel(seed=5)
    assert _plans(a, 20) == _plans(b, 20)
    assert _plans(SimulatedModel(seed=6), 20) != _plans(SimulatedModel(seed=5), 20)


def test_a_reply_streams_its_tokens_in_chunks_after_the_time_to_first_token(
    tmp_path: Path,
) -> None:
    model = SimulatedModel(
        ttft_s=Dist(0.08), tokens_per_s=Dist(200.0), reply_tokens=Dist(20.0), chunk_tokens=4
    )
    with Runtime.open(tmp_path / "store") as rt:
        agent = rt.spawn(model=model)
        done = threading.Event()
        rt.on("agent/settled", lambda _event: done.set())
        agent.followup("hello")
        assert done.wait(10)
        rt.flush()
        log = agent.session.events()
    chunks = [e for e in log if isinstance(e.data, AssistantChunk)]
    texts = [e.data.chunk.text for e in chunks if isinstance(e.data.chunk, TextDelta)]
    assert len(texts) == 5  # 20 tokens, 4 a chunk
    assert len("".join(texts).split()) == 20
    step = next(e for e in log if e.type == "step/start")
    reply = next(e for e in log if e.type == "assistant/message")
    # lower bounds only: the model waits at least this long, a busy machine may add more
    assert chunks[0].time - step.time >= 80 - 1
    assert reply.time - chunks[0].time >= (16 / 200) * 1000 - 2  # 4 chunks at 4 tokens / 200/s
    assert reply.data.usage.output_tokens == 20


def test_a_tool_call_fills_the_tools_required_arguments_with_placeholders(
    tmp_path: Path,
) -> None:
    seen: list[tuple[str, int, bool]] = []

    @tool
    def book(city: str, nights: int, late: bool = False) -> str:
        """Book a room."""
        seen.append((city, nights, late))
        return "booked"

    model = SimulatedModel(ttft_s=Dist(0.0), reply_tokens=Dist(3.0), tool_probability=1.0)
    with Runtime.open(tmp_path / "store") as rt:
        agent = rt.spawn(model=model, tools=[book])
        done = threading.Event()
        rt.on("agent/settled", lambda _event: done.set())
        agent.followup("book it")
        assert done.wait(10)
        rt.flush()
        kinds = [e.type for e in agent.session.events()]
    assert seen == [("x", 1, False)]
    assert kinds.count("step/start") == 2  # the tool step, then the answer


def test_no_tool_is_called_when_the_request_has_none_or_the_probability_is_zero() -> None:
    spec = ToolSpec(name="t", parameters={"type": "object", "properties": {}})
    with_tools = ModelRequest(config=_CONFIG, messages=[_HELLO], tools=[spec])
    never = SimulatedModel(tool_probability=0.0)
    assert all(never.plan(with_tools).tool is None for _ in range(50))
    always = SimulatedModel(tool_probability=1.0)
    bare = ModelRequest(config=_CONFIG, messages=[_HELLO])
    assert all(always.plan(bare).tool is None for _ in range(50))
    assert all(always.plan(with_tools).tool == spec for _ in range(50))
