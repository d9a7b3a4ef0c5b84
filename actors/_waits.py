"""Who waits for which agent: a wait-for graph that refuses a wait closing a cycle.

A runtime verb that blocks until another agent's actor does something (a spawn waits
for the new actor's announcement, ``dispose()`` and ``wait_idle()`` for the agent to go
idle, an inbox edit for the actor to apply it) registers the wait here for as long as
it lasts. An agent is *held* by a thread that runs one of its actor's handlers (its
inbox's ``owner``: a sync listener, say) and, for waits that need the agent idle, by a
thread that runs one of its effects (a tool body, a deferred listener: its
``working_for()`` token) while that thread waits: the agent cannot get there before
that thread's wait is over.

A wait that would close a cycle (A's listener waits for B, whose listener, holding
B, waits for A) would never end: :func:`waiting_for` raises :class:`WaitCycleError`
instead, naming the cycle, before anything waits. The verb that made the wait decides
what that means for it (``dispose()`` returns False, its disposal going on once the
cycle unwinds; ``wait_idle()`` raises). The first waits of a cycle are let through:
only the one that closes it is refused, so the others end once it returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from ._dispatcher import waiting_on_actors, working_for
from .errors import WaitCycleError

__all__ = ["Idle", "WaitTarget", "waiting_for"]


class WaitTarget(Protocol):
    """An agent as a wait sees it: its inbox (``owner`` is the thread running one of its
    actor's handlers, if any; the inbox is also the ``working_for`` token of its
    effects)."""

    owner: int | None


@dataclass(frozen=True, slots=True)
class Idle:
    """What else holds an agent that a wait needs idle (or disposed): while it runs a
    turn (``running()``), the threads running its effects, which the turn waits for;
    while its disposal is announced, the thread running its ``agent/disposed``
    listeners (``announcer()``), which the disposal waits for."""

    running: Callable[[], bool]
    announcer: Callable[[], int | None]


@dataclass(frozen=True, slots=True)
class _Wait:
    target: WaitTarget
    label: str  # the agent waited for, and for what: "agent B to go idle"
    idle: Idle | None  # the wait needs the agent idle, not only its actor to run
    effect_of: object | None  # the working_for() token of the waiting thread


_lock = threading.Lock()
_waits: dict[int, _Wait] = {}  # Invariant: thread ident -> its one wait; only under _lock.


@contextmanager
def waiting_for(target: WaitTarget, label: str, *, idle: Idle | None = None) -> Iterator[None]:
    """Around a wait until ``target``'s actor has done something (``idle``: until the
    agent is idle or disposed, which needs more: see :class:`Idle`): registered for
    cycle detection (raises :class:`WaitCycleError` if the wait would close a cycle),
    and lent a dispatcher worker as :func:`actors.waiting_on_actors` does."""
    me = threading.get_ident()
    wait = _Wait(target=target, label=label, idle=idle, effect_of=working_for())
    with _lock:
        outer = _waits.get(me)  # (a wait inside a wait: a listener run while waiting)
        _waits[me] = wait
        cycle = _cycle(me, wait)
        if cycle is not None:
            _restore(me, outer)
    if cycle is not None:
        raise WaitCycleError(cycle)
    try:
        with waiting_on_actors():
            yield
    finally:
        with _lock:
            _restore(me, outer)


def _restore(me: int, outer: _Wait | None) -> None:
    if outer is None:
        del _waits[me]
    else:
        _waits[me] = outer


def _cycle(me: int, wait: _Wait) -> str | None:
    """The description of the cycle that ``me`` waiting ``wait`` closes, or None.
    Called under ``_lock``."""
    path: list[_Wait] = []
    seen: set[tuple[int, bool]] = set()

    def walk(current: _Wait) -> bool:
        key = (id(current.target), current.idle is not None)
        if key in seen:
            return False
        seen.add(key)
        path.append(current)
        for holder in _holders(current):
            if holder == me:
                return True
            further = _waits.get(holder)
            if further is not None and walk(further):
                return True
        path.pop()
        return False

    if not walk(wait):
        return None
    chain = ", held by code that waits for ".join(w.label for w in path)
    return (
        f"this wait would never end: it waits for {chain}, held by this very code "
        "(code that an agent's progress needs must not wait for that agent)"
    )


def _holders(wait: _Wait) -> list[int]:
    """The threads whose current work ``wait.target`` needs done before ``wait`` can
    end: the one running its actor's handler; for an idle wait, also the one
    announcing its disposal and, while it runs a turn, those running its effects that
    wait themselves (one that does not ends by itself; an effect the agent no longer
    waits for, a body past its timeout, holds nothing once the agent is idle)."""
    target = wait.target
    holders = [] if target.owner is None else [target.owner]
    idle = wait.idle
    if idle is not None:
        announcer = idle.announcer()
        if announcer is not None:
            holders.append(announcer)
        if idle.running():
            holders += [t for t, w in _waits.items() if w.effect_of is target]
    return holders
