"""What a shard does with each verb of :mod:`runtime.cluster.wire`: the ``Agent`` method
of the same name, on the agent of that id in the shard's ``Runtime``.

:func:`apply` dispatches one verb (``match`` over the :data:`~runtime.cluster.wire.Verb`
union). A ``SendMany`` returns one outcome per send (``None`` or the error that refused
it: one bad send fails alone); every other verb returns its value or raises, and the
connection carries the error back to the caller. An agent the shard does not host is
:class:`~runtime.AgentDisposedError`, as on a runtime whose agent was disposed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, assert_never

from runtime import Agent, AgentDisposedError, DuplicateMessageError, Runtime, UserMessage

from .wire import (
    Cancel,
    Clear,
    Events,
    Inbox,
    Messages,
    Passivate,
    Remove,
    Replace,
    Send,
    SendMany,
    Splice,
    Status,
    Verb,
    WaitIdle,
)

__all__ = ["apply", "send_all", "unknown_agent", "wait_idle"]

Outcome = BaseException | None


def unknown_agent(agent_id: str) -> AgentDisposedError:
    return AgentDisposedError(
        f"agent {agent_id} is not live in its shard (disposed, or never spawned); "
        "Cluster.resume() brings back a disposed agent from its log"
    )


def _agent(rt: Runtime, agent_id: str) -> Agent:
    try:
        return rt.get(agent_id)
    except KeyError:
        raise unknown_agent(agent_id) from None


def send_all(rt: Runtime, sends: Sequence[Send], retry: bool) -> list[Outcome]:
    """``followup`` / ``steer`` / ``inject`` each; returns once each is in its agent's
    mailbox (``flush`` makes them durable). A retried send whose id the agent's log
    has, or whose message is already queued, was done."""
    outcomes: list[Outcome] = []
    for send in sends:
        try:
            agent = rt.get(send.agent)
            if retry and agent.session.was_inboxed(send.id):
                outcomes.append(None)
                continue
            verb = agent.followup if send.lane == "next-turn" else agent.steer
            if not send.wake:
                verb = agent.inject
            message: Any = send.message
            if isinstance(message, UserMessage):
                verb(message)
            else:
                verb(message, id=send.id, source=send.source)
            outcomes.append(None)
        except DuplicateMessageError as err:
            outcomes.append(None if retry else err)
        except Exception as err:  # noqa: BLE001 - one item's failure is its outcome
            outcomes.append(unknown_agent(send.agent) if isinstance(err, KeyError) else err)
    return outcomes


def wait_idle(rt: Runtime, agent_ids: Sequence[str] | None, timeout: float | None) -> bool:
    """Whether every agent named (all, for None) went idle within ``timeout``."""
    agents = rt.agents() if agent_ids is None else []
    for agent_id in agent_ids or ():
        try:
            agents.append(rt.get(agent_id))
        except KeyError:
            continue  # disposed: idle for good
    until = None if timeout is None else time.monotonic() + timeout
    for agent in agents:
        left = None if until is None else max(0.0, until - time.monotonic())
        if not agent.wait_idle(timeout=left):
            return False
    return True


def apply(rt: Runtime, verb: Verb) -> object:
    """Do ``verb`` on ``rt``'s agent; its value (see the module doc)."""
    match verb:
        case SendMany(sends=sends, retry=retry):
            return send_all(rt, sends, retry)
        case Status(agent=agent_id):
            return _agent(rt, agent_id).status
        case Events(agent=agent_id, lower=lower, upper=upper):
            return _agent(rt, agent_id).session.events(lower, upper)
        case Messages(agent=agent_id):
            return _agent(rt, agent_id).session.messages()
        case Inbox(agent=agent_id):
            return _agent(rt, agent_id).inbox
        case WaitIdle(agents=agent_ids, timeout=timeout):
            return wait_idle(rt, agent_ids, timeout)
        case Cancel(agent=agent_id, cause=cause, keep_inbox=keep_inbox):
            _agent(rt, agent_id).cancel(cause, keep_inbox=keep_inbox)
            return None
        case Remove(agent=agent_id, message_id=message_id, timeout=timeout):
            return _agent(rt, agent_id).remove(message_id, timeout=timeout)
        case Replace(agent=agent_id, message_id=message_id, message=message, timeout=timeout):
            return _agent(rt, agent_id).replace(message_id, message, timeout=timeout)
        case Splice(
            agent=agent_id,
            lane=lane,
            start=start,
            removed_count=removed_count,
            messages=messages,
            timeout=timeout,
        ):
            return _agent(rt, agent_id).splice(
                lane, start, removed_count, messages, timeout=timeout
            )
        case Clear(agent=agent_id, timeout=timeout):
            return _agent(rt, agent_id).clear(timeout=timeout)
        case Passivate(agent=agent_id, timeout=timeout):
            return _agent(rt, agent_id).passivate(timeout)
        case _:
            assert_never(verb)
