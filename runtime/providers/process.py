"""A model in a process of its own: :class:`ProcessModel`.

One process runs corral's agents under one GIL. With a real streaming provider, the
I/O loop's share of every chunk (the socket read, HTTP framing, SSE, JSON, the vendor's
mapping) competes for that GIL with the dispatcher's share (the agent's turn, the
durable append): at realistic rates each costs about as much as the other. A
``ProcessModel`` runs the model (built from a picklable factory) in a child process,
whose own loop does all of the first part on the machine's other core; the agents'
process gets, per pass of the child's loop, one frame of the chunks of every stream
that read something, already decoded, and pushes each stream's share into its agent as
a :class:`~actors.model.PushStreamingModel` does.

Wire (a Unix socket pair, length-prefixed msgpack frames): the parent sends the pickled
``(factory, args, kwargs)`` first, then ``_Open(rid, request)`` and ``_Cancel(rid)``;
the child answers ``[_Out]`` frames, ``rid`` 0 first (built, or why not), then each
request's chunks and its end (with its failure, if any). The child ignores SIGINT and
ends when the socket closes, so it never outlives its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pickle
import socket
import struct
import sys
import threading
from collections.abc import AsyncIterator, Callable
from itertools import count
from typing import Any, Final

import msgspec

from actors import ModelError, ModelRequest
from actors.model import batches_pushed, chunks_of
from storage import LlmFailure, StreamChunk

__all__ = ["ProcessModel"]

_HEADER: Final = struct.Struct("<I")
_BUFFER: Final = 1 << 16  # a frame reader's buffer, grown for a larger frame
_SHRINK_ABOVE: Final = 1 << 20  # ... and given back once it is empty, if above this
_CANCEL_WAIT_S: Final = 10.0  # a cancelled request: how long to wait for the child's end
_CLOSE_WAIT_S: Final = 10.0  # aclose: how long the child may take to exit before a kill
_LOST_WAIT_S: Final = 2.0  # the socket closed: how long the child may take to exit, likewise
LINGER_S: Final = 0.004
"""How long the child's loop lingers after a pass before it looks at its sockets again
(see ``ProcessModel``'s ``linger``)."""


class _Open(msgspec.Struct, tag=0, array_like=True):
    rid: int
    request: ModelRequest


class _Cancel(msgspec.Struct, tag=1, array_like=True):
    rid: int


class _Out(msgspec.Struct, array_like=True):
    """What one pass of the child's loop has for request ``rid``: chunks, then maybe its
    end. ``rid`` 0: the model was built (``end``), or why not (``failure``)."""

    rid: int
    chunks: list[StreamChunk] = []
    end: bool = False
    failure: LlmFailure | None = None


_ENCODE: Final = msgspec.msgpack.Encoder().encode
_DECODE_OUT: Final = msgspec.msgpack.Decoder(list[_Out]).decode
_DECODE_IN: Final = msgspec.msgpack.Decoder(_Open | _Cancel).decode


def _framed(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload)) + payload


class _Frames(asyncio.BufferedProtocol):
    """Length-prefixed frames read into one buffer (both ends): ``on_frame(view)`` for
    each whole frame (the view is valid during the call only), ``on_lost()`` once."""

    def __init__(self, on_frame: Callable[[memoryview], None], on_lost: Callable[[], None]) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._buf = bytearray(_BUFFER)
        self._view = memoryview(self._buf)
        self._filled = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if len(self._buf) - self._filled < 4096:
            self._grow(len(self._buf) * 2)
        return self._view[self._filled :]

    def _grow(self, size: int) -> None:
        buf = bytearray(size)
        buf[: self._filled] = self._view[: self._filled]
        self._view.release()
        self._buf, self._view = buf, memoryview(buf)

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        view, filled, pos = self._view, self._filled, 0
        while filled - pos >= 4:
            (size,) = _HEADER.unpack_from(view, pos)
            end = pos + 4 + size
            if end > filled:
                if end - pos > len(self._buf):  # a frame larger than the buffer
                    self._compact(pos)
                    self._grow(max(len(self._buf) * 2, end - pos))
                    return
                break
            self._on_frame(view[pos + 4 : end])
            pos = end
        self._compact(pos)
        if not self._filled and len(self._buf) > _SHRINK_ABOVE:  # one large frame's room
            self._view.release()
            self._buf = bytearray(_BUFFER)
            self._view = memoryview(self._buf)

    def _compact(self, pos: int) -> None:
        if pos:
            rest = self._filled - pos
            self._view[:rest] = self._view[pos : self._filled]
            self._filled = rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._on_lost()


class _Request:
    __slots__ = ("done", "push")

    def __init__(
        self, push: Callable[[list[StreamChunk]], None] | None, done: asyncio.Future[None]
    ):
        self.push = push  # None once cancelled: what the child still sends is dropped
        self.done = done


class _Channel:
    """One child process and its socket, on one loop."""

    def __init__(self, spec: bytes, linger: float, on_gone: Callable[[_Channel], None]) -> None:
        self._spec = spec
        self._linger = linger
        self._on_gone = on_gone
        self._ids = count(1)
        self._open: dict[int, _Request] = {}
        self._frames: _Frames | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._broken: LlmFailure | None = None  # the child could not build its model
        self._gone = False
        self._closing = False
        self._reaping: asyncio.Future[None] | None = None
        # Set once the child built its model (or could not, or ended first).
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(_retrieved)
        self.started: asyncio.Task[None] = asyncio.ensure_future(self._start())

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def _start(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(
                [p for p in sys.path if p] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
            )
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                "import sys; from runtime.providers.process_child import main; main(sys.argv)",
                str(theirs.fileno()),
                repr(self._linger),
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        loop = asyncio.get_running_loop()
        _, self._frames = await loop.create_unix_connection(
            lambda: _Frames(self._frame, self._lost), sock=ours
        )
        self._write(self._spec)

    def _write(self, payload: bytes) -> None:
        frames = self._frames
        if frames is not None and frames.transport is not None:
            frames.transport.write(_framed(payload))

    def open(
        self, request: ModelRequest, push: Callable[[list[StreamChunk]], None]
    ) -> tuple[int, asyncio.Future[None]]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._broken is not None:
            done.set_exception(ModelError(self._broken))
            return 0, done
        if self._gone:
            done.set_exception(ModelError(_ended("before the request was sent")))
            return 0, done
        rid = next(self._ids)
        self._open[rid] = _Request(push, done)
        self._write(_ENCODE(_Open(rid, request)))
        return rid, done

    def cancel(self, rid: int) -> None:
        request = self._open.get(rid)
        if request is not None and request.push is not None:
            request.push = None
            self._write(_ENCODE(_Cancel(rid)))

    def _frame(self, view: memoryview) -> None:
        for out in _DECODE_OUT(view):
            rid = out.rid
            if rid == 0:
                if out.failure is not None:
                    self._broken = out.failure
                    self._fail_all(out.failure)
                elif not self.ready.done():
                    self.ready.set_result(None)
                continue
            request = self._open.get(rid)
            if request is None:
                continue
            if out.chunks and request.push is not None:
                request.push(out.chunks)
            if out.end:
                del self._open[rid]
                if not request.done.done():
                    if out.failure is None or request.push is None:
                        request.done.set_result(None)
                    else:
                        request.done.set_exception(ModelError(out.failure))

    def _fail_all(self, failure: LlmFailure) -> None:
        if not self.ready.done():
            self.ready.set_exception(ModelError(failure))
        open_, self._open = self._open, {}
        for request in open_.values():
            if not request.done.done():
                if request.push is None:  # cancelled: its end, not a failure
                    request.done.set_result(None)
                else:
                    request.done.set_exception(ModelError(failure))

    def _lost(self) -> None:
        self._gone = True
        if not self._closing:  # (close() waits for the child itself)
            self._reaping = asyncio.ensure_future(self._reap())
        self._on_gone(self)

    async def _reap(self) -> None:
        process = self._process
        code = None
        if process is not None:
            # The socket closed: the child died, or it ends itself (it reads the close). Not
            # killed at once: a kill polls the process first, and that poll could reap a
            # dead child under the event loop's child watcher, which then logs an unknown
            # child and reports its exit code as 255.
            code = await _exit_of(process, _LOST_WAIT_S)
        self._fail_all(self._broken or _ended(f"while the request streamed (exit code {code})"))

    async def close(self) -> None:
        self._closing = True
        with contextlib.suppress(BaseException):
            await self.started
        self._gone = True
        self._on_gone(self)
        frames, process = self._frames, self._process
        if frames is not None and frames.transport is not None:
            frames.transport.close()  # the child reads its end and exits
        if process is not None:
            await _exit_of(process, _CLOSE_WAIT_S)
        self._fail_all(_ended("because the model was closed"))


async def _exit_of(process: asyncio.subprocess.Process, within: float) -> int:
    """The child's exit code once it ended, killed if it has not ended ``within`` s."""
    try:
        return await asyncio.wait_for(process.wait(), within)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        return await process.wait()


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # (read, so that no one is told it never was)


def _ended(when: str) -> LlmFailure:
    return LlmFailure(message=f"the model's process ended {when}", code="TRANSPORT")


class ProcessModel:
    """A model run in a child process: ``ProcessModel(factory, *args, **kwargs)`` builds
    ``factory(*args, **kwargs)`` there, on the first request of each event loop that uses
    it (for a model string, the string ``process:openai:gpt-4o`` where model strings go,
    or ``ProcessModel(resolve_model, "openai:gpt-4o")``). It is a
    :class:`~actors.model.PushStreamingModel`: the agents see the same chunks, failures
    and log as with the model in their own process.

    The factory and its arguments must pickle; the model is also built once here, at
    once, for its ``provider`` and ``name`` and so that bad arguments fail where they
    are passed (it makes no request here). Keys are best left to the environment, which
    the child inherits (a :class:`~runtime.providers.Secret` does not pickle).

    Cancelling a request sends the cancel to the child and waits (up to 10 s) until the
    child ended it (the model closed its connection). If the child dies, its requests
    fail with ``TRANSPORT`` and the next request starts another. :meth:`aclose` ends the
    running loop's child.

    ``linger`` (seconds, default :data:`LINGER_S`; not passed to the factory): after a
    pass of its loop, the child waits that long before it looks at its sockets again, so
    that under load one pass reads what every stream got meanwhile and sends it in one
    frame: one wake-up of each process per ``linger`` instead of one per read. A read
    after a quiet spell is not delayed; one during a busy spell is, by up to
    ``linger``. 0: no lingering.
    """

    def __init__(
        self, factory: Callable[..., Any], /, *args: Any, linger: float = LINGER_S, **kwargs: Any
    ) -> None:
        if isinstance(linger, bool) or not (
            isinstance(linger, int | float) and 0 <= linger < math.inf
        ):
            raise ValueError(f"linger must be a number of seconds >= 0, got {linger!r}")
        self.linger = float(linger)
        if isinstance(factory, str):
            raise TypeError(
                f"ProcessModel takes a factory, not the model string {factory!r}: write "
                f"'process:{factory}' where a model string goes (resolve_model), or "
                f"ProcessModel(resolve_model, {factory!r})"
            )
        try:
            self._spec = pickle.dumps((factory, args, kwargs))
        except Exception as err:
            raise TypeError(
                f"ProcessModel's factory and its arguments must pickle, to be sent to the "
                f"model's process: {err}"
            ) from err
        inner = factory(*args, **kwargs)
        self._provider: str = inner.provider
        self._name: str = inner.name
        # The child checks the chunks of a model that does not vouch for its own (as the
        # agent would, chunk by chunk): what reaches this process is well formed.
        self.chunks_checked = True
        self._channels: dict[asyncio.AbstractEventLoop, _Channel] = {}
        # Children whose socket closed on their own, still being reaped (aclose waits).
        self._reaping: set[asyncio.Future[None]] = set()
        self._lock = threading.Lock()

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def name(self) -> str:
        return self._name

    @property
    def pids(self) -> list[int]:
        """The process ids of the running children (one per loop that streamed)."""
        with self._lock:
            return [pid for channel in self._channels.values() if (pid := channel.pid)]

    def __repr__(self) -> str:
        return f"ProcessModel({self._provider}:{self._name})"

    def _channel(self) -> _Channel:
        loop = asyncio.get_running_loop()
        with self._lock:
            channel = self._channels.get(loop)
            if channel is None:
                for old in [old for old in self._channels if old.is_closed()]:
                    del self._channels[old]
                channel = self._channels[loop] = _Channel(self._spec, self.linger, self._forget)
        return channel

    def _forget(self, channel: _Channel) -> None:
        with self._lock:
            for loop, known in list(self._channels.items()):
                if known is channel:
                    del self._channels[loop]
            reaping = channel._reaping
            if reaping is not None and not reaping.done():
                self._reaping.add(reaping)
                reaping.add_done_callback(self._reaping.discard)

    async def start(self) -> None:
        """Start the running loop's child now and wait until it has built its model (else
        the first request starts it, and waits only for the spawn, ~5 ms; the child's
        imports, a few hundred ms, overlap its first requests). Raises
        :class:`~actors.model.ModelError` if it could not."""
        channel = await self._started()
        await asyncio.shield(channel.ready)

    async def _started(self) -> _Channel:
        channel = self._channel()
        try:
            await asyncio.shield(channel.started)
        except Exception as err:
            self._forget(channel)  # the next request tries again
            raise ModelError(
                LlmFailure(
                    message=f"the model's process could not start: {err!r}", code="TRANSPORT"
                )
            ) from err
        return channel

    async def stream_into(
        self, request: ModelRequest, push: Callable[[list[StreamChunk]], None]
    ) -> None:
        """The reply pushed as the child reads it (see
        :class:`actors.model.PushStreamingModel`): ``push`` is called from the loop's read
        callback with the chunks of one pass of the child's loop. Raises
        :class:`~actors.model.ModelError` for every failure."""
        channel = await self._started()
        rid, done = channel.open(request, push)
        try:
            # Shielded: a cancel of this task would cancel the future it awaits, and the
            # wait below for the child's end would then end at once.
            await asyncio.shield(done)
        except asyncio.CancelledError:
            channel.cancel(rid)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(done, _CANCEL_WAIT_S)
            raise

    def stream_batches(self, request: ModelRequest) -> AsyncIterator[list[StreamChunk]]:
        return batches_pushed(self.stream_into, request)

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return chunks_of(self.stream_batches(request))

    async def aclose(self) -> None:
        """End the running loop's child (its requests fail with ``TRANSPORT``). Idempotent."""
        loop = asyncio.get_running_loop()
        with self._lock:
            channel = self._channels.pop(loop, None)
            reaping = [f for f in self._reaping if f.get_loop() is loop]
        if channel is not None:
            await channel.close()
        if reaping:  # a child that died on its own: its reap ends before this returns
            await asyncio.gather(*reaping, return_exceptions=True)
