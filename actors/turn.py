"""The turn/step machine of the seeds, as a coroutine its agent actor steps.

``drain()`` reads top to bottom: claim, pre-step, step (request, stream, tools), turn
stopping, turn end, settle — and again while work is owed. It never touches a thread or
an event loop: where it needs the outside world it awaits an effect
(:mod:`actors.effects`). Every committed ``turn/start`` gets a ``turn/end`` and every
committed ``step/start`` a ``step/end``, whatever happens in between.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, Literal

import msgspec

from storage import (
    CITATION_BYTES,
    CITED_SHARE,
    DIRECT_SHARE,
    MAX_FAILURE_CHARS,
    Aborted,
    AssistantChunk,
    AssistantMessageData,
    Blocked,
    Completed,
    Errored,
    EventTooLargeError,
    InvalidEventError,
    LimitExceeded,
    LlmFailure,
    LlmRetry,
    MaxTokens,
    MessageTrigger,
    RequestConfig,
    RequestHeader,
    RetryTrigger,
    StepEnd,
    StepStart,
    ToolCallData,
    ToolSpec,
    Trigger,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
    UserMessageData,
    cause_reason_bytes,
    reply_bytes,
)

from .assembly import Assembler, HeldChunks
from .effects import (
    Admit,
    Checkpoint,
    Flush,
    NextBatch,
    OpenStream,
    Sleep,
    StreamEnd,
    TurnAborted,
    outcome_of,
)
from .errors import ListenerError
from .inbox import Inbox
from .limits import Admission, UsageMeter
from .live import (
    AgentError,
    AgentLike,
    AgentSettled,
    AgentStatus,
    AgentStatusChanged,
    Enter,
    PreStep,
    Reject,
    RequestError,
    RequestEvent,
    Retry,
    TurnSignal,
    TurnStopping,
    loggable_cause,
    retry_delay_problem,
)
from .model import ModelError, ModelRequest, checked_failure
from .streams import StreamHandle
from .toolphase import ToolPhase, unanswerable
from .tools import described, shown

__all__ = ["Durability", "TurnMachine"]

log = logging.getLogger("corral.turn")

Durability = Literal["write-ahead", "turn", "none"]


class _StepResult(msgspec.Struct, frozen=True):
    """How one step ended. ``failure`` set: the request failed (``offer``: to request-error)."""

    more: bool = False
    end: TurnEndReason | None = None
    failure: LlmFailure | None = None
    error: BaseException | None = None
    offer: bool = True


_GO_ON: Final = (Completed, MaxTokens)  # turn ends after which queued work starts at once
_FLUSH: Final = Flush()  # stateless: one instance serves every wait
_DONE: Final = _StepResult()  # a step that ended normally, nothing more to do
_ENCODER: Final = msgspec.json.Encoder()
_MESSAGES: Final = msgspec.json.Decoder(tuple[UserMessage, ...])
_CONFIG: Final = msgspec.json.Decoder(RequestConfig)
_SPECS: Final = msgspec.json.Decoder(tuple[ToolSpec, ...])
# A reply's chunks are logged one per delta, then gathered (:class:`HeldChunks`): see
# the citation shares in storage.budget.


def _checked(
    messages: Sequence[UserMessage],
    owed: Counter[str],
    was_inboxed: Callable[[str], bool],
    pending: Callable[[str], bool],
) -> tuple[UserMessage, ...]:
    """A pre-step listener's rewritten batch, each field type checked (msgspec does not
    check at construction, and an ill-typed fact would be logged but never read back), as
    typed messages decoded afresh (a content block given as a dict is logged as what it
    reads back as; nothing the listener still holds is shared with the log), each message
    once (a message is entered into the history once per claim).

    A message that went through the inbox (``was_inboxed``) enters only as claimed in
    this turn and not entered yet (``owed``, counted down here): one still pending would
    be entered unclaimed (and run again once claimed), one claimed before entered twice.
    A message of the listener's own (an id the inbox never held) may enter freely."""
    batch = _MESSAGES.decode(_ENCODER.encode(tuple(messages)))  # raises on a wrong type
    ids = [message.id for message in batch]
    if len(set(ids)) < len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"the batch holds message {twice!r} more than once")
    for message_id in ids:
        if owed[message_id] > 0:
            owed[message_id] -= 1
        elif pending(message_id):
            raise ValueError(
                f"message {message_id!r} is still pending in the inbox: it enters once claimed"
            )
        elif was_inboxed(message_id):
            raise ValueError(
                f"message {message_id!r} was not claimed in this turn (it went through the "
                "inbox before: entered in an earlier step or turn, or discarded); a message "
                "enters the history once per claim"
            )
    return batch


def _always(_name: str) -> bool:
    return True


def _announced(stream: Any) -> Sequence[Any] | None:
    """What ``await NextBatch(stream)`` would resolve to at once (chunks already
    announced, in mailbox order, or their failure raised), without the round trip
    through the stepper; None when the batch must be awaited (or ``stream`` is not a
    :class:`StreamHandle`, e.g. a test's stand-in)."""
    if stream.__class__ is not StreamHandle:
        return None
    items, error = stream.take()
    if error is not None:
        raise error
    return items or None


def _unloggable(err: InvalidEventError) -> _StepResult:
    failure = LlmFailure(message=f"the model's reply cannot be logged: {err}")
    return _StepResult(failure=failure, error=err)


def _too_large(assembler: Assembler, limit: int) -> _StepResult:
    """A reply that outgrew the event limit while it streamed: its ``assistant/message``
    would hold more characters than the limit has bytes (each takes at least one) once
    the citations of its chunks (``sourceEventSeqs``) are counted."""
    return _unloggable(
        EventTooLargeError(
            f"it is too large: it streamed {assembler.streamed} characters of text, "
            f"reasoning and tool-call arguments, which with the {assembler.cited} bytes "
            f"citing its {len(assembler.chunk_seqs)} chunks are more than its "
            f"'assistant/message' may hold (the limit is {limit} bytes); the model call was "
            "stopped; ask for a shorter reply, or raise max_event_bytes"
        )
    )


def _gather_size(assembler: Assembler, limit: int) -> int:
    """How many characters a gathered chunk should hold before it is logged: enough that
    the chunks still to come, however small the deltas, cite within what is left of the
    citation budget (``limit // CITED_SHARE``) for the largest reply the limit allows."""
    left = limit // CITED_SHARE - assembler.cited
    return max(1, (limit - assembler.streamed) * CITATION_BYTES // max(left, CITATION_BYTES))


def _bounded(failure: LlmFailure) -> LlmFailure:
    """A failure that fits in a log record: well formed (a model may build a malformed
    one by hand: see ``checked_failure``); a server may send megabytes of error text, or
    text that is not UTF-8 (a lone surrogate)."""
    failure = checked_failure(failure)
    message = failure.message
    if len(message) > MAX_FAILURE_CHARS:
        rest = len(message) - MAX_FAILURE_CHARS
        message = f"{message[:MAX_FAILURE_CHARS]}... ({rest} more characters)"
    message = message.encode("utf-8", "replace").decode("utf-8")
    if message == failure.message:
        return failure
    return msgspec.structs.replace(failure, message=message)


def _listener_failure(name: str, err: BaseException) -> LlmFailure:
    cause = err.cause if isinstance(err, ListenerError) else err
    return LlmFailure(message=f"{name} listener failed: {cause!r}", code="UNKNOWN")


class TurnMachine:
    """One agent's loop. Owned by its actor; never shared between threads."""

    def __init__(
        self,
        *,
        agent: AgentLike,
        session: Any,
        inbox: Inbox,
        bus: Any,
        tools: ToolPhase,
        default_config: Callable[[], RequestConfig],
        system: str | None = None,
        durability: Durability = "write-ahead",
        max_steps: int | None = None,
        meters: Sequence[UsageMeter] = (),
        admission: Admission | None = None,
        on_request: Callable[[ModelRequest], None] | None = None,
    ) -> None:
        self.agent = agent
        self._scope = agent.id  # the bus scope of every event of this agent
        self.session = session
        self._max_event_bytes: int = session.codec.max_event_bytes
        self.inbox = inbox
        self.bus = bus
        self.tools = tools
        self.default_config = default_config
        self.system = system
        self.durability = durability
        # Logged on each turn/start unless write-ahead (see TurnStart.durability).
        self._logged_durability: Literal["turn", "none"] | None = (
            None if durability == "write-ahead" else durability
        )
        self.max_steps = max_steps
        self.meters = tuple(meters)
        self.admission = admission
        self.on_request = on_request
        self.status: AgentStatus = "idle"
        self.signal: TurnSignal | None = None
        self.turn_open = False
        # The actor stops (a crash, a kill, a forced stop) with a turn under way: closing
        # the coroutine must log nothing more. A step/end would close a step whose tool
        # calls are unanswered; the turn stays open for the resume to repair (CONTRACT 7).
        self.stopping = False
        self.draining = False
        self.latched_wake = False
        # The session's last turn number and latest request/header, read from its state
        # once (at the first turn) and kept current by _chain and _write_header: only this
        # machine appends turns and headers to its session (resume repairs before it runs).
        self._last_turn: int | None = None
        self._last_header: RequestHeader | None = None
        # The tool registry's specs the last header was written for (it holds a copy).
        self._header_specs: tuple[ToolSpec, ...] | None = None
        # ``maybe(name)`` False: no listener of any scope has ``name`` (its payload is not
        # built); a bus without ``maybe_listened`` is always asked.
        self._maybe: Callable[[str], bool] = getattr(bus, "maybe_listened", None) or _always
        # Set by the stepper: True when nothing is queued for it, so a Checkpoint would
        # resolve at once (it is then not awaited). None: every Checkpoint is awaited.
        self.quiet: Callable[[], bool] | None = None

    # ------------------------------------------------------------------ helpers

    def emit(self, name: str, payload: Any) -> None:
        self.bus.emit(name, payload, scope=self._scope)

    def _listened(self, name: str) -> bool:
        """Whether an event of ``name`` reaches a listener: if not, its payload is not built."""
        return self._maybe(name) and bool(self.bus.has_listeners(name, scope=self._scope))

    def _set_status(self, status: AgentStatus) -> None:
        if status != self.status:
            self.status = status
            if self._maybe("agent/status") and self._listened("agent/status"):
                self.emit("agent/status", AgentStatusChanged(agent=self.agent, status=status))

    async def _waterfall(self, name: str, event: Any, default: Callable[[], Any]) -> Any:
        return await outcome_of(name, self.bus.waterfall(name, event, default, scope=self._scope))

    async def _serial(self, name: str, event: Any) -> None:
        await outcome_of(name, self.bus.serial(name, event, scope=self._scope))

    @property
    def unwinding(self) -> bool:
        """An aborted turn's chain has not converged yet: a wake now is forced to
        ``next-turn`` and latched (it runs once the aborted turn has settled)."""
        return self.is_unwinding()

    def is_unwinding(self) -> bool:
        """:attr:`unwinding` as a method (a bound method is one call, a property two)."""
        signal = self.signal
        return self.draining and signal is not None and signal.aborted

    # ------------------------------------------------------------------ the loop

    async def drain(self) -> None:
        """Run turns while work is owed; ``running`` for the whole chain, then ``idle``."""
        if not len(self.inbox):
            return
        admission = self.admission
        if admission is not None:
            try:
                await Admit(admission)  # beyond max_running_turns, work waits its turn
            except TurnAborted:
                return
        try:
            if admission is not None and not len(self.inbox):  # changed while it waited
                return
            self._set_status("running")
            self.draining = True
            try:
                await self._chain()
            finally:
                self.draining = False
                self.latched_wake = False
                self._set_status("idle")
        finally:
            if admission is not None:
                admission.leave()

    async def _chain(self) -> None:
        retry: Retry | None = None
        failed_turn: int | None = None
        prior: list[LlmFailure] = []
        delay = 0.0  # how long the next turn, a retry turn, waits before its first step
        carried: Any = None  # the cause of a cancel handled between two turns of the chain
        while True:
            trigger: Trigger
            if retry is not None:
                trigger = RetryTrigger(previous_turn=failed_turn)
            elif len(self.inbox):
                trigger = MessageTrigger()
            else:
                return
            # A wake latched before this turn is this turn's queued work now: what it
            # becomes depends on how this turn ends, as for any queued message.
            self.latched_wake = False
            last_turn = self._last_turn
            if last_turn is None:  # a snapshot of the session's state is not free
                state = self.session.state
                last_turn = state.last_turn
                self._last_header = state.last_header
            turn = last_turn + 1
            # A retry turn's signal is aborted with the failed turn's (see TurnSignal).
            signal = self.signal = TurnSignal(None if retry is None else self.signal)
            if carried is not None:  # it aborts this turn, as a cancel right after a wake
                signal.abort(carried)
                carried = None
            self.session.append_fact(
                TurnStart(turn=turn, trigger=trigger, durability=self._logged_durability)
            )
            self._last_turn = turn
            self.turn_open = True
            # A retry turn opens at once and waits out its delay open (see _turn), so
            # that a cancel meanwhile ends it aborted and a crash leaves it open for the
            # resume to close as interrupted: the log never announces a retry turn it
            # does not hold. It claims once the wait is over.
            batch = () if delay > 0 else self.inbox.claim(turn, new_turn=retry is None)
            reason, retry = await self._turn(turn, trigger, batch, signal, prior, delay)
            failure = reason.error if retry is not None and isinstance(reason, Errored) else None
            delay = 0.0 if retry is None else retry.delay_s or 0.0
            if failure is not None and not signal.aborted:
                self.session.append_fact(
                    LlmRetry(turn=turn, attempt=len(prior) + 1, delay_s=delay, failure=failure)
                )
            if failure is not None and signal.aborted:
                # A cancel landed before the retry turn opened (from another thread, or
                # an observer of the llm/retry): abort is classified before error.
                reason, failure = self._aborted(signal), None
            self.session.append_fact(TurnEnd(turn=turn, reason=reason))
            self.turn_open = False
            if failure is not None:
                prior.append(failure)
                failed_turn = turn
                continue
            retry = None  # the chain ends here; a turn it goes on with is a new one
            await self._settle(turn, reason)
            prior.clear()
            quiet = self.quiet
            if quiet is None or not quiet():
                # What a sync agent/settled listener sent (a followup, a cancel) is
                # queued to us: let it land before deciding whether the chain goes on,
                # so that a followup keeps the agent running (no idle between turns, after
                # an aborted turn too: it is the waking send that ends the parking) and
                # a cancel aborts the turn it opens (below), not one further on.
                with contextlib.suppress(TurnAborted):
                    await Checkpoint()
            if isinstance(reason, _GO_ON):
                # A cancel handled while this turn settled (between two turns of the
                # chain) aborts the turn the queued work opens: a no-step aborted turn,
                # as for a cancel right after a waking send (CONTRACT 4); what is queued
                # behind it stays parked.
                carried = signal.reason if signal.aborted else None
                continue
            if self.latched_wake:  # a wake that came after the turn ended, or a cancel
                self.latched_wake = False
                continue
            return

    def active_signal(self) -> TurnSignal | None:
        """The signal a cancel aborts now: the open turn's (a retry turn's during its
        delay too). None between chains."""
        return self.signal if self.turn_open else None

    async def _settle(self, turn: int, reason: TurnEndReason) -> None:
        if self.durability != "none":
            await _FLUSH
        if self._maybe("agent/settled"):
            self.emit("agent/settled", AgentSettled(agent=self.agent, turn=turn, reason=reason))

    def _aborted(self, signal: TurnSignal) -> Aborted:
        assert signal.reason is not None
        # The signal checked the cause; a cause changed since must still give a turn/end
        # that can be logged (and read back), not crash the actor or corrupt the log.
        cause = loggable_cause(signal.reason, cause_reason_bytes(self._max_event_bytes))
        return Aborted(reason=cause)

    def _error(self, turn: int, step: int | None, failure: LlmFailure) -> Errored:
        failure = _bounded(failure)
        self.emit("agent/error", AgentError(agent=self.agent, turn=turn, step=step, error=failure))
        return Errored(error=failure)

    async def _turn(
        self,
        turn: int,
        trigger: Trigger,
        batch: tuple[UserMessage, ...],
        signal: TurnSignal,
        prior: Sequence[LlmFailure],
        delay: float = 0.0,
    ) -> tuple[TurnEndReason, Retry | None]:
        step = 0
        proposal = batch  # claimed for the next step: immutable, handed out as it is
        # Claimed in this turn and not entered (yet), only ever by a pre-step listener's
        # rewritten batch (else a step enters exactly what was claimed): None until then.
        owed: Counter[str] | None = None
        quiet = self.quiet
        try:
            if delay > 0:  # a retry turn's wait before its first step
                await Sleep(delay)
                if signal.aborted:
                    return self._aborted(signal), None
                proposal = self.inbox.claim(turn, new_turn=False)
            elif quiet is None or not quiet():  # else it would resolve at once
                await Checkpoint()
        except TurnAborted:
            return self._aborted(signal), None
        while True:
            if signal.aborted:
                return self._aborted(signal), None
            limited = self._limited(step)
            if limited is not None:
                return limited, None
            if self._maybe("agent/pre-step") and self._listened("agent/pre-step"):
                event = PreStep(
                    agent=self.agent, messages=proposal, turn=turn, step=step + 1, signal=signal
                )
                try:
                    decision = await self._waterfall(
                        "agent/pre-step", event, partial(Enter, messages=proposal)
                    )
                except TurnAborted:
                    return self._aborted(signal), None
                except Exception as err:  # noqa: BLE001 - a listener fault ends the turn
                    if signal.aborted:  # abort is classified before error
                        return self._aborted(signal), None
                    return self._error(turn, None, _listener_failure("agent/pre-step", err)), None
                if signal.aborted:
                    return self._aborted(signal), None
                if isinstance(decision, Reject):
                    return Blocked(), None
                if not isinstance(decision, Enter):
                    failure = LlmFailure(
                        message=f"agent/pre-step must return Enter or Reject, got {decision!r}"
                    )
                    return self._error(turn, None, failure), None
                try:
                    if decision.messages is proposal:  # the claimed batch, as it is
                        messages = proposal
                    else:
                        if owed is None:
                            owed = Counter()
                        owed.update(message.id for message in proposal)
                        messages = _checked(
                            decision.messages, owed, self.session.was_inboxed, self.inbox.holds
                        )
                except (TypeError, ValueError, msgspec.MsgspecError) as err:
                    failure = LlmFailure(
                        message=f"agent/pre-step returned an invalid batch of UserMessages: {err}"
                    )
                    return self._error(turn, None, failure), None
            else:
                if signal.aborted:
                    return self._aborted(signal), None
                messages = proposal  # the waterfall's default: Enter(messages=proposal)
            if not messages and step == 0 and isinstance(trigger, MessageTrigger):
                return Completed(), None
            step += 1
            result = await self._step(turn, step, messages, signal)
            if signal.aborted:
                return self._aborted(signal), None
            if result.failure is not None:
                return await self._failed(turn, step, result, signal, prior)
            if result.end is not None:
                return result.end, None
            if quiet is not None and not quiet():
                # What the agent's own listeners sent during the step (a steer from an
                # observer of its facts) is queued to us: let it land before deciding.
                try:
                    await Checkpoint()
                except TurnAborted:
                    return self._aborted(signal), None
                if signal.aborted:
                    return self._aborted(signal), None
            if self.inbox.lane_size("next-step"):
                # Steering asks for another step: claimed only if one may follow (a
                # claimed message must be entered; else it stays for the next turn).
                limited = self._limited(step)
                if limited is not None:
                    return limited, None
                proposal = self.inbox.claim(turn, new_turn=False)
                continue
            if result.more:
                proposal = ()
                continue
            if not self._listened("agent/turn-stopping"):
                return Completed(), None
            try:
                await self._serial(
                    "agent/turn-stopping",
                    TurnStopping(agent=self.agent, turn=turn, step=step, signal=signal),
                )
                await Checkpoint()  # a listener's steer is queued to us: let it land first
            except TurnAborted:
                return self._aborted(signal), None
            except Exception as err:  # noqa: BLE001 - a throwing listener ends the turn as error
                if signal.aborted:
                    return self._aborted(signal), None
                return self._error(turn, step, _listener_failure("agent/turn-stopping", err)), None
            if signal.aborted:
                return self._aborted(signal), None
            if not self.inbox.lane_size("next-step"):
                return Completed(), None
            limited = self._limited(step)
            if limited is not None:
                return limited, None
            proposal = self.inbox.claim(turn, new_turn=False)

    def _limited(self, steps: int) -> LimitExceeded | None:
        """Why no further step may follow ``steps`` steps (a usage limit, ``max_steps``)."""
        for meter in self.meters:
            limited = meter.exceeded()
            if limited is not None:
                return limited
        if self.max_steps is not None and steps >= self.max_steps:
            message = f"the turn reached its limit of {self.max_steps} steps"
            return LimitExceeded(limit="max_steps", message=message)
        return None

    async def _failed(
        self,
        turn: int,
        step: int,
        result: _StepResult,
        signal: TurnSignal,
        prior: Sequence[LlmFailure],
    ) -> tuple[TurnEndReason, Retry | None]:
        assert result.failure is not None
        failure = _bounded(result.failure)
        if not result.offer:
            return self._error(turn, step, failure), None
        event = RequestError(
            agent=self.agent,
            turn=turn,
            step=step,
            error=result.error or ModelError(failure),
            failure=failure,
            prior_failures=tuple(prior),
            signal=signal,
        )
        # What the listeners did wrong, if anything: named in the failure the turn ends
        # with (as pre-step and request name theirs), which keeps the request's code.
        problem: str | None = None
        try:
            decision = await self._waterfall("agent/request-error", event, lambda: None)
        except TurnAborted:
            return self._aborted(signal), None
        except Exception as err:  # a throwing listener: no retry
            log.exception("agent/request-error listener failed; the turn ends as error")
            problem = _listener_failure("agent/request-error", err).message
            decision = None
        if signal.aborted:
            return self._aborted(signal), None
        if isinstance(decision, Retry):
            # Retry checks its delay when made; one changed since must not be logged
            # (llm/retry) or waited for.
            bad_delay = retry_delay_problem(decision.delay_s)
            if bad_delay is None:
                return Errored(error=failure), decision
            problem = f"agent/request-error returned a Retry whose {bad_delay}"
        elif decision is not None:
            problem = f"agent/request-error must return a Retry or None, got {shown(decision)}"
        if problem is not None:
            if decision is not None:
                log.error("%s; the turn ends as error without a retry", problem)
            failure = msgspec.structs.replace(
                failure, message=f"{failure.message} (no retry: {problem})"
            )
        return self._error(turn, step, failure), None

    # ------------------------------------------------------------------ one step

    async def _step(
        self, turn: int, step: int, messages: tuple[UserMessage, ...], signal: TurnSignal
    ) -> _StepResult:
        append = self.session.append_fact
        append(StepStart(turn=turn, step=step))
        closable = True
        try:
            try:
                for message in messages:
                    append(UserMessageData(message=message, turn=turn, step=step))
            except InvalidEventError as err:  # e.g. over the event size limit
                failure = LlmFailure(message=f"a user message cannot be logged: {err}")
                return _StepResult(failure=failure, offer=False)
            try:
                if self._maybe("agent/request") and self._listened("agent/request"):
                    config = await self._waterfall(
                        "agent/request",
                        RequestEvent(agent=self.agent, turn=turn, step=step, signal=signal),
                        self.default_config,
                    )
                else:
                    config = self.default_config()  # the waterfall's default
            except TurnAborted:
                return _StepResult()
            except Exception as err:  # noqa: BLE001 - request listener faults are not offered
                return _StepResult(failure=_listener_failure("agent/request", err), offer=False)
            if not isinstance(config, RequestConfig):
                failure = LlmFailure(
                    message=f"agent/request must produce a RequestConfig, got {config!r}"
                )
                return _StepResult(failure=failure, offer=False)
            specs = self.tools.specs()
            try:
                config = self._write_header(turn, step, config, specs)
            except (TypeError, ValueError, msgspec.MsgspecError, InvalidEventError) as err:
                failure = LlmFailure(message=f"the request cannot be logged: {err}")
                return _StepResult(failure=failure, offer=False)
            if self.durability == "write-ahead":
                await _FLUSH
            if signal.aborted:
                return _StepResult()
            request = ModelRequest(
                config=config,
                messages=self.session.derive_messages(),
                system=self.system,
                tools=specs,
                max_reply_bytes=self._max_event_bytes,
            )
            if self.meters:  # the request counts now, or the turn ends at its limit
                limited = self._take_request()
                if limited is not None:
                    return _StepResult(end=limited)
            if self.on_request is not None:
                self.on_request(request)
            return await self._exchange(turn, step, request, signal)
        except BaseException:
            # A step/end must never follow an unanswered tool/call (no tool/result can
            # come after it): such a step stays open, for the resume's crash repair.
            closable = not self.session.state.open_calls
            raise
        finally:
            if closable and not self.stopping:  # else the resume's crash repair closes it
                append(StepEnd(turn=turn, step=step))

    def _unchanged(self, config: RequestConfig, specs: tuple[ToolSpec, ...]) -> bool:
        """Whether the last ``request/header`` holds this request's configuration."""
        last = self._last_header
        if last is None or last.config != config or last.system != self.system:
            return False
        if specs is self._header_specs:
            return True
        if last.tools == specs:  # e.g. the first request after a resume
            self._header_specs = specs
            return True
        return False

    def _write_header(
        self, turn: int, step: int, config: RequestConfig, specs: tuple[ToolSpec, ...]
    ) -> RequestConfig:
        """Log a ``request/header`` if the request's configuration changed; return the
        config the request is sent with: the one the log holds."""
        if self._unchanged(config, specs):
            assert self._last_header is not None
            return self._last_header.config
        # Field types checked (msgspec does not check at construction), as fresh copies
        # that nothing outside holds: a listener's config (its ``stop`` a list it keeps)
        # and the tool registry's specs (their ``parameters`` dicts) are not handed to
        # session/event observers; what the model is sent stays what the log holds.
        config = _CONFIG.decode(_ENCODER.encode(config))
        if self._unchanged(config, specs):  # equal once decoded (a stop given as a list)
            assert self._last_header is not None
            return self._last_header.config
        tools = _SPECS.decode(_ENCODER.encode(specs))
        header = RequestHeader(turn=turn, step=step, config=config, system=self.system, tools=tools)
        self.session.append_fact(header)
        self._last_header = header
        self._header_specs = specs
        return config

    def _take_request(self) -> LimitExceeded | None:
        """Count the request about to be sent on every meter, or none of them: the
        first limit it would pass (a check at the step's start can race with other
        agents spending the same runtime-wide limit)."""
        taken: list[UsageMeter] = []
        for meter in self.meters:
            limited = meter.take_request()
            if limited is not None:
                for earlier in taken:
                    earlier.give_back_request()
                return limited
            taken.append(meter)
        return None

    def _log_held(self, held: HeldChunks, assembler: Assembler, turn: int, step: int) -> None:
        """Log the held deltas as gathered chunks, each cited by the reply."""
        append = self.session.append_fact
        for chunk in held.release():
            assembler.cite(append(AssistantChunk(turn=turn, step=step, chunk=chunk)).seq)

    def _log_held_quietly(
        self,
        held: HeldChunks | None,
        assembler: Assembler,
        turn: int,
        step: int,
        reply: str = "failed",
    ) -> None:
        """:meth:`_log_held` for a stream that failed or was cancelled: what it streamed
        is logged if it can be (as every chunk taken before was); the failure, or the
        interrupted prefix, is what the turn goes on with."""
        if held:
            try:
                self._log_held(held, assembler, turn, step)
            except InvalidEventError:
                log.exception("the %s reply's last chunks cannot be logged", reply)

    async def _exchange(
        self, turn: int, step: int, request: ModelRequest, signal: TurnSignal
    ) -> _StepResult:
        append = self.session.append_fact
        assembler = Assembler(turn, step)
        limit = reply_bytes(request.max_reply_bytes)
        direct = limit // DIRECT_SHARE  # citation bytes up to which deltas are logged one by one
        held: HeldChunks | None = None  # made once deltas are gathered
        stream: Any = None
        done = False
        try:
            stream = await OpenStream(request)
            while not done:
                batch = _announced(stream)
                if batch is None:
                    batch = await NextBatch(stream)
                for item in batch:
                    if isinstance(item, StreamEnd):
                        done = True
                        break
                    if assembler.cited < direct:
                        event = append(AssistantChunk(turn=turn, step=step, chunk=item))
                        assembler.add(item, event.seq)
                    else:  # a reply of very many deltas: they are logged gathered
                        if held is None:
                            held = HeldChunks()
                        assembler.take(item)
                        held.hold(item)
                        if held.chars >= _gather_size(assembler, limit):
                            self._log_held(held, assembler, turn, step)
                    if assembler.streamed + assembler.cited > limit:  # could never be logged
                        self._log_held_quietly(held, assembler, turn, step)
                        return _too_large(assembler, limit)  # and the call stops
            if held:
                self._log_held(held, assembler, turn, step)
        except TurnAborted:
            # taken before the cancel: part of the visible prefix
            self._log_held_quietly(held, assembler, turn, step, "interrupted")
            visible = assembler.visible()
            if visible:
                try:
                    append(
                        AssistantMessageData(
                            turn=turn,
                            step=step,
                            message=assembler.message(with_calls=False),
                            usage=assembler.usage,
                            interrupted=True,
                            source_event_seqs=tuple(assembler.chunk_seqs),
                        )
                    )
                except InvalidEventError:
                    log.exception("the interrupted reply's visible prefix cannot be logged")
            return _StepResult()
        except ModelError as err:
            self._log_held_quietly(held, assembler, turn, step)
            return _StepResult(failure=err.failure, error=err)
        except InvalidEventError as err:  # a chunk the log refuses, e.g. over the size limit
            return _unloggable(err)
        except Exception as err:  # noqa: BLE001 - any adapter fault is a request failure
            self._log_held_quietly(held, assembler, turn, step)
            return _StepResult(failure=LlmFailure(message=repr(err), code="UNKNOWN"), error=err)
        finally:
            if not done and stream.__class__ is StreamHandle:
                # Abandoned (a failure, an abort, the actor stopping): the model call must
                # not stream on with no reader, holding its connection and limiter slot.
                stream.cancel()
        if assembler.usage is not None:
            for meter in self.meters:
                meter.count_usage(assembler.usage)
        failure = assembler.failure()
        if failure is not None:
            return _StepResult(failure=failure, error=ModelError(failure))
        truncated = assembler.finish == "max-tokens"
        calls = [] if truncated else assembler.calls()
        if calls:
            refused = unanswerable(calls, self._max_event_bytes)
            if refused is not None:  # a call nothing could answer: the reply is malformed
                failure = LlmFailure(message=refused)
                return _StepResult(failure=failure, error=ModelError(failure))
        try:
            append(
                AssistantMessageData(
                    turn=turn,
                    step=step,
                    message=assembler.message(calls=calls),
                    usage=assembler.usage,
                    finish_reason=assembler.finish,
                    source_event_seqs=tuple(assembler.chunk_seqs),
                )
            )
            call_seqs = [
                append(
                    ToolCallData(
                        turn=turn, step=step, call_id=c.call_id, name=c.name, arguments=c.arguments
                    )
                ).seq
                for c in calls
            ]
        except InvalidEventError as err:  # e.g. a reply over the event size limit
            return _unloggable(err)
        if truncated:
            return _StepResult(end=MaxTokens())
        if not calls:
            return _DONE
        if self.durability == "write-ahead":
            await _FLUSH
        try:
            concluded = await self.tools.run(turn, step, calls, call_seqs, signal)
        except Exception as err:
            if self.session.state.open_calls:  # not every call could be answered
                raise
            # Every call got a result (ToolPhase.run): the step closes, the turn ends error.
            failure = LlmFailure(message=f"the tool phase failed: {described(err)}")
            return _StepResult(failure=failure, offer=False)
        return _StepResult(more=not concluded)
