"""The turn/step machine of the seeds, as a coroutine its agent actor steps.

``drain()`` reads top to bottom: claim, pre-step, step (request, stream, tools), turn
stopping, turn end, settle — and again while work is owed. It never touches a thread or
an event loop: where it needs the outside world it awaits an effect
(:mod:`actors.effects`). Every committed ``turn/start`` gets a ``turn/end`` and every
committed ``step/start`` a ``step/end``, whatever happens in between.

The loop (``drain``, ``_chain``, ``_turn``, ``_step``) stays one piece, a little over
500 lines: its parts share the open turn's state (signal, latches, counters) and read
top to bottom as the seeds' ``turn()``/``step()``; what each phase does apart from the
loop lives beside it (:mod:`.reply`, :mod:`.request`, :mod:`.retry`).
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
    Aborted,
    Blocked,
    Completed,
    DiskFullError,
    Errored,
    InvalidEventError,
    LimitExceeded,
    LlmFailure,
    LlmRetry,
    MaxTokens,
    MessageTrigger,
    RequestConfig,
    RetryTrigger,
    StepEnd,
    StepStart,
    Trigger,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
    UserMessageData,
    cause_reason_bytes,
)

from ..effects import Admit, Checkpoint, Sleep, TurnAborted, outcome_of
from ..errors import ModelError
from ..events import (
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
    SessionFlush,
    TurnStopping,
)
from ..inbox import Inbox
from ..limits import Admission, UsageMeter
from ..model import ModelRequest
from ..signal import TurnSignal, loggable_cause
from ..toolphase import ToolPhase
from .reply import FLUSH, Exchange, StepResult, not_durable
from .request import HeaderLog, checked_batch, take_request
from .retry import bounded, decide_retry, listener_failure

__all__ = ["Durability", "TurnMachine"]

log = logging.getLogger("corral.turn")

Durability = Literal["write-ahead", "turn", "none"]


_GO_ON: Final = (Completed, MaxTokens)  # turn ends after which queued work starts at once


def _always(_name: str) -> bool:
    return True


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
        self._exchange = Exchange(
            session=session, tools=tools, meters=self.meters, durability=durability
        )
        self.admission = admission
        self.on_request = on_request
        self.status: AgentStatus = "idle"
        # The last seq a session/flush checkpoint reported durable (the first one
        # reports what was appended since the agent went live).
        self._checkpointed: int = session.last_seq
        self.signal: TurnSignal | None = None
        self.turn_open = False
        # The actor stops (a crash, a kill, a forced stop) with a turn under way: closing
        # the coroutine must log nothing more. A step/end would close a step whose tool
        # calls are unanswered; the turn stays open for the resume to repair (CONTRACT 7).
        self.stopping = False
        self.draining = False
        self.latched_wake = False
        # The session's last turn number and latest request/header, read from its state
        # once (at the first turn) and kept current by _chain and HeaderLog.write: only this
        # machine appends turns and headers to its session (resume repairs before it runs).
        self._last_turn: int | None = None
        self._headers = HeaderLog(session)
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
                self._headers.last = state.last_header
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
            try:
                await FLUSH
            except DiskFullError as err:
                # The turn ended, its turn/end is held, not durable: it does not settle
                # (settled means durable); the agent goes on (see docs/durability.md).
                self._error(turn, None, not_durable(err))
                return
            # The session/flush checkpoint (CONTRACT 7): its listeners, in parallel, are
            # awaited before the turn counts as settled; a cancel does not cut them short.
            last = self.session.last_seq
            if last > self._checkpointed and self._listened("session/flush"):
                flushed = SessionFlush(
                    agent=self.agent, first_seq=self._checkpointed + 1, last_seq=last
                )
                self._checkpointed = last
                await outcome_of(
                    "session/flush",
                    self.bus.parallel("session/flush", flushed, scope=self._scope),
                    abortable=False,
                )
            else:
                self._checkpointed = last
        if self._maybe("agent/settled"):
            self.emit("agent/settled", AgentSettled(agent=self.agent, turn=turn, reason=reason))

    def _aborted(self, signal: TurnSignal) -> Aborted:
        assert signal.reason is not None
        # The signal checked the cause; a cause changed since must still give a turn/end
        # that can be logged (and read back), not crash the actor or corrupt the log.
        cause = loggable_cause(signal.reason, cause_reason_bytes(self._max_event_bytes))
        return Aborted(reason=cause)

    def _error(self, turn: int, step: int | None, failure: LlmFailure) -> Errored:
        failure = bounded(failure)
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
                    return self._error(turn, None, listener_failure("agent/pre-step", err)), None
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
                        messages = checked_batch(
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
                return self._error(turn, step, listener_failure("agent/turn-stopping", err)), None
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
        result: StepResult,
        signal: TurnSignal,
        prior: Sequence[LlmFailure],
    ) -> tuple[TurnEndReason, Retry | None]:
        assert result.failure is not None
        failure = bounded(result.failure)
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
        try:
            decided = await decide_retry(self._waterfall, event, failure, signal)
        except TurnAborted:
            return self._aborted(signal), None
        if decided is None:  # aborted while its listeners decided
            return self._aborted(signal), None
        failure, retry = decided
        if retry is not None:
            return Errored(error=failure), retry
        return self._error(turn, step, failure), None

    # ------------------------------------------------------------------ one step

    async def _step(
        self, turn: int, step: int, messages: tuple[UserMessage, ...], signal: TurnSignal
    ) -> StepResult:
        append = self.session.append_fact
        append(StepStart(turn=turn, step=step))
        closable = True
        try:
            try:
                for message in messages:
                    append(UserMessageData(message=message, turn=turn, step=step))
            except InvalidEventError as err:  # e.g. over the event size limit
                failure = LlmFailure(message=f"a user message cannot be logged: {err}")
                return StepResult(failure=failure, offer=False)
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
                return StepResult()
            except Exception as err:  # noqa: BLE001 - request listener faults are not offered
                return StepResult(failure=listener_failure("agent/request", err), offer=False)
            if not isinstance(config, RequestConfig):
                failure = LlmFailure(
                    message=f"agent/request must produce a RequestConfig, got {config!r}"
                )
                return StepResult(failure=failure, offer=False)
            specs = self.tools.specs()
            try:
                config = self._headers.write(turn, step, config, specs, self.system)
            except (TypeError, ValueError, msgspec.MsgspecError, InvalidEventError) as err:
                failure = LlmFailure(message=f"the request cannot be logged: {err}")
                return StepResult(failure=failure, offer=False)
            if self.durability == "write-ahead":
                try:
                    await FLUSH
                except DiskFullError as err:  # the request is not sent: the turn ends error
                    return StepResult(failure=not_durable(err), offer=False)
            if signal.aborted:
                return StepResult()
            request = ModelRequest(
                config=config,
                messages=self.session.derive_messages(),
                system=self.system,
                tools=specs,
                max_reply_bytes=self._max_event_bytes,
            )
            if self.meters:  # the request counts now, or the turn ends at its limit
                limited = take_request(self.meters)
                if limited is not None:
                    return StepResult(end=limited)
            if self.on_request is not None:
                self.on_request(request)
            return await self._exchange.run(turn, step, request, signal)
        except BaseException:
            # A step/end must never follow an unanswered tool/call (no tool/result can
            # come after it): such a step stays open, for the resume's crash repair.
            closable = not self.session.state.open_calls
            raise
        finally:
            if closable and not self.stopping:  # else the resume's crash repair closes it
                append(StepEnd(turn=turn, step=step))
