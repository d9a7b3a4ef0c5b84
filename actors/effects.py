"""Effects: what the turn coroutine awaits when it needs the outside world.

The turn is an ``async def`` that never touches a thread or an event loop. Awaiting an
:class:`Effect` suspends it and hands the effect to whoever steps it — the agent actor in
production, a test by hand in deterministic tests — which later resumes it with
``coro.send(result)`` or ``coro.throw(error)``.

``abortable`` effects are interrupted by a cancel: the stepper cancels the work and throws
:class:`TurnAborted` into the coroutine. The others (durability waits, joins of tool
calls already running) always run to completion.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import Any, Generic, TypeVar

from .model import ModelRequest

__all__ = [
    "Admit",
    "Checkpoint",
    "Effect",
    "Flush",
    "JoinTool",
    "NextBatch",
    "OpenStream",
    "RunAsync",
    "Sleep",
    "StartTool",
    "StreamEnd",
    "TurnAborted",
    "outcome_of",
]

T = TypeVar("T")


class TurnAborted(Exception):
    """Thrown into the turn coroutine when its signal aborts an abortable effect."""


class Effect(Generic[T]):
    """An awaitable request to the stepper; the awaited value is what it sends back."""

    __slots__ = ()
    abortable = False

    def __await__(self) -> Generator[Effect[T], Any, T]:
        result: T = yield self
        return result


class Admit(Effect[None]):
    """Wait for a place among the runtime's running turn chains (``max_running_turns``)."""

    __slots__ = ("admission", "on_admitted")
    abortable = True

    def __init__(self, admission: Any) -> None:
        self.admission = admission
        self.on_admitted: Any = None


class Checkpoint(Effect[None]):
    """Let control messages already queued for the actor (cancel, steer) run first."""

    __slots__ = ()
    abortable = True


class Flush(Effect[None]):
    """Wait until everything appended so far is durable."""

    __slots__ = ()


class RunAsync(Effect[Any]):
    """Run ``work()`` (a coroutine factory: async listeners) on the I/O side; with
    ``abortable=False`` a cancel does not interrupt it (a checkpoint's listeners)."""

    __slots__ = ("abortable", "name", "work")

    def __init__(
        self, name: str, work: Callable[[], Coroutine[Any, Any, Any]], *, abortable: bool = True
    ) -> None:
        self.name = name
        self.work = work
        self.abortable = abortable


async def outcome_of(name: str, result: Any, *, abortable: bool = True) -> Any:
    """The value of a bus ``serial``/``waterfall``/``parallel`` result: a ``Ready`` one at
    once, a ``Deferred`` one (async listeners) by running it on the I/O side."""
    if hasattr(result, "value"):
        return result.value
    return await RunAsync(name, result.run, abortable=abortable)


class Sleep(Effect[None]):
    """Wait ``seconds`` on the scheduler (retry backoff)."""

    __slots__ = ("seconds",)
    abortable = True

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class StreamEnd:
    """Marker ending a stream's batches."""

    __slots__ = ()


class OpenStream(Effect[Any]):
    """Start a model call; resumes with an opaque stream handle."""

    __slots__ = ("request",)
    abortable = True

    def __init__(self, request: ModelRequest) -> None:
        self.request = request


class NextBatch(Effect[Any]):
    """The chunks that arrived since the last batch (``StreamEnd`` last); raises the
    model's error.

    With ``consume``, the stepper hands each batch to ``consume(batch)`` itself, in
    mailbox order, and resumes the turn only with the first answer that is not None (or
    the model's error, or what ``consume`` raised): a stream's chunks, one batch a
    notification at realistic rates, are logged without a resume of the turn's
    coroutine each (five frames deep) and a new effect each."""

    __slots__ = ("consume", "stream")
    abortable = True

    def __init__(self, stream: Any, consume: Callable[[Any], Any] | None = None) -> None:
        self.stream = stream
        self.consume = consume

    def answer(self, items: Any) -> tuple[Any, BaseException | None] | None:
        """What the turn resumes with for the batch ``items``, as ``(value, error)``: the
        batch itself, or with ``consume`` its answer or what it raised; None when
        ``consume`` took the batch and the turn waits for more."""
        consume = self.consume
        if consume is None:
            return items, None
        try:
            answer = consume(items)
        except Exception as err:  # noqa: BLE001 - raised into the turn, as if there
            return None, err
        return None if answer is None else (answer, None)


class StartTool(Effect[Any]):
    """Start one tool execution on the I/O side; resumes at once with a handle."""

    __slots__ = ("plan",)

    def __init__(self, plan: Any) -> None:
        self.plan = plan


class JoinTool(Effect[tuple[Any, Any]]):
    """Wait until one of the started tool executions ``handles`` (in model order) has
    ended, whichever ends first; resumes with ``(handle, run)``, its handle and its
    ``ToolRun``. The tool phase commits results in model order whatever the order of
    completions, and starts a queued call as soon as any in-flight call ended."""

    __slots__ = ("handles",)

    def __init__(self, handles: Sequence[Any]) -> None:
        self.handles = handles
