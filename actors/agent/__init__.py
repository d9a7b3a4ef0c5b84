"""The agent actor (:mod:`.actor`) and the one vocabulary of its messages (:mod:`.messages`)."""

from .actor import AgentActor
from .mailbox import AgentMailbox
from .messages import (
    AgentMessage,
    Announce,
    AwaitIdle,
    Barrier,
    Cancel,
    Edit,
    Insert,
    Kill,
    Quiescent,
    apply_edit,
)

__all__ = [
    "AgentActor",
    "AgentMailbox",
    "AgentMessage",
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
