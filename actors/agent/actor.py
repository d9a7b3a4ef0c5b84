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
from typing import Any, assert_never

from pykka._envelope import Envelope

from storage import CancelCause, DisposedCause, InboxLane, UserMessage

from .._dispatcher import work_for
from .._ioside import IoSide, Outcome
from .._pooled import PooledActor
from .._scheduler import Scheduler
from ..effects import (
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
from ..errors import AgentKilledError
from ..flushes import FlushGroup
from ..inbox import Inbox
from ..signal import TurnSignal, loggable_cause
from ..streams import (
    StreamHandle,
    ToolHandle,
    chunks_checked,
    is_immediate,
    open_stream,
    start_tool,
)
from ..turn import TurnMachine
from .mailbox import AgentMailbox
from .messages import (
    AgentMessage,
    Announce,
    AwaitIdle,
    Barrier,
    Cancel,
    Control,
    Edit,
    Flushed,
    Insert,
    Kill,
    Quiescent,
    Resume,
    StreamReady,
    ToolDone,
    apply_edit,
)

__all__ = ["AgentActor"]

log = logging.getLogger("corral.agent")
_get_ident = threading.get_ident

_PENDING: Any = object()
_FLUSHED = Flushed()  # every successful flush's completion: one instance serves them all


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
        # (A shared empty tuple until a waiter comes: an idle agent's empty list was 56 B.)
        self._idle_waiters: list[Callable[[], None]] | tuple[()] = ()
        # A disposal's cancel was handled: no turn starts any more (a wake sent at the same
        # moment may land after it, before the stop; its message stays pending in the log).
        self._disposing = False
        # Its ``tell`` is the thread-safe "tell myself" for completions (admissions, tools,
        # async work; a flush's completion takes _flushed below): straight into the
        # mailbox, which records one that reaches a stopped actor as a dead letter instead
        # of raising there. (Bound where it is used: kept, it was 64 bytes of every agent.)
        self._mailbox = mailbox

        # One envelope serves every successful flush: at most one is in flight (the turn
        # awaits one effect at a time) and the mailbox drops it once handled.
        self._flushed_envelope = Envelope(_FLUSHED)

    def _stream_ready(self, stream: StreamHandle, upto: int) -> None:
        # On the I/O loop (handed over at the end of its pass), or on the agent's own
        # worker when it announces chunks that came meanwhile.
        self._mailbox.put_soon(Envelope(StreamReady(stream, upto)))

    def _flushed(self, error: BaseException | None) -> None:  # called by the flush group
        # (Methods, not closures made in __init__: two closures held ~400 bytes of every
        # idle agent; a bound method is made per call instead, for a few ns.)
        # The group calls back on a dispatcher worker: an idle agent goes on there.
        self._mailbox.run_now(self._flushed_envelope if error is None else Envelope(Flushed(error)))

    # ------------------------------------------------------------------ envelopes

    def _actor_handle(self, envelope: Envelope[Any]) -> None:
        """``PooledActor._actor_handle`` with a told :class:`Control` message sent straight
        to :meth:`_dispatch`: no pass through pykka's proxy checks, two calls less per
        message. Asks, and pykka's own messages (stop, proxy calls), take pykka's path,
        which ends in :meth:`on_receive` and so in the same dispatch."""
        message = envelope.message
        if envelope.reply_to is not None or not isinstance(message, Control):
            super()._actor_handle(envelope)
            return
        inbox = self.inbox
        inbox.owner = _get_ident()  # listeners run here may edit the inbox inline
        try:
            try:
                self._dispatch(message)  # type: ignore[arg-type]  # every Control is one
            finally:
                inbox.owner = None
        except Exception:  # noqa: BLE001 - a told message's failure fails the actor
            self._told_failed()
        except BaseException as error:  # noqa: BLE001 - pykka's loop: stop everything
            self._fatal(error)

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, Control):
            return super().on_receive(message)
        inbox = self.inbox
        inbox.owner = _get_ident()  # listeners run here may edit the inbox inline
        try:
            return self._dispatch(message)  # type: ignore[arg-type]  # every Control is one
        finally:
            inbox.owner = None

    def _dispatch(self, message: AgentMessage) -> Any:
        """Handle one message (the one dispatch table); the answer of an ask."""
        match message:
            case Resume():
                self._on_resume(message)
            case Flushed():
                self._on_flushed(message)
            case StreamReady():
                self._on_stream_ready(message.stream, message.upto)
            case ToolDone():
                self._on_tool_done(message)
            case Insert():
                self._insert(message)
            case Cancel():
                self._cancel(message.cause, keep_inbox=message.keep_inbox, target=message.target)
            case AwaitIdle():
                if self._coro is None:
                    message.callback()
                else:
                    self._idle_waiters = [*self._idle_waiters, message.callback]
            case Edit():
                return apply_edit(self.inbox, message)
            case Quiescent():
                message.callback(self._coro is None and self.actor_mailbox.empty())
            case Barrier():
                pass
            case Announce():
                message.callback()
            case Kill():
                raise AgentKilledError(f"agent {self.session.id} killed: {message.reason}")
            case _:
                assert_never(message)
        return None

    def _on_resume(self, message: Resume) -> None:
        # Only the wait that took this token: a cancel may have ended it (the resume of
        # an aborted checkpoint, or an async listener's outcome, arrives after the
        # cancel) while the turn now waits for something else, a flush say.
        if message.token == self._waiting_token and self._waiting is not None:
            self._advance(message.value, message.error)

    def _on_tool_done(self, message: ToolDone) -> None:
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
        self._waiting_token = 0  # a late Resume of the wait that ends here answers nothing
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
            waiters, self._idle_waiters = self._idle_waiters, ()
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
        if error is not None:
            return None, error
        if items:
            answer = effect.answer(items)
            if answer is not None:
                return answer
        return self._wait(effect, stream.cancel)[1]

    def _start_flush(self, effect: Flush) -> Any:
        self._cancel_waiting = None
        self.flushes.join(self.session, self._flushed)  # answered by a Flushed message
        return _PENDING

    def _on_flushed(self, message: Flushed) -> None:
        if self._waiting.__class__ is Flush:
            self._advance(None, message.error)

    def _start_admit(self, effect: Admit) -> Any:
        token, pending = self._wait(effect)
        post = self._mailbox.tell

        def admitted() -> None:
            post(Resume(token=token))

        effect.on_admitted = admitted
        return (None, None) if effect.admission.enter(admitted) else pending

    def _start_checkpoint(self, effect: Checkpoint) -> Any:
        if self._mailbox.empty():
            return None, None  # nothing queued could change the outcome: go on
        token, pending = self._wait(effect)
        # Told to itself, running: the mailbox's tell, without ActorRef.tell's liveness
        # check (a Python call per checkpoint); after a stop it would be a dead letter.
        self._mailbox.tell(Resume(token=token))
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
        post = self._mailbox.tell
        try:
            handle = work_for(  # the body and its tools/execute listeners run for this agent
                self.inbox,
                start_tool,
                effect.plan,
                self.io,
                self.bus,
                self.session.id,
                lambda h: post(ToolDone(h)),
                self.scheduler,
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
        post = self._mailbox.tell

        def on_done(outcome: Outcome[Any]) -> None:
            post(Resume(token=token, value=outcome.value, error=outcome.error))

        work = work_for(self.inbox, self.io.start, effect.work, on_done=on_done)
        self._cancel_waiting = work.cancel
        return pending

    def _start_sleep(self, effect: Sleep) -> Any:
        token, pending = self._wait(effect)
        timer = self.scheduler.tell_later(effect.seconds, self.actor_ref, Resume(token=token))

        def cancel_timer() -> None:
            timer.cancel()

        self._cancel_waiting = cancel_timer
        return pending

    def _on_stream_ready(self, stream: StreamHandle, upto: int) -> None:
        stream.announce(upto)
        waiting = self._waiting
        if waiting.__class__ is NextBatch and waiting.stream is stream:
            items, error = stream.take()
            if error is not None:
                self._advance(None, error)
            elif items:
                answer = waiting.answer(items)  # with consume: logged, the turn not resumed
                if answer is not None:
                    self._advance(*answer)

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
        waiters, self._idle_waiters = self._idle_waiters, ()
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
