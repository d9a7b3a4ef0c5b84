"""The stages of ``Runtime.close()``, as data, and the one loop that runs them.

A close runs every stage in order whatever the ones before it raised, and raises the
first error once all ran. A stage that failed (or was interrupted) stays *left* for the
next close, which runs only what is left; so does a stage that ran on what a failed one
left it (its ``needs``): the disposals after a failed wait for the starts. A close that
ended cleanly leaves nothing: the next one returns at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

__all__ = ["CloseStages", "Deadline", "Stage"]

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
