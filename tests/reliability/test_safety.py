"""Safety: store files are owner-only, and an API key never reaches anything the run
writes or prints (logs, exports, exception messages, CLI output).

The secrets run is a real agent on a real store, streaming from a loopback server
through the OpenAI-compatible provider, with a tool that reads a key from the
environment. The server echoes the provider's key back in an error body, as real
vendors do. Afterwards every byte the run left behind is searched for both keys.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime import RetryPolicy, Runtime, ScriptedModel, tool
from storage import Store

from .conftest import WAIT, corral

# Not shaped like a vendor key: only the provider's own Secret can mask it.
PROVIDER_KEY = "corral-test-SECRET-0123456789abcdef"
ENV_KEY = "sk-env-SECRET-fedcba9876543210"  # shaped like one: masked by shape as well


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_store_files_and_directory_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with umask(0), Runtime.open(path, map_size=64 << 10) as rt:  # a permissive umask
        agent = rt.spawn(model=ScriptedModel.echo())
        for index in range(50):
            agent.followup(f"grow the map {index} " + "x" * 2000)
        assert agent.wait_idle(WAIT)
        rt.flush()
        assert rt.store.statistics().resizes > 0
    assert mode(path) == 0o700
    files = sorted(p.name for p in path.iterdir())
    assert files == ["data.mdb", "lock.mdb", "writer.lock"]
    for name in files:
        assert mode(path / name) == 0o600, name


def test_a_store_created_inside_new_parent_directories_is_owner_only_itself(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a" / "b" / "store"
    with umask(0), Store.open(path):
        pass
    assert mode(path) == 0o700
    for name in ("data.mdb", "lock.mdb", "writer.lock"):
        assert mode(path / name) == 0o600


# --------------------------------------------------------------------------- secrets


@tool
def peek_env() -> str:
    """Read the API key from the environment, as a careless tool might."""
    key = os.environ["OPENAI_API_KEY"]
    return f"the key has {len(key)} characters"


def run_secret_session(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """A session whose model and tool both hold keys; returns what the test inspects."""
    from runtime.providers import OpenAICompatModel

    from ..runtime.providers.wire_formats import (
        openai_frames,
        openai_text_reply,
        openai_tool_reply,
    )
    from ..runtime.providers.wire_server import JsonReply, Sse, WireServer

    seen: dict[str, Any] = {"errors": [], "failures": []}
    echo = {"error": {"message": f"Incorrect API key provided: {PROVIDER_KEY}", "type": "x"}}
    leaked_env = {"error": {"message": f"upstream said: bad key {ENV_KEY}", "type": "server"}}
    with WireServer() as wire:
        wire.script(
            Sse(openai_frames(openai_tool_reply([("call_1", "peek_env", ["{}"])]))),
            Sse(openai_frames(openai_text_reply("done"))),
            JsonReply(401, echo),
            JsonReply(500, leaked_env),
            Sse(openai_frames(openai_text_reply("recovered"))),
        )
        model = OpenAICompatModel("m", base_url=wire.url + "/v1", api_key=PROVIDER_KEY)
        policy = RetryPolicy(base_s=0.001, cap_s=0.002)
        with Runtime.open(tmp_path / "store", retry_policy=policy) as rt:
            try:

                def record(event: Any, next_: Any) -> Any:
                    seen["errors"] += [str(event.error), repr(event.error), str(event.failure)]
                    return next_()

                rt.on("agent/request-error", record)
                rt.on("agent/error", lambda e: seen["failures"].append(repr(e.error)))
                agent = rt.spawn(model=model, tools=[peek_env], session_id="secretive")
                for text in ("use the tool", "this one fails with AUTH", "this one retries"):
                    agent.followup(text)
                    assert agent.wait_idle(WAIT)
                seen["ends"] = [
                    e.data.reason.kind for e in agent.session.events() if e.type == "turn/end"
                ]
                seen["repr"] = repr(model) + str(model) + repr(agent)
                out = io.BytesIO()
                rt.flush()
                rt.store.export_jsonl("secretive", out)
                seen["export"] = out.getvalue()
            finally:
                asyncio.run_coroutine_threadsafe(model.aclose(), rt.io.loop).result(WAIT)
        seen["authorization"] = [r.headers.get("authorization", "") for r in wire.requests]
    seen["log"] = caplog.text
    return seen


def test_an_api_key_never_reaches_a_log_an_export_an_error_or_the_cli(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    caplog.set_level(logging.DEBUG)
    seen = run_secret_session(tmp_path, caplog)
    # the keys were really in play: the server got the provider key, the tool ran
    assert seen["authorization"] and all(PROVIDER_KEY in a for a in seen["authorization"])
    assert seen["ends"] == ["completed", "error", "error", "completed"]
    assert seen["errors"] and seen["failures"]
    store = tmp_path / "store"
    texts: dict[str, str] = {
        "exception texts": "\n".join(seen["errors"] + seen["failures"]),
        "reprs": seen["repr"],
        "captured logging": seen["log"],
        "export": seen["export"].decode(),
    }
    for args in (
        ("log", "ls"),
        ("log", "show", "secretive"),
        ("log", "show", "--raw", "-v", "secretive"),
        ("log", "tail", "secretive"),
        ("log", "export", "secretive"),
        ("log", "stats"),
        ("log", "check"),
    ):
        done = corral(*args, "--store", store)
        assert done.returncode == 0, done.stderr
        texts["corral " + " ".join(args)] = done.stdout + done.stderr
    for path in sorted(store.rglob("*")):
        texts[f"file {path.name}"] = path.read_bytes().decode("latin-1")
    assert "peek_env" in texts["export"] and "characters" in texts["export"]
    assert "***" in texts["export"]  # the echoed keys were masked, not dropped
    for where, text in texts.items():
        for key in (PROVIDER_KEY, ENV_KEY):
            assert key not in text, f"a key leaked into {where}"
