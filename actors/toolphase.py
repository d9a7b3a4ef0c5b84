"""The tool phase of a step (CONTRACT section 6).

``tool/call`` facts are already durable when this runs. Each call passes
``tools/pre-execute`` (allow / deny), then its body runs on the I/O side wrapped by
``tools/execute``, then ``tools/post-execute`` may replace the output; ``tool/result``
facts are appended in model order as soon as every earlier call has one. Calls whose
tool is concurrency-safe run in parallel (at most ``max_parallel`` in flight: a queued
call starts as soon as any in-flight call ended, whatever its place); others run alone.
After an abort no new call starts: in-flight calls finish and commit, every unstarted
call gets a synthetic ``ABORTED_BEFORE_DISPATCH`` result.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec

from storage import (
    JSON_BYTES_PER_CHAR,
    RESULT_ROOM,
    InvalidEventError,
    TextBlock,
    ToolCallBlock,
    ToolError,
    ToolMessage,
    ToolResultData,
    ToolSpec,
    tool_id_bytes,
)

from .effects import JoinTool, StartTool, TurnAborted, outcome_of
from .errors import ToolArgumentError
from .events import AgentLike, Allow, Deny, PostExecute, PreExecute, ToolExecute, ToolResultEvent
from .signal import TurnSignal
from .tools import MAX_PARALLEL_TOOLS, Tool, ToolOutcome, described, outcome_from_output, shown

__all__ = ["RESULT_ROOM", "ReadOnlyDict", "ToolPhase", "ToolPlan", "ToolRun", "unanswerable"]

_LAST_RESORT: Final = "the tool result could not be logged"
_ALLOW: Final = Allow()  # stateless: the pre-execute decision when nobody is asked
_JSON: Final = msgspec.json.Encoder()


def unanswerable(calls: Sequence[ToolCallBlock], max_event_bytes: int) -> str | None:
    """Why no ``tool/result`` could ever be logged for one of ``calls`` (its id and name,
    which every result repeats, leave less than :data:`RESULT_ROOM` bytes of an event),
    or None. Such a call is a malformed model reply: it must not be logged, since a
    ``tool/call`` nothing can answer leaves a step no one can close."""
    room = tool_id_bytes(max_event_bytes)
    for call in calls:
        # A JSON string takes at most 6 bytes a character (\u escapes): measured only
        # when that bound does not fit.
        if JSON_BYTES_PER_CHAR * (len(call.call_id) + len(call.name)) + 4 <= room:
            continue
        size = len(_JSON.encode(call.call_id)) + len(_JSON.encode(call.name))
        if size > room:
            return (
                f"the model's reply has a tool call whose id and name take {size} bytes: "
                f"no result for it could be logged under the event limit of "
                f"{max_event_bytes} bytes (at most {room} bytes for them)"
            )
    return None


class ToolPlan(msgspec.Struct, frozen=True):
    """What the actor needs to run one call's body."""

    tool: Any
    prepared: Any
    event: ToolExecute


class ToolRun(msgspec.Struct, frozen=True):
    """How a body ended: its output, or the exception it raised, or a timeout."""

    output: Any = None
    error: BaseException | None = None
    timed_out: bool = False


def _always(_name: str) -> bool:
    return True


def _error(code: str, message: str) -> ToolOutcome:
    return ToolOutcome(
        content=(TextBlock(text=message),), error=ToolError(code=code, message=message)
    )


def _refused(message: str, outcome: ToolOutcome) -> ToolOutcome:
    refused = _error("TOOL_FAILED", message)
    return ToolOutcome(
        content=refused.content, error=refused.error, concludes_turn=outcome.concludes_turn
    )


def _not_started() -> ToolOutcome:
    return _error("ABORTED_BEFORE_DISPATCH", "the turn was aborted before this call started")


def _abandoned(err: Exception, *, ran: bool) -> ToolOutcome:
    state = "its body may have run" if ran else "it did not run"
    return _error("TOOL_FAILED", f"the tool phase failed ({described(err)}); {state}")


class ToolPhase:
    """Runs the calls of one step. Owned by one agent's turn machine."""

    def __init__(
        self,
        *,
        agent: AgentLike,
        tools: Mapping[str, Tool],
        append_fact: Callable[[Any], Any],
        waterfall: Callable[[str, Any, Callable[[], Any]], Any],
        emit: Callable[[str, Any], None],
        max_parallel: int = MAX_PARALLEL_TOOLS,
        listened: Callable[[str], bool] | None = None,
    ) -> None:
        self._agent = agent
        # ``listened(name)`` False: no listener of any scope has ``name`` (e.g.
        # ``Bus.maybe_listened``), so its event is not built and its waterfall resolves
        # to the default at once; None: every event is built and offered.
        self._listened: Callable[[str], bool] = listened or _always
        # Kept, not copied (the runtime gives every agent of a spawn the same mapping,
        # which nothing changes): a copy was 64 bytes of every idle agent, more with tools.
        self._tools = tools
        self._append = append_fact
        self._waterfall = waterfall
        self._emit = emit
        self._max_parallel = max_parallel
        self._specs = tuple(tool.spec for tool in self._tools.values())

    def specs(self) -> tuple[ToolSpec, ...]:
        return self._specs

    async def _decide(self, name: str, event: Any, default: Callable[[], Any]) -> Any:
        return await outcome_of(name, self._waterfall(name, event, default))

    def _prepare(self, call: ToolCallBlock) -> tuple[Tool, Any, Any] | ToolOutcome:
        """Parse and validate ``call``: its tool, its prepared arguments and the read-only
        arguments listeners see; an outcome means "do not run"."""
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return _error(
                "UNKNOWN_TOOL", f"there is no tool named {shown(call.name)} (tools: {known})"
            )
        try:
            text = call.arguments
            # No arguments (the usual call of a tool without parameters): no decoder run.
            arguments = {} if not text or text == "{}" else _ARGUMENTS.decode(text)
        except ValueError as err:
            return _error("INVALID_ARGUMENTS", f"the arguments are not valid JSON: {err}")
        except RecursionError:
            return _error("INVALID_ARGUMENTS", "the arguments are nested too deeply to decode")
        try:
            prepared = tool.prepare(arguments)
        except ToolArgumentError as err:
            return _error("INVALID_ARGUMENTS", str(err))
        except Exception as err:  # noqa: BLE001 - a converter refusing the value, or its bug
            # e.g. a dataclass argument whose __post_init__ asserts, a hand-written
            # prepare raising KeyError: the arguments did not convert
            return _error(
                "INVALID_ARGUMENTS",
                f"tool {call.name!r} could not convert its arguments: {described(err)}",
            )
        try:
            shared = _read_only(arguments)  # what every listener sees
        except RecursionError:
            return _error("INVALID_ARGUMENTS", "the arguments are nested too deeply")
        return tool, prepared, shared

    def _admit_now(self, turn: int, step: int, call: ToolCallBlock) -> ToolPlan | ToolOutcome:
        """:meth:`_admit` when no ``tools/pre-execute`` listener of any scope is there to
        ask (the waterfall's default, ``Allow``): no coroutine, nothing awaited."""
        prepared = self._prepare(call)
        if isinstance(prepared, ToolOutcome):
            return prepared
        return self._plan(turn, step, call, *prepared)

    def _plan(
        self, turn: int, step: int, call: ToolCallBlock, tool: Tool, prepared: Any, shared: Any
    ) -> ToolPlan:
        execute = ToolExecute(
            agent=self._agent,
            turn=turn,
            step=step,
            call_id=call.call_id,
            name=call.name,
            arguments=shared,
        )
        return ToolPlan(tool=tool, prepared=prepared, event=execute)

    async def _admit(
        self, turn: int, step: int, call: ToolCallBlock, signal: TurnSignal
    ) -> ToolPlan | ToolOutcome:
        """Parse, validate and ask ``tools/pre-execute``; an outcome means "do not run"."""
        checked = self._prepare(call)
        if isinstance(checked, ToolOutcome):
            return checked
        tool, prepared, shared = checked
        if not self._listened("tools/pre-execute"):
            decision: Any = _ALLOW  # the waterfall's default, with no listener to ask
        else:
            event = PreExecute(
                agent=self._agent,
                turn=turn,
                step=step,
                call_id=call.call_id,
                name=call.name,
                arguments=shared,
                signal=signal,
            )
            try:
                decision = await self._decide("tools/pre-execute", event, Allow)
            except TurnAborted:
                return _not_started()
            except Exception as err:  # noqa: BLE001 - a failing gate denies the call
                return _error("TOOL_DENIED", f"tools/pre-execute failed: {err!r}")
        if isinstance(decision, Deny):
            if not isinstance(decision.reason, str):  # msgspec does not check at construction
                return _error(
                    "TOOL_DENIED",
                    f"tools/pre-execute returned a Deny whose reason is not a str: "
                    f"{shown(decision.reason)}",
                )
            return _error("TOOL_DENIED", decision.reason)
        if not isinstance(decision, Allow):  # a malformed decision is no permission
            return _error(
                "TOOL_DENIED",
                f"tools/pre-execute must return Allow or Deny, got {shown(decision)}",
            )
        return self._plan(turn, step, call, tool, prepared, shared)

    async def _finish(self, plan: ToolPlan, run: ToolRun) -> ToolOutcome:
        """Turn a body's run into an outcome, through ``tools/post-execute``."""
        tool_name = plan.event.name
        if run.timed_out:  # post-execute sees it as the body's error, and may replace it
            error: str | None = "ToolTimeout: the tool timed out"
        else:
            error = None if run.error is None else f"{type(run.error).__name__}: {run.error}"
        if error is None and not self._listened("tools/post-execute"):
            return outcome_from_output(run.output)  # no listener could replace it
        event = PostExecute(
            agent=self._agent,
            turn=plan.event.turn,
            step=plan.event.step,
            call_id=plan.event.call_id,
            name=tool_name,
            arguments=plan.event.arguments,
            output=run.output,
            error=error,
        )
        try:
            output = await self._decide("tools/post-execute", event, lambda: run.output)
        except TurnAborted:
            output = run.output
        except Exception as err:  # noqa: BLE001 - a failing post hook fails the call
            return _error("TOOL_FAILED", f"tools/post-execute failed: {err!r}")
        if error is not None and output is run.output:
            if run.timed_out:
                return _error("TOOL_TIMEOUT", f"tool {tool_name!r} timed out")
            return _error("TOOL_FAILED", f"tool {tool_name!r} raised {error}")
        return outcome_from_output(output)

    async def run(
        self,
        turn: int,
        step: int,
        calls: Sequence[ToolCallBlock],
        call_seqs: Sequence[int],
        signal: TurnSignal,
    ) -> bool:
        """Run every call; returns True when a result concludes the turn.

        Whatever escapes (a bug here, a stepper's failure thrown in), every call still
        unanswered gets a synthetic ``TOOL_FAILED`` result before the error is raised on,
        so that the step can close (its ``step/end`` never follows an unanswered call);
        should even that fail, the calls stay unanswered and the turn must leave the step
        open for the resume's repair (see ``TurnMachine._step``)."""
        outcomes: list[ToolOutcome | None] = [None] * len(calls)
        plans: dict[int, ToolPlan] = {}
        inflight: dict[Any, int] = {}  # handle -> index of each started, unjoined call
        committed = 0

        def commit_ready() -> None:
            nonlocal committed
            while committed < len(calls) and outcomes[committed] is not None:
                self._commit(
                    turn, step, calls[committed], call_seqs[committed], outcomes[committed]
                )
                committed += 1

        listened = self._listened

        async def join_any() -> None:  # whichever in-flight call ends first
            handle, ran = await JoinTool(tuple(inflight))
            index = inflight.pop(handle)
            if ran.error is None and not ran.timed_out and not listened("tools/post-execute"):
                outcomes[index] = outcome_from_output(ran.output)  # as _finish, not awaited
            else:
                outcomes[index] = await self._finish(plans[index], ran)
            commit_ready()

        try:
            for index, call in enumerate(calls):
                if signal.aborted:
                    outcomes[index] = _not_started()
                    commit_ready()
                    continue
                if listened("tools/pre-execute"):
                    admitted = await self._admit(turn, step, call, signal)
                else:
                    admitted = self._admit_now(turn, step, call)
                if isinstance(admitted, ToolOutcome):
                    outcomes[index] = admitted
                    commit_ready()
                    continue
                safe = bool(admitted.tool.concurrency_safe)
                while inflight and (not safe or len(inflight) >= self._max_parallel):
                    await join_any()
                if signal.aborted:
                    outcomes[index] = _not_started()
                    commit_ready()
                    continue
                plans[index] = admitted
                inflight[await StartTool(admitted)] = index
                if not safe:
                    await join_any()
            while inflight:
                await join_any()
            commit_ready()
        except Exception as err:
            # Every outcome is committed as soon as it can be: the first uncommitted one
            # set means its commit failed, so it is replaced too.
            for index in range(committed, len(calls)):
                if index == committed or outcomes[index] is None:
                    outcomes[index] = _abandoned(err, ran=index in plans)
            commit_ready()
            raise
        return any(o is not None and o.concludes_turn for o in outcomes)

    def refuse(
        self,
        turn: int,
        step: int,
        calls: Sequence[ToolCallBlock],
        call_seqs: Sequence[int],
        reason: str,
    ) -> None:
        """Answer every call with a ``TOOL_NOT_STARTED`` error result, running none (the
        calls could not be made durable first: the write-ahead rule)."""
        outcome = _error("TOOL_NOT_STARTED", f"this call was not started: {reason}")
        for call, seq in zip(calls, call_seqs, strict=True):
            self._commit(turn, step, call, seq, outcome)

    def _commit(
        self, turn: int, step: int, call: ToolCallBlock, call_seq: int, outcome: ToolOutcome | None
    ) -> None:
        assert outcome is not None
        try:
            event = self._append(self._result(turn, step, call, call_seq, outcome))
        except InvalidEventError as err:  # e.g. an output over the event size limit
            outcome = _refused(f"{_LAST_RESORT}: {err}", outcome)
            try:
                event = self._append(self._result(turn, step, call, call_seq, outcome))
            except InvalidEventError:  # the error's text did not fit either
                # Always fits: the turn refused calls whose id and name leave too little
                # room (``unanswerable``).
                outcome = _refused(_LAST_RESORT, outcome)
                event = self._append(self._result(turn, step, call, call_seq, outcome))
        if not self._listened("tools/result"):
            return
        self._emit(
            "tools/result",
            ToolResultEvent(
                agent=self._agent,
                turn=turn,
                step=step,
                call_id=call.call_id,
                name=call.name,
                seq=event.seq,
                is_error=outcome.error is not None,
            ),
        )

    @staticmethod
    def _result(
        turn: int, step: int, call: ToolCallBlock, call_seq: int, outcome: ToolOutcome
    ) -> ToolResultData:
        message = ToolMessage(
            call_id=call.call_id,
            name=call.name,
            content=tuple(outcome.content),
            is_error=outcome.error is not None,
        )
        return ToolResultData(
            turn=turn,
            step=step,
            message=message,
            error=outcome.error,
            concludes_turn=outcome.concludes_turn,
            source_event_seqs=(call_seq,),
        )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: JSON has no infinity, and the log could not hold it
        raise ValueError(f"{text} is out of the range of a float")
    return value


# One decoder for every call's arguments (json.loads with an option builds one a call).
_ARGUMENTS: Final = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


class ReadOnlyDict(dict[str, Any]):
    """A JSON object of a call's arguments as listeners see it: a ``dict`` (it encodes
    as one) that refuses changes, so that what listeners see stays what the body runs
    and what ``tool/call`` logged (CONTRACT 6: listeners decide, wrap or replace the
    output; they do not rewrite the arguments)."""

    __slots__ = ()

    def _refuse(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TypeError(
            "a tool call's arguments are read-only: they are what the model sent and the "
            "log holds; deny the call (tools/pre-execute) or wrap the body (tools/execute)"
        )

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse


def _read_only(value: Any) -> Any:
    """``value`` (decoded JSON) with every object a :class:`ReadOnlyDict` and every array
    a tuple."""
    if type(value) is dict:
        return ReadOnlyDict({k: _read_only(v) for k, v in value.items()})
    if type(value) is list:
        return tuple(_read_only(v) for v in value)
    return value
