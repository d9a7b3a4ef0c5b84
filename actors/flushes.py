"""Flush groups: one log flush for every actor that waits for durability in one round
of the run queue.

An agent in write-ahead mode waits for its log twice a turn (before its model request
and before it settles). Asked one actor at a time, the log writer resolves one callback
per actor, on its own thread: it acknowledges the actor's session, wakes the actor and
competes with the dispatcher for the GIL for each of them. A :class:`FlushGroup` asks
the log once for all the actors that wait in one round of the run queue, and hands the
outcome back to the dispatcher in one piece:

1. An actor that needs its facts durable *joins* the group (its session, the seq of its
   last fact, a callback). The first to join a new group puts the group at the back of
   the dispatcher's run queue.
2. When a worker gets to it, every actor that was ready before has run once (and joined
   or not): the group is *sealed*. It asks the log for one flush, covering everything
   appended so far (each member's facts among it), and a new group starts.
3. The log writer calls the group back once. The outcome goes back on the run queue as
   one item, which acknowledges each member's session (it may drop its durable events
   from memory) and calls each member's callback, in the order they joined. (An agent's
   callback goes on with its turn right there when the agent is idle, which it is while
   it waits: see ``Mailbox.run_now``.)

Nothing is acknowledged that the flush did not cover: a member's mark is read when it
joins, after its facts were appended, and the flush is asked for after it joined. A
failed flush passes its error to every member and acknowledges nothing. Once the
dispatcher is shut down, a group seals at once and its outcome is delivered on the log
writer's thread, so that no member waits for a worker that will never come.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from actors._dispatcher import Dispatcher, Schedulable, offer_rest, rest_offered
from actors.errors import DispatcherShutdownError
from storage import FlushCallback

__all__ = ["Durable", "FlushCallback", "FlushGroup", "Log"]

_log = logging.getLogger("corral.actors")


class Log(Protocol):
    """The log a group flushes (``storage.Store`` provides it)."""

    def flush_async(self, callback: FlushCallback) -> None:
        """Call ``callback(None)`` once everything appended before the call is durable,
        or ``callback(error)`` if it cannot be; may also raise instead (a closed log)."""
        ...


class Durable(Protocol):
    """What a group needs of a member's session (``storage.Session`` provides it)."""

    @property
    def last_seq(self) -> int: ...

    def acknowledge(self, mark: int) -> None:
        """Everything through seq ``mark`` is durable (called from any thread)."""
        ...


_Member = tuple[Durable, int, FlushCallback]


class FlushGroup:
    """Coalesces the flushes of the actors of one dispatcher over one log (the log of
    every member's session). The group is also what the dispatcher runs to seal it (a
    ``Schedulable``)."""

    def __init__(self, log: Log, dispatcher: Dispatcher) -> None:
        self._log = log
        self._dispatcher = dispatcher
        self._lock = threading.Lock()
        # Invariant: non-empty exactly while the group is on the run queue (or sealing).
        self._members: list[_Member] = []
        self._flushes = 0

    @property
    def flushes(self) -> int:
        """How many flushes the group asked the log for."""
        return self._flushes

    def join(self, session: Durable, callback: FlushCallback) -> None:
        """Call ``callback(None)`` once everything ``session`` holds is durable, having
        acknowledged it, or ``callback(error)`` if it cannot be. Never blocks; the
        callback runs on a dispatcher worker (on the log writer's thread once the
        dispatcher is shut down)."""
        member = (session, session.last_seq, callback)
        lock = self._lock
        lock.acquire()  # not `with`: twice per agent turn (hot path)
        members = self._members
        members.append(member)
        first = len(members) == 1
        lock.release()
        if first:
            _run_soon(self._dispatcher, self)

    def run_batch(self, throughput: int) -> tuple[int, bool]:
        """Seal the group: ask the log for one flush for its members."""
        lock = self._lock
        lock.acquire()
        members, self._members = self._members, []
        if members:
            self._flushes += 1
        lock.release()
        if members:
            outcome = _Outcome(members, self._dispatcher)
            try:
                self._log.flush_async(outcome.deliver)
            except Exception as err:  # noqa: BLE001 -- e.g. a closed store: every member hears
                outcome.deliver(err)
        return len(members), False


class _Outcome:
    """A sealed group's flush outcome, run by a worker once the log has called back:
    ``throughput`` members a batch, like an actor's messages (a group may hold thousands
    of members; a batch that long would keep other work waiting and look like a stuck
    worker to a standby one)."""

    __slots__ = ("_dispatcher", "_done", "_members", "_rest", "error")

    def __init__(self, members: list[_Member], dispatcher: Dispatcher) -> None:
        self._members = members
        self._dispatcher = dispatcher
        self._done = 0  # members answered (or being answered) so far
        self.error: BaseException | None = None
        self._rest = self._hand_off  # one bound method: offered, then compared by identity

    def deliver(self, error: BaseException | None) -> None:
        """The log's callback (on its writer thread): hand the outcome to a worker."""
        self.error = error
        _run_soon(self._dispatcher, self)

    def run_batch(self, throughput: int) -> tuple[int, bool]:
        """Answer the next ``throughput`` members (every one left for 0). A member's
        callback runs its agent right here, listeners included: one of them that waits
        for another actor hands the members after it back to the run queue first
        (``offer_rest``), and this run ends with that member."""
        error = self.error
        members = self._members
        start = self._done
        end = len(members) if throughput <= 0 else min(len(members), start + throughput)
        rest = self._rest
        outer = offer_rest(rest)
        try:
            for index in range(start, end):
                session, mark, callback = members[index]
                self._done = index + 1  # before the callback: a hand-off starts after it
                try:
                    if error is None:
                        session.acknowledge(mark)
                    callback(error)
                except Exception:  # noqa: BLE001 -- one member's fault must not strand the others
                    _log.exception(
                        "a flush group member's callback failed; the failure is contained"
                    )
                if rest_offered() is not rest:  # handed off: the rest is another run's
                    return index + 1 - start, False
        finally:
            offer_rest(outer)
        return end - start, end < len(members)

    def _hand_off(self) -> None:
        """A member's callback is about to wait: the members after it go back on the run
        queue (see ``run_batch``)."""
        if self._done < len(self._members):
            _run_soon(self._dispatcher, self)


def _run_soon(dispatcher: Dispatcher, work: Schedulable) -> None:
    """Put ``work`` at the back of the run queue; run it at once and whole on the calling
    thread if the dispatcher is shut down (no member may wait for a worker that never
    comes)."""
    try:
        dispatcher.schedule(work)
    except DispatcherShutdownError:
        work.run_batch(0)
