"""The event bridges: each hook event runs on corral's public live events.

=================  ==============================================  =====================
hook event         corral event                                    what a decision does
=================  ==============================================  =====================
SessionStart       ``agent/session-start`` (``startup``/``resume``) context joins the
                                                                   first prompt's step
UserPromptSubmit   ``agent/pre-step`` of a batch with user          block: ``Reject``;
                   messages                                        context: logged
PreToolUse         ``tools/pre-execute`` (+ ``tools/execute`` to   allow / deny / ask,
                   run a rewritten input)                          ``updatedInput``
PostToolUse        ``tools/post-execute``                          block / context: fed
                                                                   back; Codex: output
Stop               ``agent/turn-stopping``                         block: ``steer(reason)``
SessionEnd         ``agent/disposed``                              (observes)
=================  ==============================================  =====================

Every listener is ``async def``: commands run on the I/O side, never on a dispatcher
thread. Each run is a durable ``hook/run`` fact in the agent's session. Context a hook
adds is a user message of source ``plugin``, entered into the step (so logged, and
model-visible as everything the model sees is). A ``continue: false`` cancels the agent
with ``HookCause(stopReason)``, keeping its inbox.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from actors import (
    Allow,
    Deny,
    Enter,
    PostExecute,
    PreExecute,
    PreStep,
    Reject,
    ToolExecute,
    TurnStopping,
)
from storage import AssistantMessage, CorralError, HookCause, TextBlock, UserMessage

from .decisions import UNSET, HookOutcome, read_outcome
from .facts import HOOK_RUN, HookRun, clipped
from .runner import run_command
from .settings import HookCommand, HookSettings
from .transcripts import Transcripts

if TYPE_CHECKING:
    from actors import Scheduler
    from runtime.agent import Agent
    from storage import Store


class HookHost(Protocol):
    """What the bridge needs of the runtime it is installed on (a protocol: the facade
    installs the bridge, so the bridge does not import the facade)."""

    @property
    def store(self) -> Store: ...

    @property
    def scheduler(self) -> Scheduler: ...  # whose clock times a rewritten call's timeout

    def on(self, name: str, listener: Callable[..., Any]) -> Callable[[], None]: ...

__all__ = ["Asker", "HookBridge"]

log = logging.getLogger("corral.hooks")

Asker: TypeAlias = Callable[[PreExecute, str | None], Awaitable[bool]]
"""Asks a user whether a tool call may run (``PreToolUse`` said ``ask``): True allows it.
``corral acp`` sets one that asks the client with ``session/request_permission``."""
_NO_ASKER = (
    "a PreToolUse hook asked for the user's approval and nothing here can ask a user "
    "(an ACP client can: run the agent under `corral acp`)"
)
Runs: TypeAlias = list[tuple[HookCommand, HookOutcome]]


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (a tool's output may be anything)."""
    return json.loads(json.dumps(value, default=str))


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _plugin_message(text: str) -> UserMessage:
    return UserMessage(
        id=f"hook-{uuid.uuid4().hex}", content=(TextBlock(text=text),), source="plugin"
    )


def _joined(outcomes: list[HookOutcome], fallback: str) -> str:
    return "\n".join(o.reason or fallback for o in outcomes)


class HookBridge:
    """The hooks of one runtime: :meth:`install` registers the listeners, :meth:`close`
    takes them away. ``asker`` answers ``permissionDecision: ask`` (None: such a call is
    denied, saying why)."""

    def __init__(
        self,
        rt: HookHost,
        settings: HookSettings,
        *,
        cwd: str | None = None,
        transcripts: Path | None = None,
    ) -> None:
        self._rt = rt
        self.settings = settings
        self.cwd = cwd or os.getcwd()
        self.asker: Asker | None = None
        self._cwds: dict[str, str] = {}
        self._starts: dict[str, concurrent.futures.Future[list[str]]] = {}
        self._rewrites: dict[tuple[str, str], Any] = {}
        self._stop_active: set[tuple[str, int]] = set()
        if transcripts is None:  # private (0700), gone with the bridge or the process
            transcripts = Path(tempfile.mkdtemp(prefix="corral-hook-transcripts-"))
            weakref.finalize(self, shutil.rmtree, transcripts, ignore_errors=True)
        self._transcripts = Transcripts(transcripts)
        self._disposers: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ wiring

    def install(self) -> HookBridge:
        self._rt.store.register_event_type(HOOK_RUN, HookRun, ignorable=True)
        has = self.settings.has
        on = self._listen
        if has("SessionStart"):
            on("agent/session-start", self._mark_start)  # sync: before the first pre-step
            on("agent/session-start", self._session_start)
        if has("SessionStart") or has("UserPromptSubmit"):
            on("agent/pre-step", self._pre_step)
        if has("PreToolUse"):
            on("tools/pre-execute", self._pre_execute)
            on("tools/execute", self._execute)
        if has("PostToolUse"):
            on("tools/post-execute", self._post_execute)
        if has("Stop"):
            on("agent/turn-stopping", self._turn_stopping)
        on("agent/disposed", self._session_end if has("SessionEnd") else self._forget)
        return self

    def _listen(self, name: str, listener: Callable[..., Any]) -> None:
        self._disposers.append(self._rt.on(name, listener))

    def close(self) -> None:
        """Remove every listener (idempotent)."""
        disposers, self._disposers = self._disposers, []
        for dispose in disposers:
            dispose()

    def set_cwd(self, agent_id: str, cwd: str) -> None:
        """The working directory the hooks of ``agent_id`` run in (and are told)."""
        self._cwds[agent_id] = cwd

    # ------------------------------------------------------------------ running

    def _payload(
        self, name: str, agent: Agent, turn: int | None, fields: Mapping[str, Any]
    ) -> bytes:
        cwd = self._cwds.get(agent.id, self.cwd)
        payload: dict[str, Any] = {
            "session_id": agent.id,
            "transcript_path": None,
            "cwd": cwd,
            "hook_event_name": name,
            "permission_mode": "default",
        }
        try:
            payload["transcript_path"] = self._transcripts.refresh(agent.session)
        except (CorralError, OSError) as err:  # the store closed (SessionEnd at close)
            log.warning("no transcript for session %s: %s", agent.id, err)
        if self.settings.dialect == "codex":
            payload["model"] = agent.model.name
            if turn is not None:
                payload["turn_id"] = str(turn)
        payload.update(fields)
        return json.dumps(payload, default=str).encode()

    async def _run(
        self,
        name: str,
        agent: Agent,
        fields: Mapping[str, Any],
        *,
        value: str | None = None,
        turn: int | None = None,
        call_id: str | None = None,
    ) -> Runs:
        """Run the commands of ``name`` matching ``value`` at once; log each run."""
        commands = self.settings.commands(name, value)
        if not commands:
            return []
        data = await asyncio.to_thread(self._payload, name, agent, turn, fields)
        cwd = self._cwds.get(agent.id, self.cwd)
        env = dict(os.environ)
        if self.settings.dialect == "claude":
            env["CLAUDE_PROJECT_DIR"] = cwd
        results = await asyncio.gather(
            *(
                run_command(c.command, data, timeout_s=c.timeout_s, cwd=cwd, env=env)
                for c in commands
            )
        )
        runs: Runs = []
        dialect = self.settings.dialect
        for command, result in zip(commands, results, strict=True):
            outcome = read_outcome(name, result, dialect=dialect, fail_closed=command.fail_closed)
            runs.append((command, outcome))
            fact = HookRun(
                event=name,
                command=command.command,
                duration_ms=result.duration_ms,
                exit_code=result.exit_code,
                decision=outcome.decision,
                reason=clipped(outcome.reason),
                context=outcome.context is not None,
                updated=outcome.updated_input is not UNSET or outcome.updated_output is not UNSET,
                stop=clipped(outcome.stop),
                timed_out=result.timed_out,
                problem=clipped(outcome.problem),
                fail_closed=command.fail_closed,
                turn=turn,
                call_id=call_id,
            )
            try:
                agent.session.append_fact(fact)
            except (CorralError, RuntimeError) as err:  # disposed and closed: SessionEnd
                log.warning("hook/run of %s not logged in session %s: %s", name, agent.id, err)
            if outcome.problem is not None:
                log.warning("%s hook %r: %s", name, command.command, outcome.problem)
        stops = [o.stop for _, o in runs if o.stop]
        if stops and not agent.disposed:
            agent.cancel(HookCause(reason=clipped("\n".join(stops)) or ""), keep_inbox=True)
        return runs

    # ------------------------------------------------------------------ events

    def _mark_start(self, event: Any) -> None:
        self._starts[event.agent.id] = concurrent.futures.Future()

    async def _session_start(self, event: Any) -> None:
        agent = event.agent
        started = self._starts.get(agent.id)
        contexts: list[str] = []
        try:
            runs = await self._run(
                "SessionStart", agent, {"source": event.source}, value=event.source
            )
            contexts = [o.context for _, o in runs if o.context]
        finally:
            if started is not None and not started.done():
                started.set_result(contexts)

    async def _pre_step(self, event: PreStep, next_: Callable[[], Awaitable[Any]]) -> Any:
        agent: Agent = event.agent  # type: ignore[assignment]
        contexts: list[str] = []
        started = self._starts.pop(agent.id, None)
        if started is not None:
            started_contexts: list[str] = await asyncio.wrap_future(started)
            contexts += started_contexts
        prompts = [m for m in event.messages if m.source == "user"]
        if prompts and self.settings.has("UserPromptSubmit"):
            text = "\n".join(
                block.text for m in prompts for block in m.content if isinstance(block, TextBlock)
            )
            runs = await self._run("UserPromptSubmit", agent, {"prompt": text}, turn=event.turn)
            blocked = [o for _, o in runs if o.decision == "block"]
            if blocked:
                return Reject(reason=_joined(blocked, "blocked by a UserPromptSubmit hook"))
            contexts += [o.context for _, o in runs if o.context]
        decision = await next_()
        if contexts and isinstance(decision, Enter):
            extra = [_plugin_message(text) for text in contexts]
            return Enter(messages=[*decision.messages, *extra])
        return decision

    async def _pre_execute(self, event: PreExecute, next_: Callable[[], Awaitable[Any]]) -> Any:
        agent: Agent = event.agent  # type: ignore[assignment]
        fields = {
            "tool_name": event.name,
            "tool_input": event.arguments,
            "tool_use_id": event.call_id,
        }
        runs = await self._run(
            "PreToolUse", agent, fields, value=event.name, turn=event.turn, call_id=event.call_id
        )
        outcomes = [o for _, o in runs]
        denied = [o for o in outcomes if o.decision == "deny"]
        if denied:
            return Deny(reason=_joined(denied, "denied by a PreToolUse hook"))
        key = (agent.id, event.call_id)
        updates = [o.updated_input for o in outcomes if o.updated_input is not UNSET]
        if updates:
            self._rewrites[key] = updates[-1]  # the last in settings order wins
        asked = [o for o in outcomes if o.decision == "ask"]
        if asked:
            reason = "\n".join(o.reason for o in asked if o.reason) or None
            allowed = False if self.asker is None else await self.asker(event, reason)
            if not allowed:
                self._rewrites.pop(key, None)
                return Deny(reason=_NO_ASKER if self.asker is None else "the user refused the call")
            return Allow()
        if any(o.decision == "allow" for o in outcomes):
            return Allow()  # as in Claude Code: an allow skips the permission prompt
        decision = await next_()
        if not isinstance(decision, Allow):
            self._rewrites.pop(key, None)
        return decision

    async def _execute(self, event: ToolExecute, next_: Callable[[], Awaitable[Any]]) -> Any:
        agent: Agent = event.agent  # type: ignore[assignment]
        key = (agent.id, event.call_id)
        if key not in self._rewrites:
            return await next_()
        updated = self._rewrites.pop(key)
        tool = agent.tools[event.name]
        prepared = tool.prepare(updated)  # refused input: the call fails, naming why
        work = tool.run(prepared) if tool.is_async else asyncio.to_thread(tool.run, prepared)
        if tool.timeout_s is None:
            return await work
        return await self._rt.scheduler.wait_for(work, tool.timeout_s)

    async def _post_execute(self, event: PostExecute, next_: Callable[[], Awaitable[Any]]) -> Any:
        agent: Agent = event.agent  # type: ignore[assignment]
        output = await next_()
        failed = event.error is not None and output is event.output
        response = {"error": event.error} if failed else _jsonable(output)
        fields = {
            "tool_name": event.name,
            "tool_input": event.arguments,
            "tool_response": response,
            "tool_use_id": event.call_id,
        }
        runs = await self._run(
            "PostToolUse", agent, fields, value=event.name, turn=event.turn, call_id=event.call_id
        )
        outcomes = [o for _, o in runs]
        updates = [o.updated_output for o in outcomes if o.updated_output is not UNSET]
        if updates:
            return updates[-1]
        notes = [f"PostToolUse hook: {o.reason}" for o in outcomes if o.decision == "block"]
        notes += [o.context for o in outcomes if o.context]
        if notes and not failed:  # a failed call's error stays its result (the run is logged)
            return "\n\n".join([_as_text(output), *notes])
        return output

    async def _turn_stopping(self, event: TurnStopping) -> None:
        agent: Agent = event.agent  # type: ignore[assignment]
        key = (agent.id, event.turn)
        fields: dict[str, Any] = {"stop_hook_active": key in self._stop_active}
        if self.settings.dialect == "codex":
            fields["last_assistant_message"] = await asyncio.to_thread(_last_reply, agent)
        runs = await self._run("Stop", agent, fields, turn=event.turn)
        blocked = [o for _, o in runs if o.decision == "block"]
        if blocked and not event.signal.aborted:
            self._stop_active.add(key)
            agent.steer(_plugin_message(_joined(blocked, "a Stop hook asked to go on")))
        else:
            self._stop_active.discard(key)

    async def _session_end(self, event: Any) -> None:
        try:
            await self._run("SessionEnd", event.agent, {"reason": "other"}, value="other")
        finally:
            self._forget(event)

    def _forget(self, event: Any) -> None:
        """Drop what the bridge kept of a disposed agent."""
        agent_id = event.agent.id
        self._starts.pop(agent_id, None)
        self._cwds.pop(agent_id, None)
        for active in [k for k in list(self._stop_active) if k[0] == agent_id]:
            self._stop_active.discard(active)  # (in place: the I/O loop may add meanwhile)
        for key in [k for k in list(self._rewrites) if k[0] == agent_id]:
            self._rewrites.pop(key, None)
        self._transcripts.forget(agent_id)


def _last_reply(agent: Agent) -> str | None:
    """The text of the session's last assistant message (Codex's Stop input)."""
    for message in reversed(agent.session.derive_messages()):
        if isinstance(message, AssistantMessage):
            return "".join(b.text for b in message.content if isinstance(b, TextBlock)) or None
    return None
