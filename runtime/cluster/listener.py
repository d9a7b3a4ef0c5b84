"""The shard's end of the verb connections: a TCP listener on its node.

The shard opens it at start (port 0: the kernel picks one) and returns ``host:port``
(``host`` its node's address) through Ray (:meth:`Shard.address`); a driver connects
once (over loopback when it runs on the same node) and keeps the connection.
Each connection has a reader thread that applies the :data:`~runtime.cluster.wire.ORDERED_VERBS`
itself, one after the other in the order they arrived (TCP keeps the order the driver
wrote them in), and hands the others (reads, waits that may block for seconds) to a
small pool. Answers are written as they are ready, under the connection's write lock.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .wire import (
    ORDERED_VERBS,
    FrameReader,
    Request,
    Response,
    Verb,
    decode_request,
    dump_value,
    encode_response,
    write_frame,
)

__all__ = ["VerbListener"]

log = logging.getLogger("corral.cluster")

_POOL_THREADS = 8


class VerbListener:
    """Serves ``apply(verb)`` to every connection on ``host`` (see the module doc)."""

    def __init__(self, host: str, apply: Callable[[Verb], object], name: str) -> None:
        self._apply = apply
        self._name = name
        # every interface (as Ray's own worker ports): a driver on this node connects
        # over loopback, one elsewhere at ``host``
        self._server = socket.create_server(("0.0.0.0", 0), backlog=64)  # noqa: S104
        self.address = f"{host}:{self._server.getsockname()[1]}"
        self._pool = ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix=f"{name}-verbs")
        self._closed = False
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"{name}-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return  # closed
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    sock.close()
                    return
                self._connections.append(sock)
            threading.Thread(
                target=self._serve, args=(sock,), name=f"{self._name}-conn", daemon=True
            ).start()

    def _serve(self, sock: socket.socket) -> None:
        reader = FrameReader(sock)
        write_lock = threading.Lock()

        def answer(request_id: int, verb: Verb) -> None:
            try:
                response = Response(request_id, False, dump_value(self._apply(verb)))
            except Exception as err:  # noqa: BLE001 - the caller's error, sent back to it
                response = Response(request_id, True, dump_value(err))
            body = encode_response(response)
            with write_lock, contextlib.suppress(OSError):  # (a driver gone waits for none)
                write_frame(sock, body)

        try:
            while True:
                body = reader.read()
                if body is None:
                    return
                request: Request = decode_request(body)
                if isinstance(request.verb, ORDERED_VERBS):
                    answer(request.id, request.verb)
                else:
                    self._pool.submit(answer, request.id, request.verb)
        except (OSError, ConnectionError):
            return
        except Exception:  # a frame that is not a request: drop the connection
            log.exception("%s: a bad frame; closing its connection", self._name)
        finally:
            with self._lock:
                if sock in self._connections:
                    self._connections.remove(sock)
            sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, []
        self._server.close()
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
