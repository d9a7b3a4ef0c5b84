"""The stages of ``Runtime.close()``, as data, and the one loop that runs them.

A close runs every stage in order whatever the ones before it raised, and raises the
first error once all ran. A stage that failed (or was interrupted) stays *left* for the
next close, which runs only what is left; so does a stage that ran on what a failed one
left it (its ``needs``): the disposals after a failed wait for the starts. A close that
ended cleanly leaves nothing: the next one returns at once.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from pykka import ActorDeadError, ActorRef, Timeout

from actors import (
    AgentMailbox,
    Dispatcher,
    IoSide,
    Model,
    Scheduler,
    deadline,
    extended,
    forget,
    remaining,
)
from storage import Store

from . import gctune, waiting
from .agent import Agent
from .slots import AgentSlot
from .table import AgentTable

__all__ = [
    "CloseStages",
    "Closing",
    "Deadline",
    "Stage",
    "close_at_exit",
    "close_models",
    "shut_down_dispatcher",
    "stop_registry",
    "stop_stragglers",
]

log = logging.getLogger("corral.runtime")


class Deadline(NamedTuple):
    """What one ``close(timeout)`` gives its stages."""

    until: float | None
    """When the whole close must end (``actors`` deadline; None: no limit)."""
    timeout: float | None
    """The caller's timeout, for the warnings that name it."""


class Stage(NamedTuple):
    """One stage of a close."""

    name: str
    run: Callable[[Deadline], None]
    needs: str | None = None
    """The earlier stage whose result this one works on: when that one failed, this one
    still runs (on what there is) but is not done, and the next close runs it again."""


class CloseStages:
    """What is left to close of one runtime, in order. Not thread-safe: the runtime
    lets one close at a time run it (under its lock, which guards :attr:`running`)."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self._left: list[Stage] = list(stages)
        self.running = False
        """A close is running the stages (set and cleared under the runtime's lock)."""

    @property
    def left(self) -> list[str]:
        """The names of the stages no close has done yet, in order."""
        return [stage.name for stage in self._left]

    @property
    def done(self) -> bool:
        """Whether a close did every stage."""
        return not self._left

    def run(self, deadline: Deadline) -> None:
        """Run every stage left, in order; raise the first failure once all ran."""
        failed: BaseException | None = None
        not_done: set[str] = set()
        for stage in list(self._left):
            try:
                self.run_stage(stage, deadline)
            except BaseException as err:  # raised once every stage ran
                not_done.add(stage.name)
                if failed is None:
                    failed = err
                else:
                    log.exception("closing the runtime (%s) failed too", stage.name)
            else:
                if stage.needs in not_done:
                    not_done.add(stage.name)  # it ran on what a failed stage left it
                else:
                    self._left.remove(stage)
        if failed is not None:
            raise failed

    def run_stage(self, stage: Stage, deadline: Deadline) -> None:
        """Run one stage (the seam a test wraps to fail or interrupt one)."""
        stage.run(deadline)


# ---------------------------------------------------------------- the stages' bodies


def stop_stragglers(
    stuck: Sequence[AgentSlot[Any]], until: float | None, timeout: float | None, cut: str | None
) -> None:
    """Stop the actors of agents whose disposal did not end in time (a tool body
    still running, say): their turns stay open in the log, their outcome unknown, as
    after a crash (``resume`` repairs them). Left running, such an actor would finish
    its turn on a closed runtime, and stay registered with pykka for good.

    An actor stuck in a handler (a blocked sync listener) stops when the handler
    returns, after close: it is marked abandoned, so that it then stops without
    failing on the closed store or I/O side (see ``AgentActor._told_failed``). ``cut``:
    what interrupted the wait for the disposals, if anything did."""
    stops = []
    for slot in stuck:
        if cut is None:
            log.warning(
                "agent %s did not stop within %s s; stopped with its turn left open",
                slot.id,
                timeout,
            )
        else:
            log.warning(
                "agent %s had not stopped when close was interrupted (%s) while it "
                "waited for the disposals; stopped with its turn left open",
                slot.id,
                cut,
            )
        ref = slot.ref if slot.registered else None
        if ref is not None:
            mailbox = ref.actor_inbox
            if isinstance(mailbox, AgentMailbox):
                mailbox.abandoned = True
            with contextlib.suppress(ActorDeadError):
                stops.append((slot, ref.stop(block=False)))
    until = extended(until)  # a stop message is handled in a moment unless stuck
    for slot, stop in stops:
        try:
            stop.get(timeout=remaining(until))
        except Timeout:
            log.warning(
                "agent %s is still in a handler (a blocked sync listener, say) after "
                "%s s: it stops when that returns, writing nothing more",
                slot.id,
                timeout,
            )
        except Exception:  # stopped anyway; close goes on
            log.debug("stopping agent %s", slot.id, exc_info=True)


def stop_registry(registry: ActorRef[Any], dispatcher: Dispatcher, d: Deadline) -> None:
    """Stop the agent registry actor by the deadline (and a moment more)."""
    if dispatcher.is_shut_down:
        # A close() finishing what a failed one left: the registry's stop can never
        # be handled now. It runs nothing (every agent is stopped or abandoned): pykka
        # forgets it, as it does an actor whose start failed (PooledActor).
        forget(registry)
        return
    try:
        registry.stop(timeout=remaining(extended(d.until)))
    except Timeout:
        log.warning("the agent registry did not stop within %s s; left to stop", d.timeout)


def close_models(models: Iterable[Model], loop: asyncio.AbstractEventLoop, d: Deadline) -> None:
    """Close the models agents used (their HTTP clients live on this I/O loop), by
    the close's deadline in all."""
    until = extended(d.until)  # closing a client takes a moment; they share it
    for model in list(models):
        aclose = getattr(model, "aclose", None)
        if aclose is None:
            continue
        closing = asyncio.run_coroutine_threadsafe(aclose(), loop)
        try:
            closing.result(remaining(until))
        except TimeoutError:
            closing.cancel()
            log.warning("closing model %r did not end in time; cancelled", model)
        except Exception:  # a model that fails to close must not block close
            log.exception("closing model %r failed", model)


def shut_down_dispatcher(dispatcher: Dispatcher, d: Deadline) -> None:
    """Stop the dispatcher's workers by the deadline (and a moment more)."""
    if not dispatcher.shutdown(remaining(extended(d.until))):
        log.warning(
            "a dispatcher thread was still running a handler (a blocked sync "
            "listener, say) after %s s; it ends when that returns",
            d.timeout,
        )


class Closing:
    """The bodies of one runtime's close stages (:meth:`stages`), and what they hand
    each other: the agents to stop, what cut the wait for their disposals."""

    def __init__(
        self,
        table: AgentTable,
        *,
        store: Store,
        owns_store: bool,
        tuned_gc: bool,
        dispatcher: Dispatcher,
        scheduler: Scheduler,
        io: IoSide,
    ) -> None:
        self._table = table
        self._store = store
        self._owns_store = owns_store
        self._tuned_gc = tuned_gc
        self._dispatcher = dispatcher
        self._scheduler = scheduler
        self._io = io
        self.agents: list[AgentSlot[Agent]] = []
        """The agents close() stops (set by the close that begins, and by "starts")."""
        self._disposals_cut: str | None = None  # what interrupted close's wait for them
        self.stages = CloseStages(self._stages())
        """What no close() has done yet."""

    def close(self, timeout: float | None, at_exit: Callable[[], None]) -> None:
        """Run the stages left (see ``Runtime.close``); ``at_exit``: the runtime's exit
        hook, unregistered once a close did every stage."""
        until = deadline(timeout)
        table, stages = self._table, self.stages
        with table.lock:
            if stages.running or stages.done:
                return  # another close() is under way, or one closed everything
            table.closed = True
            stages.running = True
            if "starts" in stages.left:  # the agents live now, whatever "starts" gets to
                self.agents = table.slots()
            supervisions = table.take_supervisions()
        for supervision in supervisions:  # a pending restart is cancelled, none starts
            supervision.close()
        try:
            stages.run(Deadline(until, timeout))
        finally:
            with table.lock:
                stages.running = False
                if stages.done:
                    atexit.unregister(at_exit)  # (kept to finish a failed close)

    def _stages(self) -> tuple[Stage, ...]:
        """The stages of ``Runtime.close()``, in order."""
        table, dispatcher = self._table, self._dispatcher
        return (
            # wait for spawns under way; the agents to stop
            Stage("starts", self._close_starts),
            # their disposals (inboxes kept), waited for
            Stage("agents", self._dispose_for_close, needs="starts"),
            # the actors of those that did not end, stopped
            Stage("stragglers", self._close_stragglers, needs="agents"),
            Stage("registry", lambda d: stop_registry(table.registry, dispatcher, d)),
            Stage("scheduler", lambda d: self._scheduler.close(remaining(extended(d.until)))),
            Stage("models", lambda d: close_models(table.models.values(), self._io.loop, d)),
            Stage("io", lambda d: self._io.close(remaining(d.until))),
            Stage("dispatcher", lambda d: shut_down_dispatcher(dispatcher, d)),
            Stage("store", self._close_store),
            Stage("gc", self._close_gc),
        )

    def _close_starts(self, d: Deadline) -> None:
        self._table.claim_starts(d.until, d.timeout, self.agents)

    def _close_stragglers(self, d: Deadline) -> None:
        stuck = [slot for slot in self.agents if not slot.disposed.is_set()]
        cut, self._disposals_cut = self._disposals_cut, None
        stop_stragglers(stuck, d.until, d.timeout, cut)

    def _close_store(self, _d: Deadline) -> None:
        self._table.released = True
        if self._owns_store:
            self._store.close()

    def _close_gc(self, _d: Deadline) -> None:
        if self._tuned_gc:
            # Cleared first: once per runtime, even if this stage runs again (a
            # Ctrl-C after the release would have released another runtime's).
            self._tuned_gc = False
            gctune.release_gc_tuning()

    def _dispose_for_close(self, d: Deadline) -> None:
        """Begin every agent's disposal (inbox kept) and wait for them by ``until``; the
        stage after stops those that did not end. One agent's failure to begin does
        not keep the others from theirs (the first is raised after the wait)."""
        agents = self.agents
        failed: Exception | None = None
        for slot in agents:
            try:
                self._table.begin_disposal(slot, keep_inbox=True)
            except Exception as err:  # noqa: BLE001 - raised below, once all were asked
                failed = failed or err
        # In slices on the main thread (runtime.waiting): a Ctrl-C that lands just before
        # the wait's system call is handled within one, not once every turn has ended
        # (corral run's handler says the close goes on, or quits at the next press).
        try:
            for slot in agents:
                waiting.wait(slot.disposed, remaining(d.until))
        except BaseException as err:  # (a Ctrl-C): the stage after stops them at once
            self._disposals_cut = type(err).__name__
            raise
        if failed is not None:
            raise failed


class Closable(Protocol):
    """What :func:`close_at_exit` closes."""

    def close(self) -> None: ...


def close_at_exit(ref: weakref.ref[Closable]) -> Callable[[], None]:
    """An exit hook that closes the runtime if it is still open (it holds it weakly).
    Not in a child forked from its process: the runtime's threads did not go with it."""
    pid = os.getpid()

    def close() -> None:
        runtime = ref()
        if runtime is None or os.getpid() != pid:
            return
        try:
            runtime.close()
        except Exception:  # the interpreter is exiting: say so, do not stop the exit
            log.exception("closing a runtime at exit failed")

    return close
