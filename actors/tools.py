"""The tool protocol the agent consumes and the ``tools/execute`` middleware runner.

``runtime.tool`` builds :class:`Tool` objects from typed functions. Tool bodies never run
on a dispatcher thread: a synchronous body runs in the I/O side's blocking pool, an
``async def`` body on its event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from functools import partial
from typing import Any, Final, Protocol, runtime_checkable

import msgspec

from storage import TextBlock, ToolError, ToolSpec

from ._host import Host, unstopped
from ._pool import BlockingPool, Lease
from ._scheduler import Scheduler
from .listeners import is_async as listener_is_async

__all__ = [
    "Tool",
    "ToolOutcome",
    "ToolReturn",
    "ToolTimeout",
    "described",
    "outcome_from_output",
    "run_execute_chain",
    "shown",
]

MAX_PARALLEL_TOOLS: Final = 10


@runtime_checkable
class Tool(Protocol):
    """A tool the model may call."""

    @property
    def spec(self) -> ToolSpec: ...

    @property
    def concurrency_safe(self) -> bool: ...

    @property
    def timeout_s(self) -> float | None: ...

    @property
    def is_async(self) -> bool: ...

    def prepare(self, arguments: Any) -> Any:
        """Validate and convert the decoded JSON arguments; raise ToolArgumentError."""
        ...

    def run(self, prepared: Any) -> Any:
        """Run the body (returns a coroutine when ``is_async``)."""
        ...


class ToolReturn(msgspec.Struct, frozen=True):
    """What a body returns to say more than a value: ``concludes_turn`` ends the tool
    loop at this step."""

    output: Any = None
    concludes_turn: bool = False


class ToolOutcome(msgspec.Struct, frozen=True):
    """The settled result of one call, ready to become a ``tool/result`` fact."""

    content: tuple[TextBlock, ...]
    error: ToolError | None = None
    concludes_turn: bool = False


_encoder = msgspec.json.Encoder()


def _as_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    try:
        text = _encoder.encode(output).decode()
        if "null" in text:  # msgspec writes NaN/Infinity as null: a lossless result has none
            json.dumps(msgspec.to_builtins(output), allow_nan=False)
    except (TypeError, msgspec.EncodeError, UnicodeEncodeError) as err:
        raise TypeError(f"returned {type(output).__name__}, which is not JSON: {err}") from err
    except ValueError as err:
        raise TypeError("returned NaN or Infinity, which is not JSON") from err
    except RecursionError as err:
        raise TypeError(f"returned a {type(output).__name__} nested too deeply for JSON") from err
    return text


def shown(value: object) -> str:
    """``repr(value)`` cut short, for an error message; never raises."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ still gets named
        return f"a {type(value).__name__} whose repr() failed"
    if len(text) > _SHOWN_CHARS:
        return f"{text[:_SHOWN_CHARS]}... ({len(text) - _SHOWN_CHARS} more characters)"
    return text


_SHOWN_CHARS: Final = 200


def described(err: BaseException) -> str:
    """``"TypeName: message"`` of an exception, its message cut short, for an error
    result; never raises."""
    try:
        text = str(err)
    except Exception:  # noqa: BLE001 - a hostile __str__ still gets named
        text = "(its str() failed)"
    if len(text) > _DESCRIBED_CHARS:
        text = f"{text[:_DESCRIBED_CHARS]}... ({len(text) - _DESCRIBED_CHARS} more characters)"
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


_DESCRIBED_CHARS: Final = 2000


def _failed(message: str, concludes: bool = False) -> ToolOutcome:
    return ToolOutcome(
        content=(TextBlock(text=f"tool failed: {message}"),),
        error=ToolError(code="TOOL_FAILED", message=message),
        concludes_turn=concludes,
    )


def outcome_from_output(output: Any) -> ToolOutcome:
    """Turn a body's return value (or a tools/execute or post-execute listener's) into an
    outcome; a non-JSON value, or a ``ToolReturn`` whose ``concludes_turn`` is not a bool
    (msgspec does not check at construction, and the log could not read it back), is an
    error result."""
    concludes = False
    if isinstance(output, ToolReturn):
        concludes = output.concludes_turn
        if type(concludes) is not bool:
            return _failed(
                f"returned a ToolReturn whose concludes_turn is not a bool: {shown(concludes)}"
            )
        output = output.output
    try:
        text = _as_text(output)
    except (TypeError, ValueError) as err:
        return _failed(str(err), concludes)
    return ToolOutcome(content=(TextBlock(text=text),), concludes_turn=concludes)


ExecuteListener = Callable[[Any, Callable[[], Any]], Any]


class ToolTimeout(Exception):
    """A tool's body ran past its ``timeout_s``."""

    def __init__(self) -> None:
        super().__init__("the tool timed out")


async def run_execute_chain(
    listeners: Sequence[ExecuteListener],
    event: Any,
    run: Callable[[], Any],
    *,
    is_async: bool,
    timeout: float | None,
    pool: Executor,
    timer: Scheduler | None = None,
) -> Any:
    """Run ``tools/execute`` middleware around the body ``run`` on the running loop.

    Outermost listener first; not calling ``next`` short-circuits the rest. An async
    listener gets a ``next`` returning an awaitable; a sync listener runs in ``pool``,
    so no listener ever blocks the loop or a dispatcher thread. A sync listener's
    ``next()`` blocks its pool thread until the inner chain is done, and that thread
    runs the inner chain's sync work itself meanwhile (sync listeners, a sync body), on
    the spot or sent from the loop past async listeners: one call holds at most one pool
    thread whatever its mix of listeners, so calls cannot starve the pool waiting for
    threads other waiting calls hold. A sync body runs in the pool (``is_async``: ``run``
    returns a coroutine, run on the loop). Past ``timeout`` seconds the body raises
    :class:`ToolTimeout` to the listeners (seconds of ``timer``'s clock: the runtime's
    scheduler; None: the event loop's); a sync body that holds a sync listener's
    thread when it times out ends the whole call with ``ToolTimeout`` at once (that
    listener's ``next()`` raises it once the body returns; what it returns is dropped).
    """
    loop = asyncio.get_running_loop()
    is_async_listener = [listener_is_async(listener) for listener in listeners]
    held = loop.create_future()  # set when a timed-out body holds a listener's thread

    async def body(host: Host | None) -> Any:
        lease = None
        if is_async:
            work: Awaitable[Any] = _guarded(run())  # wait_for runs it as a task of its own
        elif timeout is not None and isinstance(pool, BlockingPool):
            lease = pool.lease()
            leased = partial(_run_leased, run, lease)
            if host is None:
                submitted = pool.submit(leased)
                submitted.add_done_callback(lease.end)  # also if it never starts
                work = asyncio.wrap_future(submitted)
            else:
                work = host.submit(leased)
        elif host is None:
            work = loop.run_in_executor(pool, unstopped, run)
        else:
            work = host.submit(run)
        if timeout is None:
            return await work
        try:
            if timer is None:
                return await asyncio.wait_for(work, timeout)
            return await timer.wait_for(work, timeout)
        except TimeoutError:
            if lease is not None:
                lease.abandon()  # the body keeps its thread: the pool may start another
            if host is not None and not held.done():
                held.set_result(None)
            raise ToolTimeout from None

    async def call(index: int, host: Host | None) -> Any:
        if index == len(listeners):
            return await body(host)
        listener = listeners[index]
        if is_async_listener[index]:
            return await listener(event, lambda: call(index + 1, host))
        if host is None:
            return await loop.run_in_executor(
                pool, unstopped, listener, event, sync_next(index + 1)
            )
        return await host.submit(listener, event, sync_next(index + 1))

    def sync_next(index: int) -> Callable[[], Any]:
        def next_() -> Any:  # on the (pool) thread of the sync listener before ``index``
            if index < len(listeners) and not is_async_listener[index]:
                return listeners[index](event, sync_next(index + 1))
            if index == len(listeners) and not is_async and timeout is None:
                return run()
            host = Host(loop, pool)
            return host.serve(call(index, host))

        return next_

    if is_async or timeout is None or all(is_async_listener):
        return await _guarded(call(0, None))  # no sync body can hold a listener's thread
    chain = asyncio.ensure_future(_guarded(call(0, None)))
    try:
        await asyncio.wait((chain, held), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not chain.done():  # held, or this call cancelled: the chain is dropped
            chain.cancel()
            chain.add_done_callback(_retrieve)
    if chain.done():
        return chain.result()
    raise ToolTimeout


async def _guarded(work: Awaitable[Any]) -> Any:
    """``await work``, a ``BaseException`` it raises (``KeyboardInterrupt``, one of a
    listener's own) turned into a ``RuntimeError``: the call's failure. Raised out of a
    task, asyncio would re-raise it out of the I/O loop and end its thread."""
    try:
        return await work
    except (Exception, asyncio.CancelledError, GeneratorExit):
        raise
    except BaseException as err:  # the call's failure, not the loop's
        raise RuntimeError(f"the tool or a tools/execute listener raised {err!r}") from err


def _run_leased(run: Callable[[], Any], lease: Lease) -> Any:
    try:
        return unstopped(run)  # its outcome goes into an asyncio future
    finally:
        lease.end()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a dropped task's outcome as seen (asyncio would log an unretrieved error)."""
    if not task.cancelled():
        task.exception()
