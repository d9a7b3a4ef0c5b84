"""``runtime.acp.serve`` on a runtime of the test's own, the SDK's client over a real
socket pair: what needs the runtime's hand (an agent that crashes mid-turn)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from acp import PROTOCOL_VERSION, RequestError, text_block
from acp.client.connection import ClientSideConnection

from runtime import Runtime
from runtime.acp import serve
from tests.acp.factories import SlowModel
from tests.acp.test_acp_server import TIMEOUT, Client, logged


def test_a_crash_mid_turn_answers_the_prompt_with_an_error_and_load_goes_on(
    tmp_path: Path,
) -> None:
    client = Client()
    rt = Runtime.open(tmp_path / "store")

    async def main() -> None:
        ours, theirs = socket.socketpair()
        server_reader, server_writer = await asyncio.open_connection(sock=ours)
        client_reader, client_writer = await asyncio.open_connection(sock=theirs)
        server = asyncio.ensure_future(
            serve(rt, model=SlowModel, streams=(server_writer, server_reader))
        )
        conn = ClientSideConnection(client, client_writer, client_reader)
        try:
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("essay")]))
            await asyncio.wait_for(client.chunk.wait(), TIMEOUT)
            rt.get(sid).kill("injected")
            with pytest.raises(RequestError) as crashed:
                await asyncio.wait_for(prompt, TIMEOUT)
            assert "crashed" in crashed.value.data["details"]
            assert "session/load" in crashed.value.data["details"]
            await conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
            answer = await conn.prompt(session_id=sid, prompt=[text_block("quick, again")])
            assert answer.stop_reason == "end_turn"
        finally:
            await conn.close()
            client_writer.close()
            await client_writer.wait_closed()
            await asyncio.wait_for(server, TIMEOUT)  # the client's end ends the server
            server_writer.close()
            await server_writer.wait_closed()

    try:
        asyncio.run(asyncio.wait_for(main(), 4 * TIMEOUT))
    finally:
        rt.close()
    ends = [e.data.reason.kind for e in logged(tmp_path, sid_of(client)) if e.type == "turn/end"]
    assert ends == ["interrupted", "completed"]  # the crashed turn, repaired by the load


def sid_of(client: Client) -> str:
    [sid] = {sid for sid, _ in client.updates}
    return sid
