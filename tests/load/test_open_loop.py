"""Open-loop traffic: arrivals come on their schedule at the requested rate whether or
not the stack keeps up; what cannot wait is shed and reported."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from runtime.load import LoadSpec, Traffic, arrival_times, run_bench
from storage import AgentInboxSpliced, Store


def _insertions(store: Path) -> list[int]:
    """Every message insertion's time (epoch ms) across the store's sessions."""
    with Store.open(store, readonly=True) as st:
        return sorted(
            e.time
            for h in st.sessions()
            for e in st.read(h.id)
            if isinstance(e.data, AgentInboxSpliced) and e.data.inserted
        )


def test_constant_arrivals_are_evenly_spaced_at_the_rate() -> None:
    times = arrival_times(Traffic(rate=50, duration_s=2, shape="constant"))
    assert len(times) == 100
    assert times[0] == 0 and all(math.isclose(b - a, 0.02) for a, b in zip(times, times[1:]))


def test_poisson_arrivals_average_the_rate_and_repeat_for_a_seed() -> None:
    traffic = Traffic(rate=200, duration_s=20)
    times = arrival_times(traffic, seed=1)
    expected = 4000
    assert abs(len(times) - expected) < 4 * math.sqrt(expected)  # 4 sigma
    assert times == arrival_times(traffic, seed=1) and times != arrival_times(traffic, seed=2)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) > 5 * (1 / 200) > min(gaps)  # bursty, unlike a constant rate


@pytest.mark.parametrize("text", ["0", "-3/s", "fast", "10/day", "nan"])
def test_a_rate_that_is_not_a_positive_number_per_unit_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        Traffic.parse_rate(text)


def test_a_rate_takes_units() -> None:
    assert Traffic.parse_rate("200/s") == 200
    assert Traffic.parse_rate("600/min") == 10
    assert Traffic.parse_rate("7200/h") == 2


@pytest.mark.parametrize("shape", ["constant", "poisson"])
def test_an_open_loops_arrivals_reach_the_agents_at_the_requested_rate(
    tmp_path: Path, shape: str
) -> None:
    rate, duration = 100.0, 2.0
    store = tmp_path / "store"
    traffic = Traffic(rate=rate, duration_s=duration, shape=shape)  # type: ignore[arg-type]
    report, _ = run_bench(store, LoadSpec(agents=20, latency_s=0.01), traffic=traffic)
    loop = report.open_loop
    assert loop is not None and report.mode == "open" and report.invariants_ok
    assert loop.arrivals == len(arrival_times(traffic)) and loop.shed == 0
    assert report.settled == loop.dispatched == loop.arrivals
    # What the sessions' logs saw, on their own clock: the arrivals spread over the
    # duration at the requested rate (within 15%: a busy machine delays some sends)
    seen = _insertions(store)
    assert len(seen) == loop.arrivals
    span_s = (seen[-1] - seen[0]) / 1000.0
    assert duration * 0.85 <= span_s + 1 / rate <= duration * 1.15, span_s
    measured = len(seen) / (span_s + 1 / rate)
    assert rate * 0.85 <= measured <= rate * 1.15, measured
    assert abs(loop.offered_rate - rate) <= rate * (0.15 if shape == "constant" else 0.3)


def test_arrivals_beyond_the_pool_and_its_queue_are_shed_and_counted(tmp_path: Path) -> None:
    traffic = Traffic(rate=200, duration_s=0.5, shape="constant", queue_limit=2)
    spec = LoadSpec(agents=2, latency_s=0.2)  # 2 agents serve ~10 turns/s: most are shed
    report, _ = run_bench(tmp_path / "store", spec, traffic=traffic)
    loop = report.open_loop
    assert loop is not None and loop.arrivals == 100
    assert loop.shed > 50
    assert loop.dispatched + loop.shed == loop.arrivals
    assert report.settled == loop.dispatched
    assert loop.queue_ms.max >= 150  # the queued ones waited for an agent's turn to end
    assert report.latency_ms.max >= loop.queue_ms.max  # an arrival's latency includes it
