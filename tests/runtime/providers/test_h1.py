"""corral's own HTTP/1.1 client (runtime.providers.h1) against real loopback servers.

The vendor tests (test_openai_compat, test_anthropic_messages, test_failures, ...) stream
through it already; these check what they do not reach: the body framings, keep-alive
reuse and a connection the server closed, content encodings, redirects, a malformed
answer, TLS, and the choice of aiohttp behind a proxy.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trustme

from actors.errors import ModelError
from runtime.providers import OpenAICompatModel
from runtime.providers.h1 import H1Client, make_client
from runtime.providers.http import READ_SIZE, HttpStatusError, WireClient

from .support import collect, request, run, text_of, user
from .wire_formats import openai_frames, openai_text_reply
from .wire_server import Sse, WireServer

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    """The request line and body of one request (its body by Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return lines[0], await reader.readexactly(length)


def sse_stream(text: str) -> bytes:
    """An OpenAI reply saying ``text``, as one event-stream body."""
    return b"".join(openai_frames(openai_text_reply(text)))


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def serve(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> asyncio.Server:
    """A server on loopback running ``handler`` for each connection, then closing it."""

    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except ConnectionError:
            pass  # the client went away mid-answer
        finally:
            writer.transport.abort()

    return await asyncio.start_server(closing, "127.0.0.1", 0, ssl=ssl_context)


def port_of(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


async def reply_from(handler: Handler) -> list[Any]:
    """The chunks of one OpenAI request answered by ``handler`` (its ModelError raised)."""
    server = await serve(handler)
    try:
        url = f"http://127.0.0.1:{port_of(server)}/v1"
        async with OpenAICompatModel("m", base_url=url) as model:
            return await collect(model, request())
    finally:
        server.close()


async def body_of(client: H1Client, path: str = "/x") -> tuple[int, bytes]:
    async with client.stream(path, b"{}") as response:
        return response.status, b"".join([piece async for piece in response.aiter_bytes()])


def test_close_delimited_and_content_length_bodies_are_read_whole() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _ = await read_request(reader)
        if line.startswith("POST /length"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello")
            await writer.drain()
            writer.write(b" world")
        else:  # no length, no chunks: the body ends when the server closes
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil ")
            await writer.drain()
            writer.write(b"close")
        await writer.drain()
        writer.close()

    async def body() -> None:
        server = await serve(handler)
        client = H1Client(f"http://127.0.0.1:{port_of(server)}", {}, timeout=10)
        try:
            assert await body_of(client, "/length") == (200, b"hello world")
            assert await body_of(client, "/close") == (200, b"until close")
        finally:
            await client.close()
            server.close()

    run(body)


def test_sequential_streams_reuse_one_keep_alive_connection(wire: WireServer) -> None:
    wire.default = Sse(openai_frames(openai_text_reply("hi")))

    async def body() -> None:
        async with OpenAICompatModel("m", base_url=wire.url) as model:
            for _ in range(3):
                assert text_of(await collect(model, request())) == "hi"

    run(body)
    assert len(wire.requests) == 3
    assert len({r.peer for r in wire.requests}) == 1  # one connection, three requests


def test_concurrent_streams_share_one_read_buffer_and_each_reads_its_own_reply(
    wire: WireServer,
) -> None:
    # A client's connections read into one buffer (a read is copied out before the loop
    # reads another socket): 20 streams whose replies, frame by frame, interleave on the
    # wire each get exactly their own text.
    def reply(recorded: Any) -> Sse:
        tag = recorded.body["messages"][-1]["content"]
        return Sse(openai_frames(openai_text_reply(*(f"{tag}.{i} " for i in range(30)))))

    wire.default = reply

    async def body() -> list[str]:
        async with OpenAICompatModel("m", base_url=wire.url) as model:
            texts = await asyncio.gather(
                *(collect(model, request(user(f"s{n}"))) for n in range(20))
            )
            client = model._client()
            assert isinstance(client, H1Client)
            connections = list(client._open)
            assert len(connections) == 20
            assert all(c._buffer is client._read_buffer for c in connections)
            return [text_of(chunks) for chunks in texts]

    texts = run(body)
    assert texts == ["".join(f"s{n}.{i} " for i in range(30)) for n in range(20)]
    assert len({r.peer for r in wire.requests}) == 20


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    peers: list[Any] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        peers.append(writer.get_extra_info("peername"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # keep-alive said nothing: the server closes the idle connection

    async def body() -> None:
        server = await serve(handler)
        client = H1Client(f"http://127.0.0.1:{port_of(server)}", {}, timeout=10)
        try:
            assert await body_of(client) == (200, b"ok")
            (idle,) = [c for pool in client._idle.values() for c in pool]
            await asyncio.wait_for(idle.closed, 10)  # the client saw the server close it
            assert await body_of(client) == (200, b"ok")
        finally:
            await client.close()
            server.close()
        assert len(peers) == 2 and peers[0] != peers[1]

    run(body)


def test_a_gzip_encoded_event_stream_is_decoded() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        packed = gzip.compress(sse_stream("squeezed"))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked(packed[:7], packed[7:])
        )
        await writer.drain()
        await reader.read()

    async def body() -> None:
        assert text_of(await reply_from(handler)) == "squeezed"

    run(body)


def test_a_same_origin_307_is_followed_with_the_body_and_another_host_is_not() -> None:
    seen: list[tuple[str, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                line, data = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            seen.append((line, data))
            if line.startswith("POST /v1/chat/completions"):
                where = "/v2/chat/completions" if data != b"elsewhere" else "http://127.0.0.2:1/x"
                writer.write(
                    f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {where}\r\n"
                    "Content-Length: 0\r\n\r\n".encode()
                )
            else:
                stream = sse_stream("moved")
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(stream), stream)
                )
            await writer.drain()

    async def body() -> None:
        server = await serve(handler)
        url = f"http://127.0.0.1:{port_of(server)}/v1"
        try:
            async with OpenAICompatModel("m", base_url=url) as model:
                assert text_of(await collect(model, request())) == "moved"
            client = H1Client(url, {}, timeout=10)
            try:
                with pytest.raises(HttpStatusError) as raised:
                    async with client.stream("/chat/completions", b"elsewhere"):
                        pass
                assert raised.value.status_code == 307  # a key never follows to 127.0.0.2
            finally:
                await client.close()
        finally:
            server.close()

    run(body)
    lines = [line.split(" ")[1] for line, _ in seen]
    assert lines == ["/v1/chat/completions", "/v2/chat/completions", "/v1/chat/completions"]
    assert json.loads(seen[1][1]) == json.loads(seen[0][1])  # the same body, sent again


@pytest.mark.parametrize(
    "answer",
    [
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n",
    ],
    ids=["not-http", "bad-chunk-size", "bad-length"],
)
def test_a_malformed_answer_is_a_transport_failure(answer: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        await reader.read()

    async def body() -> None:
        with pytest.raises(ModelError) as raised:
            await reply_from(handler)
        assert raised.value.failure.code == "TRANSPORT"

    run(body)


def test_a_stream_over_tls_is_verified_against_the_system_trust_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(server_context)
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        stream = sse_stream("sealed")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunked(stream[:20], stream[20:])
        )
        await writer.drain()
        await reader.read()

    async def stream_from(port: int) -> str:
        url = f"https://127.0.0.1:{port}/v1"
        async with OpenAICompatModel("m", base_url=url) as model:
            return text_of(await collect(model, request()))

    async def body() -> None:
        server = await serve(handler, server_context)
        try:
            port = port_of(server)
            with pytest.raises(ModelError) as untrusted:  # the system's store: not this CA
                await stream_from(port)
            assert untrusted.value.failure.code == "TRANSPORT"
            monkeypatch.setenv("SSL_CERT_FILE", str(bundle))  # OpenSSL's default paths
            assert await stream_from(port) == "sealed"
        finally:
            server.close()

    run(body)


def test_a_proxy_from_the_environment_sends_requests_through_aiohttp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def body() -> None:
        for name in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        direct = make_client("http://127.0.0.1:9/v1", {}, 5)
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
        proxied = make_client("http://10.0.0.1:9/v1", {}, 5)
        monkeypatch.setenv("NO_PROXY", "10.0.0.1")
        bypassed = make_client("http://10.0.0.1:9/v1", {}, 5)
        assert isinstance(direct, H1Client) and isinstance(bypassed, H1Client)
        assert isinstance(proxied, WireClient)
        for client in (direct, proxied, bypassed):
            await client.close()

    run(body)


def test_a_header_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="line break"):
        H1Client("http://127.0.0.1:9", {"x-team": "a\r\nx-injected: 1"}, timeout=5)


def test_a_request_that_left_early_never_touches_the_next_request_on_its_connection() -> None:
    # Request A stops reading at its second piece; the body's end comes in the same read,
    # so its connection goes back to the pool before A's block is left, and request B
    # takes it. A's block, left while B streams, must leave B's connection alone (it
    # closed it once: a retried, doubled request under load).
    a_pushing, b_may_end = asyncio.Event(), asyncio.Event()
    peers: list[Any] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername"))
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
        await read_request(reader)
        writer.write(head + b"2\r\na1\r\n")
        await a_pushing.wait()
        writer.write(b"2\r\na2\r\n0\r\n\r\n")  # A's last piece and its end, at once
        await read_request(reader)
        writer.write(head + b"2\r\nb1\r\n")
        await writer.drain()
        await b_may_end.wait()
        writer.write(b"2\r\nb2\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    def sink(piece: bytes) -> bool:
        if piece == b"a1":
            a_pushing.set()
            return False
        return True  # stop at a2

    async def body() -> None:
        server = await serve(handler)
        client = H1Client(f"http://127.0.0.1:{port_of(server)}", {}, timeout=10)
        a_stopped, a_may_leave = asyncio.Event(), asyncio.Event()

        async def request_a() -> None:
            async with client.stream("/a", b"{}") as a:
                assert await a.body.push_into(sink) is False
                a_stopped.set()
                await a_may_leave.wait()

        async def pooled() -> None:
            while not any(client._idle.values()):  # the drain's end: back in the pool
                await asyncio.sleep(0)

        try:
            task = asyncio.ensure_future(request_a())
            await asyncio.wait_for(a_stopped.wait(), 10)
            await asyncio.wait_for(pooled(), 10)
            async with client.stream("/b", b"{}") as b:
                pieces = [await b.body.__anext__()]
                a_may_leave.set()
                await asyncio.wait_for(task, 10)  # A's block left while B streams
                b_may_end.set()
                pieces += [piece async for piece in b.body]
            assert b"".join(pieces) == b"b1b2"
        finally:
            await client.close()
            server.close()
        assert len(peers) == 1  # B ran on A's connection, and nothing reconnected

    run(body)


class _Transport(asyncio.Transport):
    """Where a parser test's connection writes (nothing reads it): the bytes of the
    answer are fed to the protocol as asyncio would, through its buffer."""

    def write(self, data: Any) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def test_a_chunked_answer_reads_the_same_however_its_bytes_are_split_into_reads() -> None:
    from runtime.providers.h1_connection import Connection

    pieces = [b"data: one\n\n", b"data: t", b"wo\n\n", b"x" * 300]
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces[:2])
        + b"%x;name=value\r\n%s\r\n" % (len(pieces[2]), pieces[2])  # an extension
        + b"%X\r\n%s\r\n" % (len(pieces[3]), pieces[3])
        + b"0\r\nx-trailer: 1\r\n\r\n"
    )

    async def read(reads: list[bytes]) -> bytes:
        loop = asyncio.get_running_loop()
        connection = Connection(loop, 10, [], set(), memoryview(bytearray(READ_SIZE)))
        connection.connection_made(_Transport())
        answer = asyncio.ensure_future(connection.request(b"", b""))
        await asyncio.sleep(0)  # the request is sent: the answer may come
        for data in reads:
            connection._buffer[: len(data)] = data
            connection.buffer_updated(len(data))
        response = await answer
        return b"".join([piece async for piece in response.body])

    async def body() -> None:
        whole = b"".join(pieces)
        assert await read([raw]) == whole
        assert await read([raw[i : i + 1] for i in range(len(raw))]) == whole
        for cut in range(1, len(raw)):
            assert await read([raw[:cut], raw[cut:]]) == whole, cut

    run(body)


def test_a_mislabelled_stream_that_stalls_after_its_last_event_ends_at_that_event() -> None:
    # A stream sent as text/plain is read pulled (its first bytes told what it is); after
    # its [DONE] the rest is drained briefly, as always: a server that then sends
    # nothing more (no final chunk) does not hold the reply until the read timeout.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        stream = sse_stream("labelled wrong")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n" % (len(stream), stream)
        )
        await writer.drain()
        await reader.read()  # no final chunk: it stalls until the client leaves

    async def body() -> None:
        server = await serve(handler)
        url = f"http://127.0.0.1:{port_of(server)}/v1"
        try:
            async with OpenAICompatModel("m", base_url=url, timeout=60) as model:
                chunks = await asyncio.wait_for(collect(model, request()), 10)
            assert text_of(chunks) == "labelled wrong"
        finally:
            server.close()

    run(body)
