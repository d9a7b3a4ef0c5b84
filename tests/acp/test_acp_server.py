"""``corral acp`` end to end: the ACP SDK's client side drives it as a real subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    DeniedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    UserMessageChunk,
)

from runtime.acp import PERMISSION, PermissionDecision
from runtime.hooks import HOOK_RUN, HookRun
from storage import Event, Store, assert_invariants

TIMEOUT = 60.0
ROOT = Path(__file__).resolve().parents[2]  # the tree under test, for the server's imports
FACTORIES = "tests.acp.factories"


class Client:
    """An ACP client that records every update and answers permission requests from a
    script (``answers``: option ids, or None for a request left pending until the
    turn is cancelled: then the ``cancelled`` outcome, as ACP requires)."""

    def __init__(self, answers: list[str | None] | None = None) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.answers = list(answers or [])
        self.asked: list[tuple[ToolCallUpdate, list[str]]] = []
        self.chunk = asyncio.Event()
        self.permission = asyncio.Event()
        self.release = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        if isinstance(update, AgentMessageChunk):
            self.chunk.set()

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.asked.append((tool_call, [o.option_id for o in options]))
        self.permission.set()
        answer = self.answers.pop(0)
        if answer is None:
            await self.release.wait()
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=answer))

    def of(self, kind: type) -> list[Any]:
        return [u for _, u in self.updates if isinstance(u, kind)]

    def text(self) -> str:
        return "".join(u.content.text for u in self.of(AgentMessageChunk))


@asynccontextmanager
async def corral_acp(
    tmp_path: Path, client: Client, *args: str
) -> AsyncIterator[tuple[ClientSideConnection, asyncio.subprocess.Process]]:
    stderr = (tmp_path / "acp-stderr.log").open("ab")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    command = ["-m", "runtime.cli", "acp", "--store", str(tmp_path / "store"), *args]
    try:
        async with spawn_agent_process(
            client,
            sys.executable,
            *command,
            env=env,
            cwd=tmp_path,
            transport_kwargs={"stderr": stderr.fileno(), "shutdown_timeout": TIMEOUT},
        ) as (conn, process):
            init = await asyncio.wait_for(conn.initialize(protocol_version=PROTOCOL_VERSION), TIMEOUT)
            assert init.agent_capabilities is not None and init.agent_capabilities.load_session
            yield conn, process
    finally:
        stderr.close()


def run(main: Callable[[], Any]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 4 * TIMEOUT))


def logged(tmp_path: Path, session_id: str) -> list[Event]:
    with Store.open(tmp_path / "store", readonly=True) as store:
        store.register_event_type(PERMISSION, PermissionDecision, ignorable=True)
        store.register_event_type(HOOK_RUN, HookRun, ignorable=True)
        events = store.read(session_id)
    assert_invariants(events)
    return events


def test_a_prompt_streams_its_turn_and_answers_with_its_stop_reason(tmp_path: Path) -> None:
    client = Client()

    async def main() -> tuple[str, list[str]]:
        model = f"{FACTORIES}:echo_or_fail"
        async with corral_acp(tmp_path, client, "--model", model) as (conn, _):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            first = await conn.prompt(session_id=sid, prompt=[text_block("hello there")])
            with pytest.raises(RequestError) as failed:  # ACP has no stop reason for an error
                await conn.prompt(session_id=sid, prompt=[text_block("now fail")])
            assert failed.value.data["code"] == "AUTH"
            assert failed.value.data["details"] == "the key was refused"
            second = await conn.prompt(session_id=sid, prompt=[text_block("again")])
            return sid, [first.stop_reason, second.stop_reason]

    session_id, reasons = run(main)
    assert reasons == ["end_turn", "end_turn"]
    assert client.text() == "hello thereagain"
    assert len(client.of(AgentMessageChunk)) == 6  # streamed: three chunks a reply
    assert {sid for sid, _ in client.updates} == {session_id}
    turns = [e.data.turn for e in logged(tmp_path, session_id) if e.type == "turn/end"]
    assert turns == [1, 2, 3]


def test_a_tool_that_needs_permission_asks_the_client_and_the_answer_is_a_durable_fact(
    tmp_path: Path,
) -> None:
    client = Client(answers=["allow_once", "reject_always"])
    args = ("--model", f"{FACTORIES}:note_taker", "--tools", f"{FACTORIES}:TOOLS")

    async def main() -> str:
        async with corral_acp(tmp_path, client, *args) as (conn, _):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            for prompt in ("first", "second", "third"):  # third: rejected by the "always"
                answer = await conn.prompt(session_id=sid, prompt=[text_block(prompt)])
                assert answer.stop_reason == "end_turn"
            return sid

    sid = run(main)
    assert (tmp_path / "notes.txt").read_text() == "first\n"
    assert len(client.asked) == 2  # the third call was decided by "reject always"
    tool_call, options = client.asked[0]
    assert options == ["allow_once", "allow_always", "reject_once", "reject_always"]
    assert tool_call.raw_input == {"text": "first"}
    starts = client.of(ToolCallStart)
    assert [s.title for s in starts] == ["write_note"] * 3
    assert [p.status for p in client.of(ToolCallProgress)] == ["completed", "failed", "failed"]
    assert [s.tool_call_id for s in starts] == [p.tool_call_id for p in client.of(ToolCallProgress)]
    decisions = [e.data for e in logged(tmp_path, sid) if e.type == PERMISSION]
    assert [(d.outcome, d.option, d.always, d.remembered) for d in decisions] == [
        ("allow", "allow_once", False, False),
        ("reject", "reject_always", True, False),
        ("reject", None, True, True),
    ]
    assert [d.call_id for d in decisions] == [s.tool_call_id for s in starts]


def test_cancel_mid_stream_answers_cancelled_and_a_pending_permission_is_refused(
    tmp_path: Path,
) -> None:
    client = Client()

    async def main() -> tuple[str, str, int]:
        async with corral_acp(tmp_path, client, "--model", f"{FACTORIES}:slow") as (conn, _):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            running = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("write an essay")]))
            await asyncio.wait_for(client.chunk.wait(), TIMEOUT)
            queued = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("quick one")]))
            await asyncio.sleep(0)  # both prompts are sent before the cancel
            await conn.cancel(session_id=sid)
            first, second = await asyncio.wait_for(asyncio.gather(running, queued), TIMEOUT)
            chunks = len(client.of(AgentMessageChunk))
            after = await conn.prompt(session_id=sid, prompt=[text_block("quick again")])
            assert after.stop_reason == "end_turn"
            return sid, f"{first.stop_reason},{second.stop_reason}", chunks

    sid, reasons, chunks = run(main)
    assert reasons == "cancelled,cancelled"
    assert 1 <= chunks < 500  # cut short mid-stream
    events = logged(tmp_path, sid)
    ends = [e.data.reason.kind for e in events if e.type == "turn/end"]
    assert ends == ["aborted", "completed"]  # the queued prompt never ran: discarded
    [interrupted] = [e.data for e in events if e.type == "assistant/message" and e.data.interrupted]
    assert client.text().startswith(interrupted.message.content[0].text)
    assert client.text().endswith("echo: quick again")


def test_load_after_the_process_was_killed_replays_the_history_and_goes_on(
    tmp_path: Path,
) -> None:
    first = Client()

    async def before_kill() -> str:
        async with corral_acp(tmp_path, first, "--model", f"{FACTORIES}:slow") as (conn, process):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            done = await conn.prompt(session_id=sid, prompt=[text_block("quick hello")])
            assert done.stop_reason == "end_turn"
            first.chunk.clear()
            story = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("a long story")]))
            await asyncio.wait_for(first.chunk.wait(), TIMEOUT)  # the second turn runs
            process.send_signal(signal.SIGKILL)
            await process.wait()
            story.cancel()  # never answered: its process is gone
            return sid

    sid = run(before_kill)
    second = Client()

    async def after_kill() -> str:
        async with corral_acp(tmp_path, second, "--model", f"{FACTORIES}:slow") as (conn, _):
            with pytest.raises(RequestError) as unknown:
                await conn.load_session(cwd=str(tmp_path), session_id="no-such-session", mcp_servers=[])
            assert unknown.value.code == -32002  # resource not found
            await conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
            replayed = list(second.updates)
            answer = await conn.prompt(session_id=sid, prompt=[text_block("quick, after the crash")])
            assert answer.stop_reason == "end_turn"
            return json.dumps([type(u).__name__ for _, u in replayed])

    kinds = json.loads(run(after_kill))
    assert kinds[:2] == ["UserMessageChunk", "AgentMessageChunk"]
    texts = [u.content.text for _, u in second.updates if isinstance(u, UserMessageChunk)]
    assert texts == ["quick hello", "a long story"]  # the killed turn's prompt is history
    assert second.text().startswith("echo: quick hello")
    assert second.text().endswith("echo: quick, after the crash")
    ends = [e.data.reason.kind for e in logged(tmp_path, sid) if e.type == "turn/end"]
    assert ends == ["completed", "interrupted", "completed"]


def test_a_prompt_sent_while_a_turn_runs_is_queued_and_answered_after_its_own_turn(
    tmp_path: Path,
) -> None:
    client = Client(answers=[None, "allow_once"])
    args = ("--model", f"{FACTORIES}:note_taker", "--tools", f"{FACTORIES}:TOOLS")
    order: list[str] = []

    async def main() -> str:
        async with corral_acp(tmp_path, client, *args) as (conn, _):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id

            async def prompt(text: str) -> str:
                answer = await conn.prompt(session_id=sid, prompt=[text_block(text)])
                order.append(text)
                return answer.stop_reason

            first = asyncio.ensure_future(prompt("first"))
            await asyncio.wait_for(client.permission.wait(), TIMEOUT)  # turn 1 waits for us
            second = asyncio.ensure_future(prompt("second"))
            await asyncio.sleep(0.2)  # (nothing to wait for: the second must not be answered)
            assert not second.done()
            client.release.set()  # turn 1's request: cancelled by the client, the call refused
            reasons = await asyncio.wait_for(asyncio.gather(first, second), TIMEOUT)
            assert reasons == ["end_turn", "end_turn"]
            return sid

    sid = run(main)
    assert order == ["first", "second"]
    assert (tmp_path / "notes.txt").read_text() == "second\n"
    decisions = [e.data for e in logged(tmp_path, sid) if e.type == PERMISSION]
    assert [(d.outcome, d.reason) for d in decisions] == [
        ("reject", "the client cancelled the permission request"),
        ("allow", None),
    ]


def test_cancel_while_the_user_is_asked_refuses_the_call_and_answers_cancelled(
    tmp_path: Path,
) -> None:
    client = Client(answers=[None])
    args = ("--model", f"{FACTORIES}:note_taker", "--tools", f"{FACTORIES}:TOOLS")

    async def main() -> tuple[str, str]:
        async with corral_acp(tmp_path, client, *args) as (conn, _):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            pending = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("x")]))
            await asyncio.wait_for(client.permission.wait(), TIMEOUT)
            await conn.cancel(session_id=sid)
            answer = await asyncio.wait_for(pending, TIMEOUT)
            client.release.set()  # the client's own cancelled answer comes after: ignored
            return sid, answer.stop_reason

    sid, reason = run(main)
    assert reason == "cancelled"
    assert not (tmp_path / "notes.txt").exists()
    events = logged(tmp_path, sid)
    [decision] = [e.data for e in events if e.type == PERMISSION]
    assert decision.outcome == "reject" and "cancelled" in (decision.reason or "")
    assert [e.data.reason.kind for e in events if e.type == "turn/end"] == ["aborted"]


def test_hooks_under_acp_a_pre_tool_use_ask_asks_the_client_and_an_allow_skips_it(
    tmp_path: Path,
) -> None:
    hook = tmp_path / "gate.py"
    hook.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "call = json.load(sys.stdin)\n"
        "decision = 'ask' if 'careful' in call['tool_input']['text'] else 'allow'\n"
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'PreToolUse',"
        " 'permissionDecision': decision, 'permissionDecisionReason': 'the hook asks'}}))\n"
    )
    hook.chmod(0o755)
    settings = tmp_path / "hooks.json"
    refuse = "grep -q forbidden && { echo 'not that' >&2; exit 2; } || exit 0"
    settings.write_text(
        json.dumps(
            {
                "hooks": {
                    "PreToolUse": [{"hooks": [{"command": str(hook)}]}],
                    "UserPromptSubmit": [{"hooks": [{"command": refuse}]}],
                }
            }
        )
    )
    client = Client(answers=["allow_once"])
    args = ("--model", f"{FACTORIES}:note_taker", "--tools", f"{FACTORIES}:TOOLS", "--hooks", str(settings))

    async def main() -> str:
        async with corral_acp(tmp_path, client, *args) as (conn, _):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            for text in ("be careful", "just do it"):
                answer = await conn.prompt(session_id=session.session_id, prompt=[text_block(text)])
                assert answer.stop_reason == "end_turn"
            refused = await conn.prompt(session_id=session.session_id, prompt=[text_block("forbidden")])
            assert refused.stop_reason == "refusal"  # the turn ended blocked
            return session.session_id

    sid = run(main)
    assert (tmp_path / "notes.txt").read_text() == "be careful\njust do it\n"
    [(tool_call, _)] = client.asked  # the hook's allow skipped the tool's own permission
    assert tool_call.title == "write_note: the hook asks"
    events = logged(tmp_path, sid)
    assert [e.data.outcome for e in events if e.type == PERMISSION] == ["allow"]
    runs = [(e.data.event, e.data.decision) for e in events if e.type == HOOK_RUN]
    assert runs == [
        ("UserPromptSubmit", None),
        ("PreToolUse", "ask"),
        ("UserPromptSubmit", None),
        ("PreToolUse", "allow"),
        ("UserPromptSubmit", "block"),
    ]


def test_a_config_file_gives_the_options_and_ask_gates_a_tool_by_name(tmp_path: Path) -> None:
    config = tmp_path / "acp.toml"
    config.write_text(
        f'model = "{FACTORIES}:note_taker"\n'
        f'tools = ["{FACTORIES}:PLAIN_TOOLS"]\n'
        'ask = ["write_note"]\n'
        'store = "store"\n'
    )
    client = Client(answers=["reject_once"])

    async def main() -> str:
        async with corral_acp(tmp_path, client, "--config", str(config)) as (conn, _):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            answer = await conn.prompt(session_id=session.session_id, prompt=[text_block("x")])
            assert answer.stop_reason == "end_turn"
            return session.session_id

    sid = run(main)
    assert len(client.asked) == 1 and not (tmp_path / "notes.txt").exists()
    [decision] = [e.data for e in logged(tmp_path, sid) if e.type == PERMISSION]
    assert (decision.outcome, decision.option) == ("reject", "reject_once")
    config.write_text('model = "scripted:echo"\nmodle = "typo"\n')
    result = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "acp", "--config", str(config)],
        capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert result.returncode == 2 and "unknown key(s) modle" in result.stderr
