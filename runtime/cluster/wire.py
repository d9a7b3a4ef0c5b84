"""The verbs a driver sends a shard over its direct connection, and how they are framed.

Ray places and restarts shards; a verb does not go through it (a Ray actor call costs
~1 ms here, a round trip on the shard's own TCP connection a few hundred us). Each frame
is a 4-byte big-endian length and a msgpack body: a :class:`Request` (an id the driver
picks, and one verb of the :data:`Verb` union) one way, a :class:`Response` (the
request's id, its value or its error, pickled as Ray pickles them: a ``list[Event]``
holds plugin data, an error is any exception) the other. Answers come in any order
and are matched by id.

Which verbs are safe to send again after the connection broke (the shard's process
died with it in flight) is :data:`RESENT`'s business: a send carries its ``MessageId``
(the shard applies it once), reads and waits are idempotent; an inbox edit is not, and
fails with :class:`~runtime.cluster.errors.VerbInterruptedError`.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Final, Literal, TypeAlias

import msgspec

from runtime import HookCause, ParentCause, UserCause, UserMessage

__all__ = [
    "ORDERED_VERBS",
    "RESENT",
    "Cancel",
    "Clear",
    "Events",
    "FrameReader",
    "Inbox",
    "Messages",
    "Passivate",
    "Remove",
    "Replace",
    "Request",
    "Response",
    "Send",
    "SendMany",
    "Splice",
    "Status",
    "Verb",
    "WaitIdle",
    "dump_value",
    "load_value",
    "write_frame",
]


class Send(msgspec.Struct, frozen=True):
    """One ``followup`` / ``steer`` / ``inject`` (its id chosen by the driver)."""

    agent: str
    message: str | UserMessage
    id: str
    lane: Literal["next-turn", "next-step"]
    wake: bool
    source: str = "user"


class _Verb(msgspec.Struct, frozen=True, tag_field="verb"):
    pass


class SendMany(_Verb, tag="send", frozen=True):
    """``followup`` / ``steer`` / ``inject`` each send; one outcome each."""

    sends: list[Send]
    retry: bool = False  # sent again after a broken connection: a logged id was done


class Status(_Verb, tag="status", frozen=True):
    agent: str


class Events(_Verb, tag="events", frozen=True):
    agent: str
    lower: int = 0
    upper: int | None = None


class Messages(_Verb, tag="messages", frozen=True):
    agent: str


class Inbox(_Verb, tag="inbox", frozen=True):
    agent: str


class WaitIdle(_Verb, tag="wait_idle", frozen=True):
    agents: list[str] | None  # None: every agent of the shard
    timeout: float | None


class Cancel(_Verb, tag="cancel", frozen=True):
    agent: str
    cause: UserCause | ParentCause | HookCause | None
    keep_inbox: bool


class Remove(_Verb, tag="remove", frozen=True):
    agent: str
    message_id: str
    timeout: float | None


class Replace(_Verb, tag="replace", frozen=True):
    agent: str
    message_id: str
    message: str | UserMessage
    timeout: float | None


class Splice(_Verb, tag="splice", frozen=True):
    agent: str
    lane: Literal["next-turn", "next-step"]
    start: int
    removed_count: int
    messages: list[str | UserMessage]
    timeout: float | None


class Clear(_Verb, tag="clear", frozen=True):
    agent: str
    timeout: float | None


class Passivate(_Verb, tag="passivate", frozen=True):
    agent: str
    timeout: float | None


Verb: TypeAlias = (
    SendMany
    | Status
    | Events
    | Messages
    | Inbox
    | WaitIdle
    | Cancel
    | Remove
    | Replace
    | Splice
    | Clear
    | Passivate
)

ORDERED_VERBS: Final = (SendMany, Cancel, Remove, Replace, Splice, Clear, Passivate)
"""Verbs the shard applies on the connection's reader, one after the other, in the order
they were sent (an agent's sends and edits keep their order); the others (reads, waits)
run on a pool beside them."""

RESENT: Final = (SendMany, Status, Events, Messages, Inbox, WaitIdle, Cancel, Clear, Passivate)
"""Verbs sent again on the new connection when the old one broke with them in flight. A
``SendMany`` is resent with ``retry=True`` (a send whose id its agent's log has is
done); a cancel, clear or passivation applied twice leaves what one leaves."""


class Request(msgspec.Struct, frozen=True, array_like=True):
    id: int
    verb: Verb


class Response(msgspec.Struct, frozen=True, array_like=True):
    id: int
    failed: bool  # body is the pickled exception
    body: bytes


_request_encoder: Final = msgspec.msgpack.Encoder()
_request_decoder: Final = msgspec.msgpack.Decoder(Request)
_response_decoder: Final = msgspec.msgpack.Decoder(Response)
_LENGTH: Final = struct.Struct(">I")
MAX_FRAME: Final = 1 << 30


def encode_request(request: Request) -> bytes:
    return _request_encoder.encode(request)


def decode_request(body: bytes) -> Request:
    return _request_decoder.decode(body)


def encode_response(response: Response) -> bytes:
    return _request_encoder.encode(response)


def decode_response(body: bytes) -> Response:
    return _response_decoder.decode(body)


def dump_value(value: object) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def load_value(body: bytes) -> object:
    return pickle.loads(body)  # noqa: S301 - from the cluster's own shard


def write_frame(sock: socket.socket, *bodies: bytes) -> None:
    """Write each body as one frame, in one ``sendall``."""
    sock.sendall(b"".join(_LENGTH.pack(len(body)) + body for body in bodies))


class FrameReader:
    """Reads frames off one socket, buffered (one ``recv`` may hold many frames)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()

    def read(self) -> bytes | None:
        """The next frame's body; None once the peer closed the connection."""
        while True:
            if len(self._buffer) >= _LENGTH.size:
                (size,) = _LENGTH.unpack_from(self._buffer)
                if size > MAX_FRAME:
                    raise ConnectionError(f"a frame of {size} bytes: not a corral shard peer")
                end = _LENGTH.size + size
                if len(self._buffer) >= end:
                    body = bytes(self._buffer[_LENGTH.size : end])
                    del self._buffer[:end]
                    return body
            chunk = self._sock.recv(1 << 18)
            if not chunk:
                return None
            self._buffer += chunk
