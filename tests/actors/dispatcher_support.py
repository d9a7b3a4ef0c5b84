"""What the dispatcher and mailbox tests share: a logging actor, a ref's mailbox."""

from __future__ import annotations

import threading
from typing import Any

from pykka import ActorRef

from actors import Dispatcher, Mailbox, PooledActor

WAIT = 5.0


def mailbox(ref: ActorRef[Any]) -> Mailbox:
    inbox = ref.actor_inbox
    assert isinstance(inbox, Mailbox)
    return inbox


class Log(PooledActor):
    """Appends (name, message) to a shared log; can be held on a gate."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        log: list[tuple[str, Any]],
        name: str = "a",
        gate: threading.Event | None = None,
        entered: threading.Event | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.actor_dispatcher = dispatcher
        for key, value in options.items():
            setattr(self, key, value)
        self.log = log
        self.name = name
        self.gate = gate
        self.entered = entered

    def on_receive(self, message: Any) -> Any:
        if message == "hold":
            assert self.entered is not None
            assert self.gate is not None
            self.entered.set()
            self.gate.wait(WAIT)
        if message == "boom":
            raise ValueError("boom")
        self.log.append((self.name, message))
        return message
