"""``Agent``: the thread-safe handle users, listeners and supervisors hold.

Every verb is safe from any thread. ``followup`` / ``steer`` / ``inject`` validate the
message, reserve its id (a duplicate is refused here, synchronously) and return the
``MessageId`` at once; the agent actor does the rest in order.

One piece (a little over 500 lines) because it is one class: the handle's verbs, each
with the rules for calling it from the agent's own listeners, its tool bodies or the I/O
loop. Its state lives in its slot (``runtime.slots``), its messages are checked by
``runtime.messages``, and it calls its runtime only through ``AgentHost``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, cast

import msgspec
from pykka import ActorDeadError, Timeout

from actors import (
    AgentDisposedError,
    AgentStateError,
    AwaitIdle,
    Cancel,
    Edit,
    EditTimeoutError,
    Idle,
    InboxView,
    Insert,
    InvalidMessageError,
    Kill,
    Mailbox,
    WaitCycleError,
    WaitTarget,
    apply_edit,
    checked_cause,
    in_io_loop_thread,
    waiting_for,
)
from storage import (
    CancelCause,
    DisposedCause,
    InboxLane,
    MessageId,
    UserCause,
    UserMessage,
)

from . import waiting
from .messages import MessageChecker, MessageLike, check_id
from .replies import PendingReply, Reply, ReplyWatch
from .slots import AgentHost, AgentSlot
from .waiting import check_timeout

if TYPE_CHECKING:
    from actors import Model, Tool
    from storage import Session

__all__ = ["Agent", "MessageLike"]


class Agent:
    """A live agent. ``agent.id`` is also its session id."""

    # (A handle lives as long as its agent, passivated too: slots, not a dict.)
    __slots__ = ("__weakref__", "_checker", "_host", "_id", "_slot", "crash")

    def __init__(
        self, slot: AgentSlot[Agent], host: AgentHost[Agent], *, checker: MessageChecker
    ) -> None:
        """``checker``: what checks the messages sent to it (a runtime's agents share one)."""
        self._slot = slot  # its lifecycle: live, passive, disposing (runtime.slots)
        self._host = host
        self._id = slot.id
        self._checker = checker
        self.crash: BaseException | None = None
        """Why the agent's actor died unexpectedly, if it did (``rt.resume`` restarts it)."""

    def _live(self) -> None:
        """Rehydrate a passivated agent from its log before it is used."""
        slot = self._slot
        if slot.passive:
            with slot.lock:
                if slot.passive:
                    self._host.rehydrate(slot)

    def __repr__(self) -> str:
        state = "passive" if self._slot.passive else self.status
        return f"<Agent {self.id} {state}>"

    # ------------------------------------------------------------------ state

    @property
    def id(self) -> str:
        return self._id

    @property
    def session(self) -> Session:
        """The agent's session (rehydrates a passivated agent). Readable until the
        runtime's ``close()`` has returned (its listeners may read it meanwhile)."""
        self._check_released()
        self._live()
        assert self._slot.session is not None
        return self._slot.session

    @property
    def passive(self) -> bool:
        """Evicted from memory by :meth:`passivate`; its next use rehydrates it."""
        return self._slot.passive

    @property
    def status(self) -> Literal["idle", "running"]:
        return self._slot.status()

    @property
    def inbox(self) -> InboxView:
        self._check_released()
        self._live()
        assert self._slot.inbox is not None
        return self._slot.inbox.view()

    @property
    def disposed(self) -> bool:
        return self._slot.disposed.is_set()

    @property
    def model(self) -> Model:
        """The model this agent was started with (its requests' ``provider`` and ``name``)."""
        return cast("Model", self._slot.spec.model)

    @property
    def tools(self) -> Mapping[str, Tool]:
        """The agent's tools by name, read-only (what it was started with)."""
        return MappingProxyType(self._slot.spec.tools)

    # ------------------------------------------------------------------ messages

    def _send(
        self, value: object, lane: InboxLane, wake: bool, message_id: MessageId | None, source: str
    ) -> MessageId:
        message = self._checker.check(value, message_id, source)
        slot = self._slot
        if slot.disposing:
            self._check_open("a wake" if wake else "a message")
        self._host.check_room()  # a full disk refuses sends: see docs/durability.md
        if slot.on_own_thread():
            session, inbox = slot.session, slot.inbox
            quiet = inbox is not None and not inbox.emitting  # see Inbox.queueing_sends
            if quiet and session is not None and not session.notifying_here():
                return self._send_here(message, lane, wake)
        with slot.exclusive():
            if slot.disposing:  # again: a disposal tells its messages under this lock
                self._check_open("a wake" if wake else "a message")
            if slot.passive:
                self._live()
            inbox = slot.inbox
            assert inbox is not None
            inbox.reserve(message.id)
            try:
                unwinding = wake and slot.unwinding()
                self._tell_live(Insert(lane=lane, message=message, wake=wake, unwinding=unwinding))
            except BaseException:
                inbox.release(message.id)
                raise
        return message.id

    def _send_here(self, message: UserMessage, lane: InboxLane, wake: bool) -> MessageId:
        """A send from one of the agent's own listeners, on its actor: the message goes
        into the inbox at once (logged, ``agent/inbox/inserted``), as an edit from there
        is applied at once, so that the listener's next verb sees it (a ``remove`` of
        the id it just sent); only the wake is told, to be handled in order (from a
        ``session/event`` listener, which may not append, the whole send is; from an
        ``agent/created`` or ``agent/session-start`` listener too, so that the agent's
        work comes after both, and from an ``agent/inbox/*`` listener, so that live
        events keep the log's order and a chain of such sends does not nest). A wake into
        an aborted turn that is still unwinding goes to ``next-turn`` (as the actor does
        for a wake told while it unwinds)."""
        inbox = self._slot.inbox
        assert inbox is not None
        unwinding = wake and self._slot.unwinding()
        if unwinding:
            lane = "next-turn"
        inbox.reserve(message.id)
        try:
            inbox.insert(lane, message)
        except BaseException:
            if inbox.find(message.id) is None:  # not inserted (else it stays, as logged)
                inbox.release(message.id)
            raise
        if wake:
            self._tell_live(
                Insert(lane=lane, message=message, wake=True, unwinding=unwinding, inserted=True)
            )
        return message.id

    def _check_open(self, what: str) -> None:
        """Refuse ``what`` (a send, or an edit that inserts) once a disposal began: the
        disposal discards the inbox, and anything inserted after it would stay pending
        in a disposed agent's log. Called again under the live lock, under which a
        disposal tells its messages: what passes it there is queued before them."""
        if self._slot.disposing:
            self._check_runtime()
            raise AgentDisposedError(f"agent {self.id} is disposed; {what} sent to it is refused")

    def _check_runtime(self) -> None:
        """Raise ``RuntimeClosedError`` if the runtime is closed. Called once a disposal
        began (``close()`` disposes every agent first), so that the calls of a live agent
        pay nothing for it."""
        if self._slot.disposing:
            self._host.check_open()

    def _check_released(self) -> None:
        """Raise ``RuntimeClosedError`` once the runtime's ``close()`` has released the
        store (the session could no longer read or flush its log)."""
        if self._slot.disposing:
            self._host.check_released()

    def _tell_live(self, message: object) -> None:
        """``_tell`` for a caller that made the agent live (``ActorRef.tell``, inline)."""
        ref = self._slot.ref
        assert ref is not None
        if ref.actor_stopped.is_set():
            raise AgentDisposedError(f"agent {self.id} is no longer running")
        mailbox = ref.actor_inbox
        assert isinstance(mailbox, Mailbox)  # (every agent actor is pooled)
        mailbox.tell(message)

    def _tell(self, message: object) -> None:
        self._check_runtime()
        with self._slot.exclusive():
            self._live()
            assert self._slot.ref is not None
            try:
                self._slot.ref.tell(message)
            except ActorDeadError as err:
                raise AgentDisposedError(f"agent {self.id} is no longer running") from err

    def followup(
        self, message: MessageLike, *, id: MessageId | None = None, source: str = "user"
    ) -> MessageId:
        """Queue ``message`` as its own next turn and wake the agent."""
        return self._send(message, "next-turn", True, id, source)

    def steer(
        self, message: MessageLike, *, id: MessageId | None = None, source: str = "user"
    ) -> MessageId:
        """Add ``message`` to the next step of the running turn (or a new turn) and wake."""
        return self._send(message, "next-step", True, id, source)

    def inject(
        self, message: MessageLike, *, id: MessageId | None = None, source: str = "user"
    ) -> MessageId:
        """Add ``message`` to the next step without waking an idle agent."""
        return self._send(message, "next-step", False, id, source)

    # ------------------------------------------------------------------ editing (blocking)

    def _ask(self, edit: Edit, timeout: float | None) -> Any:
        """Apply ``edit`` on the actor and return its result; the ids of the messages it
        inserts are reserved first (a duplicate is refused here), once a disposal began
        such an edit is refused. Raises :class:`AgentDisposedError` when it was not
        applied (the agent is disposed, or stopped before reaching it: the ids are
        freed), :class:`EditTimeoutError` when it is queued but was not applied within
        ``timeout`` (the actor applies it later, in order: the ids stay taken), and the
        edit's own error when the actor refused it (having freed the ids: see
        :func:`actors.agent.apply_edit`)."""
        self._check_runtime()
        inserted = [m.id for m in _inserted_by(edit)]
        if self._slot.on_own_thread():
            # called by one of this agent's own listeners, on the actor's thread: asking
            # the actor would wait for itself, so the edit is applied here, in order
            if inserted:
                self._check_open(f"a {edit.op} inserting messages")
            assert self._slot.inbox is not None
            edit, inserted = self._reserve(edit, inserted)
            return apply_edit(self._slot.inbox, edit)
        try:
            # The edit is queued before a passivation may stop the actor (and the ids are
            # reserved in the inbox that actor owns); its reply is awaited outside the
            # lock: the edit's listeners may use the agent.
            with self._slot.lock:
                if inserted:
                    self._check_open(f"a {edit.op} inserting messages")
                self._live()
                assert self._slot.ref is not None
                assert self._slot.inbox is not None
                inbox = self._slot.inbox  # (the one that actor owns)
                edit, inserted = self._reserve(edit, inserted)
                try:
                    reply = self._slot.ref.ask(edit, block=False)
                except ActorDeadError:
                    self._release(inserted)
                    raise
            try:
                label = f"agent {self.id} to apply the {edit.op} edit"
                with waiting_for(inbox, label):
                    return reply.get(timeout=timeout)
            except ActorDeadError:
                self._release(inserted)  # stopped before it reached the edit
                raise
            except WaitCycleError as err:
                raise EditTimeoutError(
                    f"the {edit.op} edit of agent {self.id}'s inbox cannot be applied while "
                    f"the caller runs: {err}; it stays queued and is applied in order"
                ) from err
        except ActorDeadError as err:
            raise AgentDisposedError(f"agent {self.id} is no longer running") from err
        except Timeout as err:
            raise EditTimeoutError(
                f"the {edit.op} edit of agent {self.id}'s inbox was not applied within "
                f"{timeout} s; it stays queued and is applied in order"
            ) from err

    def _reserve(
        self, edit: Edit, message_ids: Sequence[MessageId]
    ) -> tuple[Edit, list[MessageId]]:
        """Reserve every id ``edit`` inserts, or none (a duplicate raises
        ``DuplicateMessageError``): the edit to send and the ids it reserved, which are
        freed if it is never applied. An id among the pending messages the edit discards
        is no duplicate: ``replace(id, message with that id)`` (or a splice removing and
        inserting it again) keeps it, and the edit carries it as ``reused``. A full inbox
        refuses the edit (``InboxFullError``) only if it would hold more than its limit
        once the edit discarded what it discards: a replace of a pending message (or of
        one whose send is queued before the edit) fits, as does a 1-for-1 splice of
        messages in the lane (its coordinates are counted on the lane as it stands: a
        send still on its way in is not)."""
        inbox = self._slot.inbox
        assert inbox is not None
        removes: Callable[[], Sequence[MessageId]]
        if edit.op == "replace":
            replaced = edit.message_id
            assert replaced is not None

            def removes() -> Sequence[MessageId]:
                return (replaced,) if inbox.holds(replaced) else ()

        else:  # a splice (the other edits insert nothing: never refused as full)

            def removes() -> Sequence[MessageId]:
                return inbox.pending_in(edit.lane, edit.start, edit.removed_count)

        reused = inbox.reserve_all(message_ids, removes)
        if not reused:
            return edit, list(message_ids)
        fresh = [message_id for message_id in message_ids if message_id not in reused]
        return msgspec.structs.replace(edit, reused=reused), fresh

    def _release(self, message_ids: Iterable[MessageId]) -> None:
        """Free the ids of an edit that was never applied (see :meth:`_ask`)."""
        assert self._slot.inbox is not None
        for message_id in message_ids:
            self._slot.inbox.release(message_id)

    def remove(self, message_id: MessageId, *, timeout: float | None = 10.0) -> UserMessage:
        """Discard one pending message (``outcome: canceled``); raises if it is not pending."""
        timeout = check_timeout(timeout)
        check_id(message_id)
        removed: UserMessage = self._ask(Edit(op="remove", message_id=message_id), timeout)
        return removed

    def replace(
        self, message_id: MessageId, message: MessageLike, *, timeout: float | None = 10.0
    ) -> MessageId:
        """Swap a pending message for a new one in the same place; returns the new id."""
        timeout = check_timeout(timeout)
        check_id(message_id)
        new = self._checker.check(message, None, "user")
        self._ask(Edit(op="replace", message_id=message_id, message=new), timeout)
        return new.id

    def splice(
        self,
        lane: InboxLane,
        start: int,
        removed_count: int = 0,
        messages: Sequence[MessageLike] = (),
        *,
        timeout: float | None = 10.0,
    ) -> list[UserMessage]:
        """The general inbox edit: in ``lane``, discard ``removed_count`` pending messages
        from ``start`` (coordinates like list slicing) and insert ``messages`` there.
        Returns the discarded messages; nothing wakes the agent."""
        timeout = check_timeout(timeout)
        if lane not in ("next-turn", "next-step"):
            raise InvalidMessageError(f"lane must be 'next-turn' or 'next-step', got {lane!r}")
        if (
            not isinstance(start, int)
            or not isinstance(removed_count, int)
            or isinstance(start, bool)
            or isinstance(removed_count, bool)
            or removed_count < 0
        ):
            raise InvalidMessageError(
                f"start is an int and removed_count an int >= 0, got {start!r} and "
                f"{removed_count!r}"
            )
        if isinstance(messages, str | bytes | bytearray | Mapping | Set) or not isinstance(
            messages, Iterable
        ):
            raise InvalidMessageError(
                f"messages is a list of messages, got {type(messages).__name__} "
                "(one text is one message: pass [text])"
            )
        new = tuple(self._checker.check(m, None, "user") for m in messages)
        self._checker.check_splice(new)
        edit = Edit(op="splice", lane=lane, start=start, removed_count=removed_count, messages=new)
        removed: list[UserMessage] = self._ask(edit, timeout)
        return removed

    def clear(self, *, timeout: float | None = 10.0) -> list[UserMessage]:
        """Discard every pending message; returns them."""
        timeout = check_timeout(timeout)
        cleared: list[UserMessage] = self._ask(Edit(op="clear"), timeout)
        return cleared

    # ------------------------------------------------------------------ control

    def cancel(self, cause: CancelCause | None = None, *, keep_inbox: bool = False) -> None:
        """Clear the inbox durably (unless ``keep_inbox``) and abort the active turn.

        ``cause`` (default ``UserCause()``) is logged in the turn's ``turn/end``: one
        that is not ``UserCause()``, ``ParentCause()`` or ``HookCause(reason=str)``, or a
        reason over ``MAX_CAUSE_REASON_CHARS`` (16,384) characters, raises
        :class:`InvalidMessageError` here and nothing is done. ``DisposedCause()`` is
        :meth:`dispose`'s own (it also ends the agent): give it there, not here."""
        if type(keep_inbox) is not bool:
            raise TypeError(f"keep_inbox is a bool, got {keep_inbox!r}")
        # Checked here, in the caller's thread: the cause is logged in the turn's turn/end.
        cause = UserCause() if cause is None else checked_cause(cause)
        if isinstance(cause, DisposedCause):
            # The actor takes a disposed cause as its disposal: it would start no turn
            # again, while the handle, never disposed, went on taking sends.
            raise InvalidMessageError(
                "DisposedCause() is the cause of agent.dispose(); call dispose() to end the "
                "agent, or cancel with UserCause(), ParentCause() or HookCause(reason=...)"
            )
        self._check_runtime()
        with self._slot.exclusive():
            self._live()  # a passivated agent's pending inbox is cleared durably too
            if self._slot.ref is None or not self._slot.ref.is_alive():
                return
            target = self._slot.active_signal()
            if target is not None:
                target.abort(cause)
            self._tell_live(Cancel(cause=cause, keep_inbox=keep_inbox, target=target))

    # ------------------------------------------------------------------ replies

    def submit(
        self, message: MessageLike, *, steer: bool = False, id: MessageId | None = None
    ) -> PendingReply:
        """Send ``message`` (a ``followup``, or a ``steer`` with ``steer=True``) and return
        its :class:`~runtime.replies.PendingReply` at once: a future of the
        :class:`~runtime.replies.Reply` of the turn chain it starts (or lands in)."""
        watch = ReplyWatch(self)
        try:
            message_id = (self.steer if steer else self.followup)(message, id=id)
        except BaseException:
            watch.abandon()
            raise
        return watch.start(message_id)

    def ask(
        self,
        message: MessageLike,
        *,
        timeout: float | None = 300.0,
        steer: bool = False,
        id: MessageId | None = None,
    ) -> Reply:
        """Send ``message`` and block until the turn chain it started has settled; returns
        its :class:`~runtime.replies.Reply` (``.text``, ``.reason``, ``.turns``,
        ``.retries``, ``.usage``). A cancel or dispose meanwhile ends the wait with what
        happened; :class:`ReplyTimeoutError` after ``timeout`` seconds (the turn goes
        on). Refused, as ``wait_idle`` is, from code this agent runs and on the I/O
        loop: use ``submit`` there, or ``await aio.ask(...)`` from asyncio."""
        timeout = check_timeout(timeout)
        self._refuse_wait("ask()")
        return self.submit(message, steer=steer, id=id).result(timeout)

    def notify_idle(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once every send before this call was handled and the agent
        is idle (at once, here, if it is passive or disposed): ``wait_idle`` without
        the wait, for fan-in and asyncio. It runs on the agent's thread: keep it short."""
        if self._slot.passive or self.disposed:
            callback()
            return
        try:
            self._tell(AwaitIdle(callback=callback))
        except AgentDisposedError:
            callback()

    def _refuse_wait(self, verb: str) -> None:
        """Raise ``AgentStateError`` for a blocking wait on this agent from where it would
        wait for itself or block the I/O loop."""
        if self._slot.on_own_thread() or self._slot.runs_own_effect():
            raise AgentStateError(
                f"{verb} of agent {self.id} was called from code the agent runs (one "
                "of its listeners or tool bodies): it would wait for itself; react to "
                "agent/settled or agent/status"
            )
        if in_io_loop_thread():
            raise AgentStateError(
                f"{verb} of agent {self.id} was called on the runtime's I/O loop (from "
                "an async listener or tool body): it would block every model stream and "
                "async listener of the runtime; react to agent/settled, or wait in a thread "
                f"(await asyncio.to_thread(agent.wait_idle, timeout))"
            )

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every send before this call was handled and the agent is idle.

        Returns False on timeout. From code this agent runs (one of its own listeners,
        on its actor; its tool bodies and ``tools/execute`` listeners) it would wait for
        itself, and on the runtime's I/O loop (any async listener or tool body) it would
        block every agent: both raise ``AgentStateError``. On the main thread a Ctrl-C
        ends the wait at once (see :mod:`runtime.waiting`)."""
        timeout = check_timeout(timeout)
        if self._slot.passive:
            return True
        self._refuse_wait("wait_idle()")
        done = threading.Event()
        try:
            self._tell(AwaitIdle(callback=done.set))
        except AgentDisposedError:
            return True
        return waiting.wait(done, timeout, idle=self._idle_wait("to go idle (wait_idle)"))

    def dispose(self, timeout: float | None = None) -> bool:
        """Cancel (``disposed``), wait for idle, stop, emit ``agent/disposed``. Idempotent:
        every call shares one disposal; returns whether it finished within ``timeout``.

        From code this agent runs (one of its own listeners, one of its tool bodies or
        ``tools/execute`` listeners) it starts the disposal and returns False at once:
        the disposal waits for that code to end. So it does on the runtime's I/O loop (an
        async listener or tool body of any agent): the disposal may need the loop.
        Listen to ``agent/disposed`` to learn when it is done (a sync listener of it
        that calls ``dispose()`` gets False: the disposal ends once its listeners
        return)."""
        timeout = check_timeout(timeout)  # before the disposal starts
        self._host.begin_disposal(self._slot, keep_inbox=False)
        if (
            self._slot.on_own_thread()
            or self._slot.runs_own_effect()
            or in_io_loop_thread()
            or self._slot.announcer == threading.get_ident()
        ):
            return self._slot.disposed.is_set()
        try:
            return waiting.wait(
                self._slot.disposed, timeout, idle=self._idle_wait("to be disposed")
            )
        except WaitCycleError:
            # The disposal waits for code that waits for this one: it goes on once the
            # caller returns, as from the agent's own listener.
            return self._slot.disposed.is_set()

    def _idle_wait(self, what: str) -> tuple[WaitTarget, str, Idle] | None:
        """What a wait for this agent to go idle (or be disposed) registers
        (``actors.waiting_for``)."""
        inbox = self._slot.inbox
        if inbox is None:
            return None
        holds = Idle(
            running=lambda: self.status == "running", announcer=lambda: self._slot.announcer
        )
        return inbox, f"agent {self.id} {what}", holds

    def passivate(self, timeout: float | None = 10.0) -> bool:
        """Evict an idle agent from memory: its actor stops and its in-memory session is
        dropped; the log keeps everything. Its next use (a send, ``session``, ``inbox``)
        rebuilds it from the log. Returns False (and does nothing) if it is busy."""
        timeout = check_timeout(timeout)
        self._check_runtime()
        return self._slot.passivate(timeout)

    def kill(self, reason: str = "killed") -> None:
        """Crash the agent's actor on purpose, as an unexpected failure would (fault
        injection for supervisor scripts and their tests). Its open turn stays open in the
        log until ``rt.resume`` repairs it."""
        self._tell(Kill(reason=reason))

    def on(self, name: str, listener: Callable[..., Any]) -> Callable[[], None]:
        """Listen to ``name`` for this agent only; returns a disposer."""
        return self._host.listen(name, listener, self._slot)


def _inserted_by(edit: Edit) -> Sequence[UserMessage]:
    """The messages ``edit`` puts into the inbox."""
    if edit.op == "replace":
        assert edit.message is not None
        return (edit.message,)
    return edit.messages  # a splice's; () for the others
