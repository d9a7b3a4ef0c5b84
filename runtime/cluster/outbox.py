"""The driver's sends to one shard, in order and in batches.

Ray does not keep the order of calls to a threaded actor (measured: a few inversions in
3,000 calls, even in a concurrency group of one thread), and an agent's sends must be
applied in the order they were made. So every send to a shard goes through its
:class:`Outbox`: a driver thread takes everything queued so far as one batch, makes one
``send`` call, and sends the next batch only when that one returned. Sends made while a
batch is in flight join the next one: many senders cost one Ray call per round trip.
A waited send returns when its batch did; an unwaited one at once, and
:meth:`Outbox.drain` (``cluster.flush()``) reports its refusal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from .errors import ClusterClosedError
from .shard import Send
from .transport import ShardLink

__all__ = ["Outbox"]


class _Batch:
    """Sends handed over together; ``done`` is set once the shard answered for them."""

    def __init__(self) -> None:
        self.sends: list[Send] = []
        self.waited: list[bool] = []  # per send: a caller waits for its outcome
        self.outcomes: list[BaseException | None] = []
        self.done = threading.Event()


class Outbox:
    """The ordered sends of one shard (see the module doc)."""

    def __init__(self, link: ShardLink) -> None:
        self._link = link
        self._ready = threading.Condition()
        self._open: _Batch = _Batch()  # where new sends go
        self._in_flight: _Batch | None = None
        self._unreported: list[BaseException] = []  # refusals of unwaited sends
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"corral-sends-{link.index}", daemon=True
        )
        self._thread.start()

    def put(self, sends: Sequence[Send], wait: bool) -> list[BaseException | None]:
        """Queue ``sends``; with ``wait``, their outcomes once applied, else ``[]``."""
        ticket = self.queue(sends, wait)
        return ticket() if wait else []

    def queue(
        self, sends: Sequence[Send], waited: bool
    ) -> Callable[[], list[BaseException | None]]:
        """Queue ``sends``; returns what waits for their outcomes (for a waited queue:
        an unwaited one's refusals go to :meth:`drain`)."""
        with self._ready:
            if self._closed:
                raise ClusterClosedError
            batch = self._open
            first = len(batch.sends)
            batch.sends.extend(sends)
            batch.waited.extend([waited] * len(sends))
            self._ready.notify_all()

        def outcomes() -> list[BaseException | None]:
            batch.done.wait()
            return batch.outcomes[first : first + len(sends)]

        return outcomes

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._open.sends and not self._closed:
                    self._ready.wait()
                if not self._open.sends:
                    return  # closed and empty
                batch, self._open = self._open, _Batch()
                self._in_flight = batch
            try:
                outcomes = self._link.call("send", batch.sends, retried=True)
            except BaseException as err:  # noqa: BLE001 - each send of the batch gets it
                outcomes = [err] * len(batch.sends)
            with self._ready:
                batch.outcomes = list(outcomes)
                self._unreported.extend(
                    o
                    for o, waited in zip(outcomes, batch.waited, strict=True)
                    if o is not None and not waited
                )
                self._in_flight = None
                batch.done.set()
                self._ready.notify_all()

    def drain(self) -> list[BaseException]:
        """Wait until every send queued before the call was answered; the refusals not
        reported yet (each once)."""
        with self._ready:
            target = self._open if self._open.sends else self._in_flight
        if target is not None:
            target.done.wait()
        with self._ready:
            errors, self._unreported = self._unreported, []
        return errors

    def close(self) -> None:
        """Send what is queued, then stop the thread."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        self._thread.join(timeout=60)
