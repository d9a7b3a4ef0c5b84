"""The driver's sends to one shard, in order, batched, over its direct connection.

An agent's sends must be applied in the order they were made. The shard applies the
sends of one connection in the order they were written (:mod:`runtime.cluster.listener`),
so the order is kept by writing them in order: every send to a shard goes through its
:class:`Outbox`. A waited send is written by its caller at once, together with every
unwaited send queued before it (one frame); unwaited sends are written by the outbox's
thread, as many as were queued meanwhile in one frame. Writes do not wait for answers
(they are pipelined: answers are matched by id). A waited send returns when its
frame's answer came; an unwaited one at once, and :meth:`Outbox.drain`
(``cluster.flush()``) waits for every frame written before it and reports the refusals
of unwaited sends (each once).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from .connection import Pending, ShardConnection
from .errors import ClusterClosedError
from .wire import Send, SendMany, Verb

__all__ = ["Outbox"]


class _Frame:
    """Sends written together; ``answered`` once the shard's answer came."""

    __slots__ = ("answered", "outcomes", "sends", "waited")

    def __init__(self) -> None:
        self.sends: list[Send] = []
        self.waited: list[bool] = []  # per send: a caller waits for its outcome
        self.outcomes: list[BaseException | None] = []
        self.answered = threading.Event()


class Outbox:
    """The ordered sends of one shard (see the module doc)."""

    def __init__(self, connection: ShardConnection) -> None:
        self._connection = connection
        self._lock = threading.Condition()  # the open frame, and writing in order
        self._open = _Frame()  # where unwaited sends wait for the outbox's thread
        self._written: list[_Frame] = []  # written, not answered yet
        self._unreported: list[BaseException] = []  # refusals of unwaited sends
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"corral-sends-{connection.index}", daemon=True
        )
        self._thread.start()

    def put(self, sends: Sequence[Send], wait: bool) -> list[BaseException | None]:
        """Queue ``sends``; with ``wait``, their outcomes once applied, else ``[]``."""
        ticket = self.queue(sends, wait)
        return ticket() if wait else []

    def queue(
        self, sends: Sequence[Send], waited: bool
    ) -> Callable[[], list[BaseException | None]]:
        """Queue ``sends`` (written now when ``waited``); returns what waits for their
        outcomes (an unwaited send's refusal goes to :meth:`drain`)."""
        with self._lock:
            if self._closed:
                raise ClusterClosedError
            frame = self._open
            first = len(frame.sends)
            frame.sends.extend(sends)
            frame.waited.extend([waited] * len(sends))
            if waited:
                self._write()
            else:
                self._lock.notify_all()

        def outcomes() -> list[BaseException | None]:
            frame.answered.wait()
            return frame.outcomes[first : first + len(sends)]

        return outcomes

    def submit(self, verb: Verb) -> Pending:
        """Write ``verb`` after every send queued before it (an edit, a wait for idle
        and a read see the sends made before them)."""
        with self._lock:
            if self._closed:
                raise ClusterClosedError
            if self._open.sends:
                self._write()
            return self._connection.submit(verb)

    def _write(self) -> None:
        """(under the lock) Write the open frame and open the next one."""
        frame, self._open = self._open, _Frame()
        self._written.append(frame)
        try:
            pending = self._connection.submit(SendMany(frame.sends))
        except BaseException as err:  # noqa: BLE001 - closed: each send of it gets it
            self._answer(frame, [err] * len(frame.sends))
            return
        pending.then(lambda answered: self._answered(frame, answered))

    def _answered(self, frame: _Frame, pending: Pending) -> None:
        value, failed = pending.outcome()
        outcomes: list[BaseException | None] = [value] * len(frame.sends) if failed else list(value)
        self._answer(frame, outcomes)

    def _answer(self, frame: _Frame, outcomes: list[BaseException | None]) -> None:
        with self._lock:
            frame.outcomes = outcomes
            self._unreported.extend(
                o
                for o, waited in zip(outcomes, frame.waited, strict=True)
                if o is not None and not waited
            )
            if frame in self._written:
                self._written.remove(frame)
            frame.answered.set()
            self._lock.notify_all()

    def _run(self) -> None:
        with self._lock:
            while True:
                while not self._open.sends and not self._closed:
                    self._lock.wait()
                if not self._open.sends:
                    return  # closed and empty
                self._write()

    def drain(self) -> list[BaseException]:
        """Wait until every send queued before the call was answered; the refusals not
        reported yet (each once)."""
        with self._lock:
            if self._open.sends:
                self._write()
            frames = list(self._written)
        for frame in frames:
            frame.answered.wait()
        with self._lock:
            errors, self._unreported = self._unreported, []
        return errors

    def close(self) -> None:
        """Write what is queued, wait for the answers, then stop the thread."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=60)
        with self._lock:
            frames = list(self._written)
        for frame in frames:
            frame.answered.wait(60)
