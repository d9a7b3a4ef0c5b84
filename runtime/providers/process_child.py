"""The child's side of :class:`~runtime.providers.process.ProcessModel`: started as
``python -c "...process_child import main; main(sys.argv)" FD LINGER``, it builds the
model from the first frame on its socket, runs each request as a task and sends what
every pass of its loop produced as one frame (the wire is described in
:mod:`runtime.providers.process`)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import pickle
import selectors
import signal
import socket
import sys
import time
from functools import partial
from typing import Any

from actors import ModelError, ModelRequest
from actors.model import checked_chunk, push_reply
from storage import LlmFailure, StreamChunk

from .process import _DECODE_IN, _ENCODE, _framed, _Frames, _Open, _Out

__all__ = ["main"]


class _Child:
    """The child's side: builds the model from the first frame, runs each request as a
    task, and sends what every pass of its loop produced as one frame."""

    def __init__(self, loop: asyncio.AbstractEventLoop, finished: asyncio.Future[None]) -> None:
        self.loop = loop
        self.finished = finished
        self.model: Any = None
        self.frames: _Frames | None = None
        self.tasks: dict[int, asyncio.Task[LlmFailure | None]] = {}
        self.pending: dict[int, _Out] = {}

    def frame(self, view: memoryview) -> None:
        if self.model is None:
            self._build(bytes(view))
            return
        message = _DECODE_IN(view)
        if isinstance(message, _Open):
            rid = message.rid
            task = self.tasks[rid] = self.loop.create_task(self._run(rid, message.request))
            # The end is sent when the task is done, however it ended: one cancelled
            # before it started (its open and cancel in one read) never runs its body.
            task.add_done_callback(partial(self._ended, rid))
        else:
            running = self.tasks.get(message.rid)
            if running is not None:
                running.cancel()

    def _build(self, spec: bytes) -> None:
        try:
            factory, args, kwargs = pickle.loads(spec)  # noqa: S301 - our parent's, over a socketpair
            self.model = factory(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - reported to the parent, which fails its requests
            failure = LlmFailure(message=f"the model's process could not build it: {err!r}")
            self._send(_Out(0, end=True, failure=failure))
            self.finished.set_result(None)
            return
        self._send(_Out(0, end=True))

    async def _run(self, rid: int, request: ModelRequest) -> LlmFailure | None:
        """Stream ``request``, its chunks pushed into this pass's frame; its failure."""
        model = self.model
        checked = getattr(model, "chunks_checked", False) is True

        def push(chunks: list[StreamChunk]) -> None:
            if not chunks:
                return
            out = self._out(rid).chunks
            if checked:
                out.extend(chunks)
                return
            for chunk in chunks:  # those before a malformed one are sent, then it fails
                out.append(checked_chunk(chunk))

        try:
            await push_reply(model, request, push)
        except ModelError as err:
            return err.failure
        except Exception as err:  # noqa: BLE001 - as the agent normalizes it in-process
            return LlmFailure(message=repr(err), code="UNKNOWN")
        return None

    def _ended(self, rid: int, task: asyncio.Task[LlmFailure | None]) -> None:
        del self.tasks[rid]
        out = self._out(rid)
        out.end = True  # a cancelled one's end has no failure: the parent asked for it
        out.failure = None if task.cancelled() else task.result()

    def _out(self, rid: int) -> _Out:
        out = self.pending.get(rid)
        if out is None:
            if not self.pending:
                self.loop.call_soon(self._flush)  # after this pass's reads
            out = self.pending[rid] = _Out(rid, [])
        return out

    def _flush(self) -> None:
        outs = list(self.pending.values())
        self.pending.clear()
        self._send(*outs)

    def _send(self, *outs: _Out) -> None:
        frames = self.frames
        if frames is not None and frames.transport is not None:
            frames.transport.write(_framed(_ENCODE(list(outs))))

    def lost(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)


async def _serve(fd: int) -> None:
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    child = _Child(loop, finished)
    sock = socket.socket(fileno=fd)
    _, child.frames = await loop.create_unix_connection(
        lambda: _Frames(child.frame, child.lost), sock=sock
    )
    await finished
    for task in list(child.tasks.values()):
        task.cancel()
    await asyncio.gather(*child.tasks.values(), return_exceptions=True)
    aclose = getattr(child.model, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
    if child.frames.transport is not None:
        child.frames.transport.close()


class _Lingering(selectors.DefaultSelector):
    """The child's selector: a select within ``linger`` seconds of the end of the last
    one first sleeps the rest of that time (less, if the loop's own timeout is nearer);
    one after a quiet spell blocks as any and returns at the first byte."""

    def __init__(self, linger: float) -> None:
        super().__init__()
        self._linger = linger
        self._last = -math.inf

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout > 0:
            wait = self._last + self._linger - time.monotonic()
            if wait > 0:
                if timeout is not None:
                    wait = min(wait, timeout)
                    timeout -= wait
                time.sleep(wait)
        try:
            return super().select(timeout)
        finally:
            self._last = time.monotonic()


def main(argv: list[str]) -> None:
    """The child: ``argv`` is [-c, its socket's fd, the linger in seconds]."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; its exit ends us
    linger = float(argv[2])
    # No linger: asyncio's own loop (loop_factory None), as asyncio.run makes it.
    loop_factory = partial(asyncio.SelectorEventLoop, _Lingering(linger)) if linger else None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_serve(int(argv[1])))


if __name__ == "__main__":
    main(sys.argv)
