"""The agent actor: its mailbox is its inbox, and it steps the turn coroutine.

Control envelopes (inserts, edits, cancel, completions of effects) are handled in send
order on a dispatcher thread. The turn coroutine runs until it awaits an effect; the
actor starts the effect on the I/O side and resumes the coroutine when the completion
arrives as a message. So while a model call is in flight the agent still handles
``steer``, ``inject``, ``cancel`` and ``dispose`` at once.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Coroutine
from itertools import count
from typing import Any, Literal

import msgspec
from pykka._envelope import Envelope

from storage import CancelCause, DisposedCause, InboxLane, MessageId, UserMessage

from ._dispatcher import work_for
from ._ioside import IoSide, Outcome
from ._mailbox import Mailbox, MailboxOwner
from ._pooled import PooledActor
from ._scheduler import Scheduler
from .effects import (
    Admit,
    Checkpoint,
    Effect,
    Flush,
    JoinTool,
    NextBatch,
    OpenStream,
    RunAsync,
    Sleep,
    StartTool,
    TurnAborted,
)
from .flushes import FlushGroup
from .inbox import Inbox, InboxView
from .live import TurnSignal, loggable_cause
from .streams import (
    StreamHandle,
    ToolHandle,
    chunks_checked,
    is_immediate,
    open_stream,
    start_tool,
)
from .turn import TurnMachine

__all__ = [
    "AgentActor",
    "AgentMailbox",
    "Announce",
    "AwaitIdle",
    "Barrier",
    "Cancel",
    "Edit",
    "Insert",
    "Kill",
    "Quiescent",
    "apply_edit",
]

log = logging.getLogger("corral.agent")
_get_ident = threading.get_ident

_PENDING: Any = object()


class Insert(msgspec.Struct, frozen=True):
    """Put a reserved message into a lane; ``wake`` starts a turn when idle.

    ``unwinding``: the sender saw an aborted turn still open when it sent this wake; if
    that turn is still unwinding, the wake is forced to ``next-turn`` and latched.
    ``inserted``: the sender (one of the agent's own listeners, on its actor) put the
    message into the inbox itself; only the wake is left to handle.
    """

    lane: InboxLane
    message: UserMessage
    wake: bool
    unwinding: bool = False
    inserted: bool = False


class Edit(msgspec.Struct, frozen=True):
    """A supervisor's inbox edit; answered through ``ask``. ``splice`` is the general
    form: in ``lane``, remove ``removed_count`` messages from ``start`` and insert
    ``messages`` (reserved) there. ``reused``: the ids of inserted messages that were
    pending, among those the edit removes, when it was sent (not reserved again: see
    ``Inbox.reserve_all``)."""

    op: Literal["remove", "replace", "clear", "splice"]
    message_id: MessageId | None = None
    message: UserMessage | None = None
    lane: InboxLane = "next-turn"
    start: int = 0
    removed_count: int = 0
    messages: tuple[UserMessage, ...] = ()
    reused: frozenset[MessageId] = frozenset()


class Cancel(msgspec.Struct, frozen=True):
    """``target``: the turn that was active when cancel was called (already aborted in
    the caller's thread), or None if none was: then the turn active now is aborted."""

    cause: CancelCause
    keep_inbox: bool = False
    target: TurnSignal | None = None


class Announce(msgspec.Struct, frozen=True):
    """Ask: call ``callback`` on the actor. The runtime sends it as a new agent's first
    message, to announce it there (``agent/created``, then ``agent/session-start``):
    whatever the listeners of those send waits in the mailbox behind it, so no work
    starts before both are announced (CONTRACT 2)."""

    callback: Callable[[], None]


class Quiescent(msgspec.Struct, frozen=True):
    """Tell: call ``callback`` (on the actor) with True when the agent is idle with
    nothing queued (it may be passivated), else False."""

    callback: Callable[[bool], None]


class AwaitIdle(msgspec.Struct, frozen=True):
    """Call ``callback`` once every envelope sent before this one ran and the agent is idle."""

    callback: Callable[[], None]


class Barrier(msgspec.Struct, frozen=True):
    """Ask: answered once every envelope sent before it ran, so the facts of every
    message told before it (a send's splice, a cancel's discards) are appended
    (``Runtime.flush`` waits for it)."""


class Kill(msgspec.Struct, frozen=True):
    """Crash the actor on purpose (fault injection for supervisors and their tests)."""

    reason: str = "killed"


class AgentKilledError(RuntimeError):
    """Raised inside an agent actor by :class:`Kill`; the actor dies through pykka's
    failure path, as it would on an unexpected error."""


class _Resume(msgspec.Struct, frozen=True):
    token: int
    error: BaseException | None = None
    value: Any = None


class _Flushed(msgspec.Struct, frozen=True):
    """A Flush effect's completion. Flush is not abortable and the turn awaits one
    effect at a time, so a completion always answers the Flush being waited for."""

    error: BaseException | None = None


_FLUSHED = _Flushed()


class _StreamReady(msgspec.Struct, frozen=True):
    stream: StreamHandle
    upto: int


class _ToolDone(msgspec.Struct, frozen=True):
    handle: ToolHandle


def apply_edit(inbox: Inbox, edit: Edit) -> Any:
    """Apply a supervisor's inbox edit (on the actor, or inline from one of its own
    listeners); ids the edit reserved are released if it fails."""
    if edit.op == "remove":
        assert edit.message_id is not None
        return inbox.remove(edit.message_id)
    if edit.op == "replace":
        assert edit.message_id is not None
        assert edit.message is not None
        try:
            inbox.replace(edit.message_id, edit.message, reused=edit.reused)
        except Exception:
            if edit.message.id not in edit.reused:  # a reused id is not the edit's to free
                inbox.release(edit.message.id)
            raise
        return None
    if edit.op == "splice":
        try:
            return inbox.splice(
                edit.lane, edit.start, edit.removed_count, edit.messages, reused=edit.reused
            )
        except Exception:
            for message in edit.messages:
                if message.id not in edit.reused:
                    inbox.release(message.id)
            raise
    return inbox.clear()


class AgentMailbox(Mailbox):
    """The agent's pykka mailbox *is* its inbox: control envelopes handled in send order,
    plus ``lanes``, the pending user messages of the ``next-turn`` and ``next-step``
    lanes, changed only by the actor through durable splices."""

    __slots__ = ("_idle_after_death", "abandoned", "lanes")

    def __init__(self) -> None:
        super().__init__()
        self.lanes: Inbox | None = None
        # wait_idle callbacks refused while the actor is torn down: answered once its
        # death watchers ran (the runtime's sets agent.crash). None outside a teardown.
        self._idle_after_death: list[Callable[[], None]] | None = None
        # Set by a runtime's close that gave up on the actor (its disposal did not end in
        # time) and went on to close the store and the I/O side under it.
        self.abandoned = False

    def pending_messages(self) -> InboxView:
        assert self.lanes is not None
        return self.lanes.view()

    def _refuse(self, envelope: Envelope[Any], reason: str) -> None:
        """A send the actor will never handle because it crashed: its caller holds the
        message's id, so the message is logged pending (the crashed handler's turn stays
        open; ``rt.resume`` repairs it and finds the message in the inbox). Anything
        else, or after a requested stop, is a dead letter as for any actor, except a
        ``wait_idle`` that was queued behind the stop: it is answered (idle for good)."""
        message = envelope.message
        if type(message) is AwaitIdle:  # a stopped agent runs nothing more: idle for good
            if self._idle_after_death is not None:
                self._idle_after_death.append(message.callback)  # once its watchers ran
            else:
                message.callback()
            return
        death, lanes = self._death, self.lanes
        if (
            type(message) is Insert
            and not message.inserted
            and death is not None
            and death.failed
            and lanes is not None
        ):
            try:
                lanes.insert(message.lane, message.message)
            except Exception:  # a failed log: the message is lost with the actor
                log.exception(
                    "agent could not keep message %s sent before it crashed", message.message.id
                )
            else:
                return
        super()._refuse(envelope, reason)

    def _teardown(self, actor: MailboxOwner) -> None:
        answers = self._idle_after_death = []
        super()._teardown(actor)  # refuses what is left: a crashed actor's sends are kept
        self.lanes = None
        self._idle_after_death = None
        for callback in answers:  # after the death watchers (agent.crash is set)
            callback()


class AgentActor(PooledActor):
    """One agent. Construct through the runtime; the fields below are its configuration."""

    @staticmethod
    def _create_actor_inbox() -> AgentMailbox:
        return AgentMailbox()

    def __init__(
        self,
        *,
        machine: TurnMachine,
        inbox: Inbox,
        session: Any,
        model: Any,
        io: IoSide,
        scheduler: Scheduler,
        bus: Any,
        flushes: FlushGroup,
        dispatcher: Any = None,
    ) -> None:
        super().__init__()
        if dispatcher is not None:
            self.actor_dispatcher = dispatcher
        self.machine = machine
        self.inbox = inbox
        mailbox = self.actor_inbox
        assert isinstance(mailbox, AgentMailbox)
        mailbox.lanes = inbox
        machine.quiet = mailbox.empty  # a Checkpoint with nothing queued is not awaited
        self.session = session
        self.model = model
        self._immediate = is_immediate(model)
        self._checked = chunks_checked(model)
        self.io = io
        self.scheduler = scheduler
        self.bus = bus
        self.flushes = flushes
        self._coro: Coroutine[Any, Any, None] | None = None
        self._tokens = count(1)
        self._waiting: Effect[Any] | None = None
        self._waiting_token = 0
        self._cancel_waiting: Callable[[], None] | None = None
        self._idle_waiters: list[Callable[[], None]] = []
        # A disposal's cancel was handled: no turn starts any more (a wake sent at the same
        # moment may land after it, before the stop; its message stays pending in the log).
        self._disposing = False
        self._mailbox = mailbox
        # A thread-safe "tell myself" for completions (admissions, tools, async work; a
        # flush's completion takes _flushed below): straight into the mailbox, which records
        # one that reaches a stopped actor as a dead letter instead of raising there.
        self._post: Callable[[object], None] = mailbox.tell

        def stream_ready(stream: StreamHandle, upto: int) -> None:  # on the I/O loop
            mailbox.put(Envelope(_StreamReady(stream, upto)))

        self._stream_ready = stream_ready  # one closure per actor, not one per stream
        run_now = mailbox.run_now
        flushed_envelope = Envelope(_FLUSHED)

        def flushed(error: BaseException | None) -> None:  # called by the flush group
            # One envelope serves every successful flush: at most one is in flight (the
            # turn awaits one effect at a time) and the mailbox drops it once handled.
            # The group calls back on a dispatcher worker: an idle agent goes on there.
            run_now(flushed_envelope if error is None else Envelope(_Flushed(error)))

        self._flushed = flushed  # one closure per actor, not one per flush

    # ------------------------------------------------------------------ envelopes

    def _actor_handle(self, envelope: Envelope[Any]) -> None:
        """``PooledActor._actor_handle`` with the per-turn envelopes (told, of a type in
        ``_HANDLERS``) sent straight to their handler: two calls less per message."""
        message = envelope.message
        handler = _HANDLERS.get(message.__class__)
        if handler is None or envelope.reply_to is not None:
            super()._actor_handle(envelope)
            return
        inbox = self.inbox
        inbox.owner = _get_ident()  # listeners run here may edit the inbox inline
        try:
            try:
                handler(self, message)
            finally:
                inbox.owner = None
        except Exception:  # noqa: BLE001 - a told message's failure fails the actor
            self._told_failed()
        except BaseException as error:  # noqa: BLE001 - pykka's loop: stop everything
            self._fatal(error)

    def _handle_receive(self, message: Any) -> Any:
        # The envelopes of every turn (completions, inserts) go straight to their handler
        # by exact type: no pass through pykka's proxy checks and the isinstance chain.
        handler = _HANDLERS.get(message.__class__)
        if handler is None:
            return super()._handle_receive(message)
        inbox = self.inbox
        inbox.owner = _get_ident()  # listeners run here may edit the inbox inline
        try:
            handler(self, message)
        finally:
            inbox.owner = None
        return None

    def on_receive(self, message: Any) -> Any:
        inbox = self.inbox
        inbox.owner = _get_ident()  # listeners run here may edit the inbox inline
        try:
            return self._receive(message)
        finally:
            inbox.owner = None

    def _receive(self, message: Any) -> Any:
        if isinstance(message, _Resume):
            self._on_resume(message)
        elif isinstance(message, _Flushed):
            self._on_flushed(message)
        elif isinstance(message, _StreamReady):
            self._on_stream_ready(message.stream, message.upto)
        elif isinstance(message, _ToolDone):
            self._on_tool_done(message)
        elif isinstance(message, Insert):
            self._insert(message)
        elif isinstance(message, Cancel):
            self._cancel(message.cause, keep_inbox=message.keep_inbox, target=message.target)
        elif isinstance(message, AwaitIdle):
            if self._coro is None:
                message.callback()
            else:
                self._idle_waiters.append(message.callback)
        elif isinstance(message, Edit):
            return self._edit(message)
        elif isinstance(message, Quiescent):
            message.callback(self._coro is None and self.actor_mailbox.empty())
        elif isinstance(message, Barrier):
            return None
        elif isinstance(message, Announce):
            message.callback()
        elif isinstance(message, Kill):
            raise AgentKilledError(f"agent {self.session.id} killed: {message.reason}")
        else:
            return super().on_receive(message)
        return None

    def _on_resume(self, message: _Resume) -> None:
        # Only the wait that took this token: a cancel may have ended it (the resume of
        # an aborted checkpoint, or an async listener's outcome, arrives after the
        # cancel) while the turn now waits for something else, a flush say.
        if message.token == self._waiting_token and self._waiting is not None:
            self._advance(message.value, message.error)

    def _on_stream_ready_message(self, message: _StreamReady) -> None:
        self._on_stream_ready(message.stream, message.upto)

    def _on_tool_done(self, message: _ToolDone) -> None:
        message.handle.delivered = True  # visible to the turn only now, in mailbox order
        waiting = self._waiting
        if isinstance(waiting, JoinTool) and message.handle in waiting.handles:
            self._advance((message.handle, message.handle.run))

    def _insert(self, message: Insert) -> None:
        lane, wake = message.lane, message.wake
        if wake and self._coro is not None:
            machine = self.machine
            if message.unwinding and machine.unwinding:
                lane = "next-turn"
                machine.latched_wake = True
            elif not machine.turn_open:
                # The chain's last turn has ended (it settles, or waits to retry): after
                # an error, a block or an abort the chain would stop with this wake
                # pending. It runs once the chain has converged, as on an idle agent.
                machine.latched_wake = True
        if not message.inserted:  # (else in the inbox already: only the wake is left)
            self._insert_told(lane, message.message)
        if wake and self._coro is None and not self._disposing:
            self._coro = self.machine.drain()  # start a drain
            self._advance(None)

    def _insert_told(self, lane: InboxLane, message: UserMessage) -> None:
        try:
            self.inbox.insert(lane, message)
        except Exception as err:
            # The verb checked everything the append checks (field types, the size of the
            # records that carry the message), so only the log itself failed here (the
            # store closed, the session opened again elsewhere): the agent cannot go on
            # logging, and its sender holds the id. The actor fails: ``agent.crash`` says
            # why, later sends are refused, ``rt.resume`` goes on from the log.
            self.inbox.release(message.id)
            err.add_note(f"agent {self.session.id} could not insert message {message.id}")
            raise

    def _edit(self, edit: Edit) -> Any:
        return apply_edit(self.inbox, edit)

    def _cancel(self, cause: CancelCause, *, keep_inbox: bool, target: TurnSignal | None) -> None:
        # The verb checked the cause (``checked_cause``); one that slips through (a
        # Cancel built elsewhere) must not crash the actor where the signal checks it.
        cause = loggable_cause(cause, self.session.codec.max_event_bytes)
        if isinstance(cause, DisposedCause):
            self._disposing = True
        self.machine.latched_wake = False  # a wake handled before the cancel was sent before it
        if not keep_inbox:
            self.inbox.clear()
        waiting = self._waiting
        if isinstance(waiting, Admit):  # queued for a place: leave the queue, end the drain
            self._give_up_admission(waiting)
            self._advance(None, TurnAborted())
            return
        signal = self.machine.signal
        if self._coro is None or signal is None:
            return
        if target is not None and not target.in_chain_of(signal):
            return  # the turn it aimed at has ended; a later chain is not its target
        signal.abort(cause)
        waiting = self._waiting
        if waiting is not None and waiting.abortable:
            if self._cancel_waiting is not None:
                self._cancel_waiting()
            self._advance(None, TurnAborted())

    # ------------------------------------------------------------------ stepping

    def _advance(self, value: Any, error: BaseException | None = None) -> None:
        coro = self._coro
        assert coro is not None
        self._waiting = None
        self._waiting_token = 0  # a late _Resume of the wait that ends here answers nothing
        self._cancel_waiting = None
        while True:
            try:
                effect = coro.throw(error) if error is not None else coro.send(value)
            except StopIteration:
                self._drained()
                return
            # Start the effect: (value, error) if it resolved at once, else _PENDING.
            start = _STARTERS.get(effect.__class__)
            if start is None:
                raise TypeError(f"the turn awaited an unknown effect {effect!r}")
            result = start(self, effect)
            if result is _PENDING:
                self._waiting = effect
                return
            value, error = result

    def _drained(self) -> None:
        self._coro = None
        if self._idle_waiters:
            waiters, self._idle_waiters = self._idle_waiters, []
            for callback in waiters:
                callback()

    def _wait(
        self, effect: Effect[Any], cancel: Callable[[], None] | None = None
    ) -> tuple[int, Any]:
        token = self._waiting_token = next(self._tokens)
        self._cancel_waiting = cancel
        return token, _PENDING

    def _start_next_batch(self, effect: NextBatch) -> Any:
        stream: StreamHandle = effect.stream
        items, error = stream.take()
        if items or error is not None:
            return items, error
        return self._wait(effect, stream.cancel)[1]

    def _start_flush(self, effect: Flush) -> Any:
        self._cancel_waiting = None
        self.flushes.join(self.session, self._flushed)  # answered by a _Flushed message
        return _PENDING

    def _on_flushed(self, message: _Flushed) -> None:
        if self._waiting.__class__ is Flush:
            self._advance(None, message.error)

    def _start_admit(self, effect: Admit) -> Any:
        token, pending = self._wait(effect)
        post = self._post

        def admitted() -> None:
            post(_Resume(token=token))

        effect.on_admitted = admitted
        return (None, None) if effect.admission.enter(admitted) else pending

    def _start_checkpoint(self, effect: Checkpoint) -> Any:
        if self._mailbox.empty():
            return None, None  # nothing queued could change the outcome: go on
        token, pending = self._wait(effect)
        self.actor_ref.tell(_Resume(token=token))
        return pending

    def _start_open_stream(self, effect: OpenStream) -> Any:
        stream = open_stream(
            self.model,
            effect.request,
            self.io,
            self._stream_ready,
            immediate=self._immediate,
            checked=self._checked,
        )
        return stream, None

    def _start_tool(self, effect: StartTool) -> Any:
        post = self._post
        try:
            handle = work_for(  # the body and its tools/execute listeners run for this agent
                self.inbox,
                start_tool,
                effect.plan,
                self.io,
                self.bus,
                self.session.id,
                lambda h: post(_ToolDone(h)),
            )
        except Exception as err:  # noqa: BLE001 - e.g. a hand-written Tool whose timeout_s raises
            return None, err  # the tool phase's failure: it answers its calls
        return handle, None

    def _start_join_tool(self, effect: JoinTool) -> Any:
        tool: ToolHandle
        for tool in effect.handles:
            if tool.delivered:  # its completion was handled while the turn did other work
                return (tool, tool.run), None
        return self._wait(effect)[1]

    def _start_run_async(self, effect: RunAsync) -> Any:
        token, pending = self._wait(effect)
        post = self._post

        def on_done(outcome: Outcome[Any]) -> None:
            post(_Resume(token=token, value=outcome.value, error=outcome.error))

        work = work_for(self.inbox, self.io.start, effect.work, on_done=on_done)
        self._cancel_waiting = work.cancel
        return pending

    def _start_sleep(self, effect: Sleep) -> Any:
        token, pending = self._wait(effect)
        timer = self.scheduler.tell_later(effect.seconds, self.actor_ref, _Resume(token=token))

        def cancel_timer() -> None:
            timer.cancel()

        self._cancel_waiting = cancel_timer
        return pending

    def _on_stream_ready(self, stream: StreamHandle, upto: int) -> None:
        stream.announce(upto)
        waiting = self._waiting
        if isinstance(waiting, NextBatch) and waiting.stream is stream:
            items, error = stream.take()
            if items or error is not None:
                self._advance(items, error)

    # ------------------------------------------------------------------ lifecycle

    def _told_failed(self) -> None:
        """A handler failed. In an actor its runtime's close gave up on, that is the
        runtime closed under it (a sync listener blocked during the close returned, and
        the turn went on): it stops, quietly and without writing more, its turn open in
        the log for ``resume`` to repair, as close said it would."""
        if not self._mailbox.abandoned:
            super()._told_failed()
            return
        log.info(
            "%s, which its runtime's close gave up on, stopped (%r); its turn stays open "
            "in the log",
            self,
            sys.exc_info()[1],
        )
        self._stop()

    def on_failure(self, *_exc_info: object) -> None:
        # The mailbox keeps the inbox until it has logged the sends left in it (see
        # AgentMailbox._refuse); it lets go of it then.
        self._stopped(keep_lanes=True)

    def on_stop(self) -> None:
        self._stopped(keep_lanes=False)

    def _give_up_admission(self, waiting: Admit) -> None:
        """Leave the queue for a place, or give back the place it was handed already
        (the admission's resume is then on its way here, and finds the wait ended)."""
        if not waiting.admission.withdraw(waiting.on_admitted):
            waiting.admission.leave()

    def _stopped(self, *, keep_lanes: bool) -> None:
        waiting = self._waiting
        if isinstance(waiting, Admit):  # the drain never got (or used) its place
            self._waiting = None
            self._give_up_admission(waiting)
        if self._coro is not None:
            self.machine.stopping = True  # the turn stays open in the log: see TurnMachine
            self._coro.close()
            self._coro = None
        waiters, self._idle_waiters = self._idle_waiters, []
        for callback in waiters:
            callback()
        self._release(keep_lanes=keep_lanes)

    def _release(self, *, keep_lanes: bool = False) -> None:
        """Let go of the session and its projections once stopped: refs to a stopped
        actor (registries, dead letters) must not keep an evicted session in memory."""
        mailbox = self.actor_inbox
        if isinstance(mailbox, AgentMailbox) and not keep_lanes:
            mailbox.lanes = None
        for name in ("machine", "inbox", "session", "model", "bus"):
            self.__dict__.pop(name, None)


# How the actor starts each effect: one dict lookup instead of a chain of isinstance.
_STARTERS: dict[type[Any], Callable[[AgentActor, Any], Any]] = {
    NextBatch: AgentActor._start_next_batch,
    Flush: AgentActor._start_flush,
    Admit: AgentActor._start_admit,
    Checkpoint: AgentActor._start_checkpoint,
    OpenStream: AgentActor._start_open_stream,
    StartTool: AgentActor._start_tool,
    JoinTool: AgentActor._start_join_tool,
    RunAsync: AgentActor._start_run_async,
    Sleep: AgentActor._start_sleep,
}

# The per-turn envelopes, by exact type (anything else, subclasses included, goes
# through pykka's checks and on_receive).
_HANDLERS: dict[type[Any], Callable[[AgentActor, Any], None]] = {
    _Resume: AgentActor._on_resume,
    _Flushed: AgentActor._on_flushed,
    _StreamReady: AgentActor._on_stream_ready_message,
    _ToolDone: AgentActor._on_tool_done,
    Insert: AgentActor._insert,
}
