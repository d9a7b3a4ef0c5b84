"""The agent actor's mailbox, which *is* its inbox: control envelopes in send order,
plus the pending user messages of its two lanes; what a crashed agent's queued sends
become (kept for ``rt.resume``, or answered)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pykka._envelope import Envelope

from .._mailbox import Mailbox, MailboxOwner
from ..inbox import Inbox, InboxView
from .messages import AwaitIdle, Insert

__all__ = ["AgentMailbox"]

log = logging.getLogger("corral.agent")


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
