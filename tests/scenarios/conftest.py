"""Fixtures for scenario tests: a real runtime on a real LMDB store in a temp dir.

Every log a scenario produces is checked with the invariant checker when the test ends.
With ``--clock=manual`` every runtime a scenario opens runs on one ``ManualClock`` per
test (see :class:`ScenarioClock`): a test that needs a timer to fire says so with
``scenario_clock.elapse(rt, seconds)``, which moves that clock (and is nothing on the
system clock, where time passes by itself).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import ManualClock, RetryPolicy, Runtime
from storage import assert_invariants
from storage.lmdb.store import Store

WAIT = 10.0


class Timeline:
    """Records live events and committed session facts of a runtime, in order."""

    NAMES = (
        "agent/created",
        "agent/session-start",
        "agent/disposed",
        "agent/status",
        "agent/inbox/inserted",
        "agent/inbox/claimed",
        "agent/inbox/discarded",
        "agent/settled",
        "agent/error",
        "tools/result",
        "session/event",
    )

    def __init__(self, rt: Runtime) -> None:
        self._lock = threading.Lock()
        self.entries: list[tuple[str, Any]] = []
        self._changed = threading.Condition(self._lock)
        for name in self.NAMES:
            rt.on(name, self._recorder(name))

    def _recorder(self, name: str) -> Any:
        def record(event: Any) -> None:
            label = event.event.type if name == "session/event" else name
            with self._changed:
                self.entries.append((label, event))
                self._changed.notify_all()

        return record

    def labels(self, *, agent: str | None = None) -> list[str]:
        with self._lock:
            return [n for n, e in self.entries if agent is None or e.agent.id == agent]

    def of(self, name: str) -> list[Any]:
        with self._lock:
            return [e for n, e in self.entries if n == name]

    def wait_for(self, name: str, count: int = 1, timeout: float = WAIT) -> list[Any]:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: sum(1 for n, _ in self.entries if n == name) >= count, timeout
            )
        assert ok, f"timed out waiting for {count} x {name}; saw {self.labels()}"
        return self.of(name)


class HeldActor:
    """An agent's actor held busy in a handler, so that what is sent to it meanwhile waits
    in its mailbox: a sync ``agent/inbox/inserted`` listener (it runs on the actor) that
    blocks when the message injected here arrives, until :meth:`release`."""

    def __init__(self, agent: Any, text: str = "hold") -> None:
        busy, self._go = threading.Event(), threading.Event()

        def hold(event: Any) -> None:
            if event.message.content[0].text == text:
                busy.set()
                self._go.wait(WAIT)

        agent.on("agent/inbox/inserted", hold)
        self.message_id = agent.inject(text)
        assert busy.wait(WAIT), "the actor did not reach the hold"

    def release(self) -> None:
        self._go.set()


class ScenarioClock:
    """The clock of the runtimes a scenario test opens: a :class:`ManualClock` with
    ``--clock=manual`` (``manual``), else the system clock (``manual`` is None)."""

    def __init__(self, manual: ManualClock | None) -> None:
        self.manual = manual

    def elapse(self, rt: Runtime, seconds: float, *, timers: int = 1) -> None:
        """Let ``seconds`` pass for the ``timers`` timers the test expects ``rt`` to
        arm (a retry's back-off, a tool's timeout): on the manual clock, wait until they
        are pending, then advance; on the system clock they fire by themselves."""
        if self.manual is None:
            return
        assert rt.scheduler.wait_pending(timers, WAIT), (
            f"expected {timers} pending timer(s); saw {rt.scheduler.statistics()}"
        )
        self.manual.advance(seconds)


@pytest.fixture(autouse=True)
def scenario_clock(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> ScenarioClock:
    """Every ``Runtime.open`` of the test without a ``clock=`` gets this test's clock."""
    if request.config.getoption("--clock") != "manual":
        return ScenarioClock(None)
    clock = ManualClock()
    opener = Runtime.open.__func__  # type: ignore[attr-defined]

    def open_on_clock(cls: type[Runtime], *args: Any, **kwargs: Any) -> Runtime:
        kwargs.setdefault("clock", clock)
        return opener(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(Runtime, "open", classmethod(open_on_clock))
    return ScenarioClock(clock)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def rt(store_path: Path) -> Iterator[Runtime]:
    runtime = Runtime.open(store_path)
    try:
        yield runtime
    finally:
        runtime.close()
        check_store(store_path)


@pytest.fixture
def fast_rt(store_path: Path) -> Iterator[Runtime]:
    """A runtime whose retries wait a millisecond or two."""
    runtime = Runtime.open(store_path, retry_policy=RetryPolicy(base_s=0.001, cap_s=0.002))
    try:
        yield runtime
    finally:
        runtime.close()
        check_store(store_path)


@pytest.fixture(params=[None, 1, 2], ids=lambda t: f"threads={t}")
def threaded_rt(request: pytest.FixtureRequest, store_path: Path) -> Iterator[Runtime]:
    """A runtime on each dispatcher size where waits between agents differ: one worker
    and a standby one (``threads=None``), one worker, two workers."""
    runtime = Runtime.open(store_path, threads=request.param)
    try:
        yield runtime
    finally:
        runtime.close(timeout=WAIT)
        check_store(store_path)


def check_store(path: Path) -> None:
    """Run the invariant checker over every session of the store at ``path`` (records
    of plugin types it does not know taken for their seqs)."""
    with Store.open(path) as store:
        for header in store.sessions():
            assert_invariants(store.read(header.id, include_ignored=True))


@pytest.fixture
def timeline(rt: Runtime) -> Timeline:
    return Timeline(rt)
