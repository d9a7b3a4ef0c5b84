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
from typing import Any, Final, Protocol, runtime_checkable

import msgspec

from storage.events import TextBlock, ToolError, ToolSpec

from .bus import _is_async

__all__ = [
    "Tool",
    "ToolArgumentError",
    "ToolOutcome",
    "ToolReturn",
    "outcome_from_output",
    "run_execute_chain",
]

MAX_PARALLEL_TOOLS: Final = 10


class ToolArgumentError(ValueError):
    """The model's arguments do not fit the tool's parameters."""


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

    content: list[TextBlock]
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


def outcome_from_output(output: Any) -> ToolOutcome:
    """Turn a body's return value into an outcome; a non-JSON value is an error result."""
    concludes = False
    if isinstance(output, ToolReturn):
        concludes = output.concludes_turn
        output = output.output
    try:
        text = _as_text(output)
    except (TypeError, ValueError) as err:
        return ToolOutcome(
            content=[TextBlock(text=f"tool failed: {err}")],
            error=ToolError(code="TOOL_FAILED", message=str(err)),
            concludes_turn=concludes,
        )
    return ToolOutcome(content=[TextBlock(text=text)], concludes_turn=concludes)


ExecuteListener = Callable[[Any, Callable[[], Any]], Any]


async def run_execute_chain(
    listeners: Sequence[ExecuteListener],
    event: Any,
    body: Callable[[], Awaitable[Any]],
    *,
    pool: Executor,
) -> Any:
    """Run ``tools/execute`` middleware around ``body`` on the running loop.

    Outermost listener first; not calling ``next`` short-circuits the rest. An async
    listener gets a ``next`` returning an awaitable; a sync listener runs in ``pool`` and
    its ``next()`` blocks that pool thread until the inner chain is done, so no listener
    ever blocks the loop or a dispatcher thread.
    """
    loop = asyncio.get_running_loop()

    async def call(index: int) -> Any:
        if index == len(listeners):
            return await body()
        listener = listeners[index]
        if _is_async(listener):  # the bus's test: an async callable object is async too
            return await listener(event, lambda: call(index + 1))

        def sync_next() -> Any:
            return asyncio.run_coroutine_threadsafe(call(index + 1), loop).result()

        return await loop.run_in_executor(pool, listener, event, sync_next)

    return await call(0)
