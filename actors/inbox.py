"""The agent's inbox: two lanes of pending user messages, changed only by durable splices.

Every change is validated, appended as a durable ``agent/inbox/spliced`` fact, applied,
then announced live (``agent/inbox/discarded`` per removed message, then
``agent/inbox/inserted`` per inserted one). A claim is an atomic pure deletion
announced as ``agent/inbox/claimed``. Only the owning agent actor changes the lanes;
any thread may read a snapshot and reserve a :data:`MessageId` (so a duplicate is
refused synchronously, in the caller's thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import msgspec

from storage import AgentInboxSpliced, InboxLane, MessageId, UserMessage

from .errors import DuplicateMessageError, InboxFullError, UnknownMessageError
from .events import AgentLike, InboxClaimed, InboxDiscarded, InboxInserted

__all__ = ["LANES", "Inbox", "InboxView"]

LANES: tuple[InboxLane, InboxLane] = ("next-turn", "next-step")


class InboxView(msgspec.Struct, frozen=True):
    """A read-only snapshot of both lanes."""

    next_turn: tuple[UserMessage, ...]
    next_step: tuple[UserMessage, ...]

    def __len__(self) -> int:
        return len(self.next_turn) + len(self.next_step)

    def ids(self) -> list[MessageId]:
        return [m.id for m in (*self.next_turn, *self.next_step)]


class Inbox:
    """Both lanes of one agent.

    Invariant: every id in the lanes is in ``_reserved``; ids are unique across lanes.
    """

    def __init__(
        self,
        *,
        append_fact: Callable[[Any], Any],
        emit: Callable[[str, Any], None],
        agent: AgentLike,
        limit: int | None = None,
        listened: Callable[[str], bool] | None = None,
    ) -> None:
        self._append = append_fact
        self._emit_to = emit
        # How deep the owner is in emitting live events whose listeners' sends must be
        # queued, not inserted inline (see Agent._send_here): this inbox's own (so that
        # events keep the log's order and chained sends do not nest), and the agent's
        # announcement (so that its work comes after it). See :meth:`queueing_sends`.
        self.emitting = 0
        # ``listened(name)`` False: no listener could see an event of ``name``, so its
        # payload is not built (e.g. ``Bus.maybe_listened``); None: always emit.
        self._listened: Callable[[str], bool] = listened or _always
        self._agent = agent
        self._limit = limit
        self._lock = threading.Lock()
        # The two lanes (never replaced: changed in place); fields, not a dict by lane:
        # the inbox lives as long as its agent.
        self._next_turn: list[UserMessage] = []
        self._next_step: list[UserMessage] = []
        # Invariant: the shared empty frozenset whenever no id is reserved (an idle
        # agent's empty set would be 216 bytes); a set of its own otherwise.
        self._reserved: set[MessageId] | frozenset[MessageId] = _NO_IDS
        # The thread handling one of the owning actor's messages right now, if any: a
        # listener running there may edit the inbox inline instead of asking the actor.
        self.owner: int | None = None

    @contextmanager
    def queueing_sends(self) -> Iterator[None]:
        """While the owner emits live events inside it, its listeners' sends are queued
        to the owner rather than inserted at once."""
        self.emitting += 1
        try:
            yield
        finally:
            self.emitting -= 1

    def _emit(self, name: str, payload: Any) -> None:
        self.emitting += 1  # queueing_sends, inline (once per event a listener sees)
        try:
            self._emit_to(name, payload)
        finally:
            self.emitting -= 1

    # ------------------------------------------------------------------ any thread

    def reserve(self, message_id: MessageId) -> None:
        """Claim ``message_id`` for a message on its way in; refuse duplicates and overflow."""
        with self._lock:
            if message_id in self._reserved:
                raise DuplicateMessageError(
                    f"message id {message_id!r} is already pending in this agent's inbox; "
                    "use a new id, or replace() the pending message"
                )
            if self._limit is not None and len(self._reserved) >= self._limit:
                raise InboxFullError(
                    f"the inbox holds {len(self._reserved)} pending messages, its limit; "
                    "wait for the agent to claim some, or raise inbox_limit"
                )
            self._reserving().add(message_id)

    def _reserving(self) -> set[MessageId]:
        """The set of reserved ids, to add to (the caller holds the lock)."""
        reserved = self._reserved
        if isinstance(reserved, set):
            return reserved
        mine = self._reserved = set(reserved)
        return mine

    def _unreserve(self, message_ids: Iterable[MessageId]) -> None:
        """Release ``message_ids`` (the caller holds the lock)."""
        reserved = self._reserved
        if isinstance(reserved, set):
            for message_id in message_ids:
                reserved.discard(message_id)
            if not reserved:
                self._reserved = _NO_IDS

    def _lane(self, lane: InboxLane) -> list[UserMessage]:
        return self._next_turn if lane == "next-turn" else self._next_step

    def reserve_all(
        self,
        message_ids: Sequence[MessageId],
        removes: Callable[[], Sequence[MessageId]] = tuple,
    ) -> frozenset[MessageId]:
        """Claim the ids of an edit's messages, all or none (a duplicate, pending or among
        them, is refused). ``removes()``, called under the lock so that the lanes hold
        still, lists the pending messages the edit discards as the lanes stand now. An id
        among them may be inserted again by the same edit (``replace(id, message with
        that id)``, a splice that reorders), and so may one still on its way in (where
        it lands is known only when the edit is applied): such an id is not claimed
        again but returned, for :meth:`splice` to check when it applies the edit. The
        edit is refused as full only if the inbox would hold more than its limit after
        it (a ``replace`` of a pending message in a full inbox is accepted)."""
        with self._lock:
            discarded = set(removes())
            in_lanes: set[MessageId] | None = None  # built only if needed
            fresh: set[MessageId] = set()
            reused: set[MessageId] = set()
            for message_id in message_ids:
                taken = message_id in fresh or message_id in reused
                if not taken and message_id in self._reserved and message_id not in discarded:
                    if in_lanes is None:
                        in_lanes = {m.id for m in (*self._next_turn, *self._next_step)}
                    taken = message_id in in_lanes  # pending where the edit does not remove
                if taken:
                    raise DuplicateMessageError(
                        f"message id {message_id!r} is already pending in this agent's inbox; "
                        "use a new id, or replace() the pending message"
                    )
                (reused if message_id in self._reserved else fresh).add(message_id)
            if fresh and self._limit is not None:
                after = len(self._reserved) + len(fresh) + len(reused) - len(discarded)
                if after > self._limit:
                    raise InboxFullError(
                        f"the edit would leave {after} pending messages in the inbox, over its "
                        f"limit of {self._limit}; wait for the agent to claim some, or raise "
                        "inbox_limit"
                    )
            if fresh:
                self._reserving().update(fresh)
            return frozenset(reused)

    def holds(self, message_id: MessageId) -> bool:
        """Whether ``message_id`` is pending or on its way in (reserved): its insert is
        then queued to the owner before anything told after this call."""
        return message_id in self._reserved

    def pending_in(self, lane: InboxLane, start: int, removed_count: int) -> list[MessageId]:
        """The ids of the pending messages ``splice(lane, start, removed_count, ...)``
        would discard as the lane stands now (sends still on their way in not counted)."""
        items = self._lane(lane)
        begin, end = _span(len(items), start, removed_count)
        return [message.id for message in items[begin:end]]

    def release(self, message_id: MessageId) -> None:
        with self._lock:
            self._unreserve((message_id,))

    def view(self) -> InboxView:
        with self._lock:
            return InboxView(tuple(self._next_turn), tuple(self._next_step))

    def __len__(self) -> int:
        return len(self._next_turn) + len(self._next_step)

    def lane_size(self, lane: InboxLane) -> int:
        return len(self._lane(lane))

    # ------------------------------------------------------------------ owner only

    def load(self, next_turn: Sequence[UserMessage], next_step: Sequence[UserMessage]) -> None:
        """Restore lanes replayed from a session's splices (resume); no fact is written."""
        with self._lock:
            self._next_turn[:] = next_turn
            self._next_step[:] = next_step
            ids = {m.id for m in (*next_turn, *next_step)}
            self._reserved = ids or _NO_IDS

    def splice(
        self,
        lane: InboxLane,
        start: int,
        removed_count: int,
        inserted: Sequence[UserMessage],
        *,
        outcome: Literal["canceled"] | None = "canceled",
        reused: frozenset[MessageId] = frozenset(),
    ) -> list[UserMessage]:
        """The general edit: durable fact, apply, announce. Returns the removed messages.

        Coordinates are normalized like list slicing; a no-op writes nothing. Inserted
        messages must already be reserved, but ``reused``: ids that were pending when
        the edit reserved its ids, among those it meant to remove (see
        :meth:`reserve_all`). One that this splice does not remove after all (the lane
        changed meanwhile) is claimed now, or refused if it is pending again elsewhere.
        """
        items = self._lane(lane)
        begin, end = _span(len(items), start, removed_count)
        removed = items[begin:end]
        if not removed and not inserted:
            return []
        claimed = self._claim_reused(reused, removed) if reused else []
        try:
            self._append(
                AgentInboxSpliced(
                    target=lane,
                    start=begin,
                    removed_count=len(removed),
                    inserted=tuple(inserted),
                    outcome=outcome if removed else None,
                )
            )
        except BaseException:
            for message_id in claimed:
                self.release(message_id)
            raise
        with self._lock:
            items[begin:end] = inserted
            if outcome is not None:
                self._unreserve(message.id for message in removed)
                if reused:  # those it removed and inserted again
                    self._reserving().update(reused)
        if outcome is not None and removed and self._listened("agent/inbox/discarded"):
            for message in removed:
                self._emit(
                    "agent/inbox/discarded", InboxDiscarded(agent=self._agent, message=message)
                )
        if inserted and self._listened("agent/inbox/inserted"):
            for message in inserted:
                self._emit(
                    "agent/inbox/inserted",
                    InboxInserted(agent=self._agent, message=message, target=lane),
                )
        return removed

    def _claim_reused(
        self, reused: frozenset[MessageId], removed: Sequence[UserMessage]
    ) -> list[MessageId]:
        """Claim the ``reused`` ids a splice inserts but does not remove (one on its way
        in when the edit was sent, or one a turn claimed since); one pending raises.
        Returns those claimed."""
        stray = reused.difference(message.id for message in removed)
        with self._lock:
            for message_id in stray:
                if message_id in self._reserved:
                    raise DuplicateMessageError(
                        f"message id {message_id!r} is already pending in this agent's inbox "
                        "outside the messages the edit removes; use a new id, or replace() "
                        "the pending message"
                    )
            if stray:
                self._reserving().update(stray)
        return list(stray)

    def insert(self, lane: InboxLane, message: UserMessage) -> None:
        """``splice`` at the end of ``lane`` (the path of every send), without its
        coordinate arithmetic."""
        items = self._lane(lane)
        self._append(
            AgentInboxSpliced(
                target=lane, start=len(items), removed_count=0, inserted=(message,), outcome=None
            )
        )
        with self._lock:
            items.append(message)
        if self._listened("agent/inbox/inserted"):
            self._emit(
                "agent/inbox/inserted",
                InboxInserted(agent=self._agent, message=message, target=lane),
            )

    def find(self, message_id: MessageId) -> tuple[InboxLane, int] | None:
        for lane in LANES:
            for index, message in enumerate(self._lane(lane)):
                if message.id == message_id:
                    return lane, index
        return None

    def remove(self, message_id: MessageId) -> UserMessage:
        where = self.find(message_id)
        if where is None:
            raise UnknownMessageError(f"no pending message {message_id!r} in this inbox")
        lane, index = where
        return self.splice(lane, index, 1, [])[0]

    def replace(
        self,
        message_id: MessageId,
        message: UserMessage,
        reused: frozenset[MessageId] = frozenset(),
    ) -> None:
        """Swap a pending message for ``message`` (reserved, or ``reused``: it has the
        same id) in the same place."""
        where = self.find(message_id)
        if where is None:
            raise UnknownMessageError(f"no pending message {message_id!r} in this inbox")
        lane, index = where
        self.splice(lane, index, 1, [message], reused=reused)

    def clear(self) -> list[UserMessage]:
        removed: list[UserMessage] = []
        for lane in LANES:
            removed += self.splice(lane, 0, len(self._lane(lane)), [])
        return removed

    def claim(self, turn: int, *, new_turn: bool) -> tuple[UserMessage, ...]:
        """Atomically take the batch of ``turn``: for a new turn the first ``next-turn``
        message, then the whole ``next-step`` lane. Pure deletion: no ``outcome``. The
        batch is a tuple: it is handed to ``agent/pre-step`` listeners as it is."""
        next_step = self._next_step
        if new_turn and self._next_turn:
            taken = self._take("next-turn", 1)
            if next_step:
                taken += self._take("next-step", len(next_step))
        elif next_step:
            taken = self._take("next-step", len(next_step))
        else:
            return ()
        batch = tuple(taken)
        if self._listened("agent/inbox/claimed"):
            for message in batch:
                self._emit(
                    "agent/inbox/claimed",
                    InboxClaimed(agent=self._agent, message=message, turn=turn),
                )
        return batch

    def _take(self, lane: InboxLane, count: int) -> list[UserMessage]:
        """Claim's pure deletion of the first ``count`` (>= 1) messages of ``lane``: a
        durable splice without ``outcome``; their ids are released with them."""
        items = self._lane(lane)
        taken = items[:count]
        self._append(
            AgentInboxSpliced(target=lane, start=0, removed_count=len(taken), outcome=None)
        )
        with self._lock:
            del items[:count]
            self._unreserve(message.id for message in taken)
        return taken


def _span(length: int, start: int, removed_count: int) -> tuple[int, int]:
    """A splice's coordinates in a lane of ``length``, normalized like list slicing."""
    begin = slice(start, None).indices(length)[0]
    return begin, min(length, begin + max(removed_count, 0))


_NO_IDS: frozenset[MessageId] = frozenset()
"""The reserved ids of every inbox that has none."""


def _always(_name: str) -> bool:
    return True
