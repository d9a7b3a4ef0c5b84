"""The driver's direct connection to one shard: pipelined requests, answers by id.

One TCP connection per shard, opened on first use at the address the shard gives
through Ray (:meth:`ShardLink.call` of ``address``, which waits for a restarting shard).
Any thread may :meth:`submit` a verb at any time: it is written at once (TCP keeps the
order of the writes, so the shard applies an agent's sends in the order they were
made) and its :class:`Pending` answer is matched by id when the reader thread reads it.

When the connection breaks (the shard's process died), the reader asks Ray for the
restarted shard's new address, connects and writes again, in their first order, the
requests still unanswered that are safe to repeat (:data:`~runtime.cluster.wire.RESENT`:
a send again with ``retry=True``); the others fail with
:class:`~runtime.cluster.errors.VerbInterruptedError`. A request unanswered when
``verb_timeout`` passed without a shard to reconnect to fails with
:class:`~runtime.cluster.errors.ShardUnavailableError`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from .errors import ClusterClosedError, ShardUnavailableError, VerbInterruptedError
from .wire import (
    RESENT,
    FrameReader,
    Request,
    SendMany,
    Verb,
    decode_response,
    encode_request,
    load_value,
    write_frame,
)

if TYPE_CHECKING:
    from .transport import ShardLink

__all__ = ["Pending", "ShardConnection"]

log = logging.getLogger("corral.cluster")

_CALLBACKS = threading.Lock()  # every Pending's callback list (held for an append or a swap)


class Pending:
    """One request's answer, once the shard sent it."""

    __slots__ = ("_callbacks", "_done", "_failed", "_value", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self._done = threading.Event()
        self._value: Any = None
        self._failed = False
        self._callbacks: list[Callable[[Pending], None]] | None = []

    def resolve(self, value: Any, failed: bool) -> None:
        self._value, self._failed = value, failed
        with _CALLBACKS:
            callbacks, self._callbacks = self._callbacks, None
        self._done.set()
        for callback in callbacks or ():
            callback(self)

    def then(self, callback: Callable[[Pending], None]) -> None:
        """Call ``callback(self)`` once answered (at once if it is), on the thread that
        resolves it (the connection's reader): keep it short."""
        with _CALLBACKS:
            if self._callbacks is not None:
                self._callbacks.append(callback)
                return
        callback(self)

    def outcome(self) -> tuple[Any, bool]:
        """(value or error, whether it failed) of an answered request."""
        return self._value, self._failed

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Any:
        """The verb's value; raises its error (the shard's, or the connection's)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"no answer to {type(self.request.verb).__name__} in {timeout} s")
        if self._failed:
            raise self._value
        return self._value


class ShardConnection:
    """The connection to shard ``link.index`` (see the module doc)."""

    def __init__(self, link: ShardLink) -> None:
        self._link = link
        self.index = link.index
        self._lock = threading.Lock()  # the socket, the ids, the pending table
        self._sock: socket.socket | None = None
        self._next_id = 1
        self._pending: dict[int, Pending] = {}
        self._closed = False
        self._ready = threading.Event()  # a connected socket is there
        self.reconnects = 0
        self._connect()
        self._thread = threading.Thread(
            target=self._read_loop, name=f"corral-verbs-{self.index}", daemon=True
        )
        self._thread.start()

    def submit(self, verb: Verb) -> Pending:
        """Write ``verb`` now; its answer comes in the returned :class:`Pending`."""
        with self._lock:
            if self._closed:
                raise ClusterClosedError
            request = Request(self._next_id, verb)
            self._next_id += 1
            pending = self._pending[request.id] = Pending(request)
            sock = self._sock
            if sock is not None:
                try:
                    write_frame(sock, encode_request(request))
                except OSError:
                    self._broken(sock)  # the reader reconnects and writes it again
        return pending

    # ------------------------------------------------------------------ the reader

    def _open_socket(self) -> socket.socket:
        """A socket connected to the shard's current address (asked through Ray, which
        waits for a restarted process up to ``verb_timeout``)."""
        address: str = self._link.call("address")
        host, _, port = address.rpartition(":")
        if host == self._link.local_host:
            host = "127.0.0.1"  # a shard on the driver's own node
        sock = socket.create_connection((host, int(port)), timeout=self._link.verb_timeout)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return sock

    def _connect(self) -> None:
        sock = self._open_socket()
        with self._lock:
            self._sock = sock
            self._ready.set()

    def _broken(self, sock: socket.socket) -> None:
        """(under the lock) ``sock`` failed: drop it; the reader reconnects."""
        if self._sock is sock:
            self._sock = None
            self._ready.clear()
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reader's recv

    def _read_loop(self) -> None:
        while True:
            self._ready.wait()
            with self._lock:
                sock = self._sock
                if self._closed:
                    return
            if sock is None:
                continue
            reader = FrameReader(sock)
            try:
                while True:
                    body = reader.read()
                    if body is None:
                        break
                    self._resolve(body)
            except (OSError, ConnectionError):
                pass
            with self._lock:
                if self._closed:
                    return
                self._broken(sock)
            sock.close()
            self._reconnect()

    def _resolve(self, body: bytes) -> None:
        response = decode_response(body)
        with self._lock:
            pending = self._pending.pop(response.id, None)
        if pending is None:
            return  # answered before (a request written twice)
        try:
            value = load_value(response.body)
        except Exception as err:  # noqa: BLE001 - the caller gets it
            pending.resolve(err, True)
            return
        pending.resolve(value, response.failed)

    def _reconnect(self) -> None:
        """Reconnect, then write again what is owed (see the module doc)."""
        self.reconnects += 1
        self._link.restarts_seen += 1
        while True:
            try:
                sock = self._open_socket()
                break
            except (ShardUnavailableError, OSError) as err:
                with self._lock:
                    if self._closed:
                        return
                    owed = list(self._pending.values())
                    self._pending.clear()
                for pending in owed:
                    pending.resolve(
                        ShardUnavailableError(
                            f"shard {self.index} did not come back within "
                            f"{self._link.verb_timeout} s ({err}); check the Ray cluster's "
                            "nodes, or reopen the cluster"
                        ),
                        True,
                    )
                if isinstance(err, OSError):
                    time.sleep(0.05)  # the address answered, the port did not: again
        with self._lock:  # no submit between the new socket and what is written again
            if self._closed:
                sock.close()
                return
            owed = [self._pending[k] for k in sorted(self._pending)]
            frames = []
            for pending in owed:
                verb = pending.request.verb
                if isinstance(verb, RESENT):
                    if isinstance(verb, SendMany):
                        verb = msgspec.structs.replace(verb, retry=True)
                    frames.append(encode_request(Request(pending.request.id, verb)))
                else:
                    del self._pending[pending.request.id]
                    pending.resolve(
                        VerbInterruptedError(
                            f"shard {self.index}'s process died with the "
                            f"{type(verb).__name__.lower()} edit in flight: it may or may not "
                            "have been applied; read the agent's inbox (agent.inbox()) "
                            "and edit again"
                        ),
                        True,
                    )
            self._sock = sock
            self._ready.set()
            if frames:
                try:
                    write_frame(sock, *frames)
                except OSError:
                    self._broken(sock)
        log.info("shard %d: reconnected, %d requests written again", self.index, len(frames))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
            owed = list(self._pending.values())
            self._pending.clear()
            self._ready.set()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for pending in owed:
            pending.resolve(ClusterClosedError(), True)
        self._thread.join(timeout=5)
