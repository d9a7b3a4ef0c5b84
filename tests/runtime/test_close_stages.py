"""runtime.close: the close stages as data, run by one loop."""

from __future__ import annotations

import pytest

from runtime.close import CloseStages, Deadline, Stage

NOW = Deadline(until=None, timeout=None)


def _stages(ran: list[str], failing: set[str]) -> list[Stage]:
    def run(name: str) -> Stage:
        def body(_d: Deadline) -> None:
            ran.append(name)
            if name in failing:
                failing.discard(name)  # fails once
                raise OSError(f"{name} failed")

        return Stage(name, body)

    first, second, third, fourth = (run(n) for n in ("first", "second", "third", "fourth"))
    return [first, second._replace(needs="first"), third, fourth._replace(needs="third")]


def test_every_stage_runs_and_the_first_failure_is_raised_once_all_ran() -> None:
    ran: list[str] = []
    stages = CloseStages(_stages(ran, {"first", "third"}))
    with pytest.raises(OSError, match="first failed"):
        stages.run(NOW)
    assert ran == ["first", "second", "third", "fourth"]
    # The failed stages and those that ran on what they left are left for the next run.
    assert stages.left == ["first", "second", "third", "fourth"]
    assert not stages.done


def test_a_stage_whose_needed_stage_worked_is_done() -> None:
    ran: list[str] = []
    stages = CloseStages(_stages(ran, {"third"}))
    with pytest.raises(OSError, match="third failed"):
        stages.run(NOW)
    assert stages.left == ["third", "fourth"]
    stages.run(NOW)  # runs only what is left
    assert ran == ["first", "second", "third", "fourth", "third", "fourth"]
    assert stages.done
    stages.run(NOW)  # nothing left: nothing runs
    assert len(ran) == 6


def test_an_interrupt_in_a_stage_does_not_stop_the_stages_after_it() -> None:
    ran: list[object] = []

    def interrupted(_d: Deadline) -> None:
        ran.append("interrupted")
        raise KeyboardInterrupt

    stages = CloseStages([Stage("interrupted", interrupted), Stage("after", ran.append)])
    with pytest.raises(KeyboardInterrupt):
        stages.run(NOW)
    assert ran == ["interrupted", NOW]
    assert stages.left == ["interrupted"]
