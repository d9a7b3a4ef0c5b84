"""The agent's two long-running effects: a model stream and a tool execution.

Both run on the I/O side and hand results back to the owning actor through a thread-safe
handle plus a notification (an actor message). A stream's chunks are batched: while the
actor has not taken the last batch, new chunks join it instead of sending another message.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from storage import StreamChunk

from ._ioside import EffectHandle, IoSide, Outcome
from ._scheduler import Scheduler
from .effects import StreamEnd
from .model import (
    ImmediateModel,
    Model,
    ModelRequest,
    checked_chunk,
    push_reply,
)
from .protocols import implements
from .toolphase import ToolPlan, ToolRun
from .tools import ToolTimeout, run_execute_chain

__all__ = [
    "StreamHandle",
    "ToolHandle",
    "chunks_checked",
    "is_immediate",
    "open_stream",
    "start_tool",
]


class _Failure:
    """The stream's failure, queued behind the chunks that came before it."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class StreamHandle:
    """Chunks of one model call, produced on the loop, taken by the actor.

    Chunks become visible to the actor in mailbox order: the loop appends them and sends
    one notification ``(handle, upto)`` at a time; only when the actor handles it are the
    chunks up to ``upto`` announced (and a new notification sent for any that arrived
    since). So a steer or cancel sent before a chunk arrived is always handled before the
    turn sees that chunk.

    Invariant: ``_taken <= _announced <= len(_items)``; at most one notification in flight.
    """

    __slots__ = (
        "_announced",
        "_effect",
        "_failed",
        "_items",
        "_lock",
        "_notified",
        "_notify",
        "_taken",
    )

    def __init__(self, notify: Callable[[StreamHandle, int], None]) -> None:
        self._lock = threading.Lock()
        self._items: list[StreamChunk | StreamEnd | _Failure] = []
        self._taken = 0
        self._announced = 0
        self._notify = notify
        self._notified = False
        self._failed = False  # a _Failure is among the items: take() must look for it
        self._effect: EffectHandle[Any] | None = None

    def _append(self, item: StreamChunk | StreamEnd | _Failure) -> None:
        with self._lock:
            self._items.append(item)
            if self._notified:
                return
            self._notified = True
            upto = len(self._items)
        self._notify(self, upto)

    def push(self, item: StreamChunk | StreamEnd) -> None:
        self._append(item)

    def push_many(self, items: list[StreamChunk]) -> None:
        """:meth:`push` of each of ``items``, under one lock and at most one
        notification (none for no items)."""
        if not items:
            return
        with self._lock:
            self._items += items
            if self._notified:
                return
            self._notified = True
            upto = len(self._items)
        self._notify(self, upto)

    def fail(self, error: BaseException) -> None:
        self._failed = True  # before the failure is appended: take() then looks for it
        self._append(_Failure(error))

    def prefill(
        self, items: list[StreamChunk | StreamEnd | _Failure], *, failed: bool = False
    ) -> None:
        """Answer inline (before the handle is shared): everything is announced at once.
        ``failed``: a :class:`_Failure` is among ``items``."""
        self._items = items
        self._announced = len(items)
        self._failed = failed

    def announce(self, upto: int) -> None:
        """The owning actor handled the notification ``upto`` (in its mailbox order)."""
        with self._lock:
            self._notified = False
            self._announced = max(self._announced, upto)
            if len(self._items) <= self._announced:
                return
            self._notified = True
            upto = len(self._items)
        self._notify(self, upto)

    def take(self) -> tuple[list[StreamChunk | StreamEnd], BaseException | None]:
        """The announced chunks not taken yet; a failure only once the chunks before it
        were taken."""
        with self._lock:
            start, stop = self._taken, self._announced
            batch = self._items[start:stop]
            if not self._failed:  # the usual stream: no failure to look for
                self._taken = stop
                return batch, None  # type: ignore[return-value]
            for index, item in enumerate(batch):
                if isinstance(item, _Failure):
                    if index == 0:
                        self._taken = start + 1
                        return [], item.error
                    self._taken = start + index
                    return batch[:index], None  # type: ignore[return-value]
            self._taken = stop
        return batch, None  # type: ignore[return-value]

    def cancel(self) -> None:
        if self._effect is not None:
            self._effect.cancel()


def is_immediate(model: Model) -> bool:
    """Whether ``model`` may answer inline (checked once per agent)."""
    return implements(model, ImmediateModel)


def chunks_checked(model: Model) -> bool:
    """Whether ``model`` vouches that its chunks are well formed (``chunks_checked =
    True``), so that they need not be checked one by one (see ``actors.model``)."""
    return getattr(model, "chunks_checked", False) is True


def open_stream(
    model: Model,
    request: ModelRequest,
    io: IoSide,
    notify: Callable[[StreamHandle, int], None],
    *,
    immediate: bool,
    checked: bool = False,
) -> StreamHandle:
    """Start ``model`` on ``request``; an immediate model answers inline. ``checked``:
    the model's chunks are well formed by construction (see :func:`chunks_checked`)."""
    handle = StreamHandle(notify)
    if immediate:
        items: list[StreamChunk | StreamEnd | _Failure] = []
        try:
            answer = model.answer_now(request)  # type: ignore[attr-defined]
            if answer is not None:
                items += answer if checked else map(checked_chunk, answer)  # up to a bad one
                items.append(_END)
        except BaseException as err:  # noqa: BLE001 - the request's failure, as from stream()
            items.append(_Failure(_as_exception(err)))
            handle.prefill(items, failed=True)
            return handle
        if answer is not None:
            handle.prefill(items)
            return handle

    push = handle.push_many if checked else partial(_push_checked, handle)

    async def pump() -> None:
        try:
            await push_reply(model, request, push)
        except BaseException as err:  # noqa: BLE001 - _failed raises on what is not the model's
            _failed(handle, err)
            return
        handle.push(StreamEnd())

    handle._effect = io.start(pump, on_done=_ignore)
    return handle


_END = StreamEnd()  # stateless: the end of every inline answer


def _push_checked(handle: StreamHandle, batch: Any) -> None:
    """Push ``batch`` checked chunk by chunk: those before a malformed one are pushed,
    then its :class:`ModelError` is raised (as a chunk-by-chunk stream would)."""
    if not batch:
        return
    items: list[StreamChunk] = []
    try:
        for chunk in batch:
            items.append(checked_chunk(chunk))
    finally:
        if items:
            handle.push_many(items)


def _failed(handle: StreamHandle, err: BaseException) -> None:
    """What the model's call raised, handed to the turn as its failure; raised on (from
    the ``except`` calling this) where it is not the model's: the turn's cancel (or a
    close), or a coroutine being closed (it must not go on)."""
    if isinstance(err, asyncio.CancelledError) and _cancelling():
        raise err
    handle.fail(_as_exception(err))
    if isinstance(err, GeneratorExit):
        raise err


def _cancelling() -> bool:
    """Whether the running task was asked to cancel (by corral: a turn's cancel, a close)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _as_exception(err: BaseException) -> Exception:
    """A model's failure as an ``Exception``: one that is not (``SystemExit``,
    ``KeyboardInterrupt``, a ``CancelledError`` of its own) is the request's failure all
    the same; raised on, it would stop every actor of the process or end the I/O loop."""
    if isinstance(err, Exception):
        return err
    return RuntimeError(f"the model raised {err!r}")


def _ignore(_outcome: Outcome[Any]) -> None:
    return None


class ToolHandle:
    """One tool execution; ``run`` is set (then ``done``) from an I/O thread, and
    ``delivered`` by the owning actor when it handles the completion message."""

    __slots__ = ("delivered", "done", "run")

    def __init__(self) -> None:
        self.run: ToolRun | None = None
        self.done = False
        self.delivered = False


def start_tool(
    plan: ToolPlan,
    io: IoSide,
    bus: Any,
    scope: str,
    notify: Callable[[ToolHandle], None],
    timer: Scheduler | None = None,
) -> ToolHandle:
    """Run ``plan``'s body (wrapped by ``tools/execute``) on the I/O side; its timeout
    runs on ``timer``'s clock (the agent's scheduler; None: the event loop's)."""
    handle = ToolHandle()
    tool = plan.tool
    listeners = bus.listeners("tools/execute", scope=scope)
    timeout = tool.timeout_s

    if not listeners and not tool.is_async and timeout is None:
        # The usual sync tool: the body straight on a pool thread (no effect handle,
        # outcome or callback between it and its completion message).
        io.call_blocking(_run_sync_tool, io, handle, tool, plan.prepared, notify)
        return handle

    def finish(outcome: Outcome[Any]) -> None:
        handle.run = _tool_run(outcome.value, outcome.error, cancelled=outcome.cancelled)
        handle.done = True
        notify(handle)

    async def chain() -> Any:
        return await run_execute_chain(
            listeners,
            plan.event,
            partial(tool.run, plan.prepared),
            is_async=tool.is_async,
            timeout=timeout,
            pool=io.blocking_pool,
            timer=timer,
        )

    io.start(chain, on_done=finish)
    return handle


def _tool_run(value: Any, error: BaseException | None, *, cancelled: bool) -> ToolRun:
    """How a tool execution ended, from what its effect reported."""
    if cancelled and error is None and value is None:
        return ToolRun(error=RuntimeError("the tool run was cancelled by shutdown"))
    if isinstance(error, ToolTimeout):
        return ToolRun(timed_out=True)
    if error is not None:
        return ToolRun(error=error)
    return ToolRun(output=value)


def _run_sync_tool(
    io: IoSide, handle: ToolHandle, tool: Any, prepared: Any, notify: Callable[[ToolHandle], None]
) -> None:
    """A sync tool's body on a pool thread (:meth:`IoSide.call_blocking`), reporting as
    its blocking effect would: once the I/O side is closing, a body not started yet does
    not start (as a cancelled effect, it ends "cancelled by shutdown"), and one that
    returned None while it closed ends so too."""
    value: Any = None
    error: BaseException | None = None
    if not io.closed:
        try:
            value = tool.run(prepared)
        except BaseException as err:  # noqa: BLE001 - reported, never lost in the pool
            error = err
    handle.run = _tool_run(value, error, cancelled=io.closed)
    handle.done = True
    notify(handle)
