"""How a failed request ends its turn: offered to ``agent/request-error``, whose
listeners may ask for a retry turn (a checked :class:`Retry`) or let the turn end as
error, with a failure bounded to fit its ``turn/end``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from storage import MAX_FAILURE_CHARS, LlmFailure

from ..effects import TurnAborted
from ..errors import ListenerError
from ..events import RequestError, Retry, retry_delay_problem
from ..model import checked_failure
from ..signal import TurnSignal
from ..tools import shown

__all__ = ["Waterfall", "bounded", "decide_retry", "listener_failure"]

log = logging.getLogger("corral.turn")


Waterfall = Callable[[str, Any, Callable[[], Any]], Awaitable[Any]]
"""``TurnMachine``'s waterfall: ``(name, event, default)``, awaited for its outcome."""


def bounded(failure: LlmFailure) -> LlmFailure:
    """A failure that fits in a log record: well formed (a model may build a malformed
    one by hand: see ``checked_failure``); a server may send megabytes of error text, or
    text that is not UTF-8 (a lone surrogate)."""
    failure = checked_failure(failure)
    message = failure.message
    if len(message) > MAX_FAILURE_CHARS:
        rest = len(message) - MAX_FAILURE_CHARS
        message = f"{message[:MAX_FAILURE_CHARS]}... ({rest} more characters)"
    message = message.encode("utf-8", "replace").decode("utf-8")
    if message == failure.message:
        return failure
    return msgspec.structs.replace(failure, message=message)


def listener_failure(name: str, err: BaseException) -> LlmFailure:
    """The failure a turn ends with when a listener of ``name`` raised ``err``."""
    cause = err.cause if isinstance(err, ListenerError) else err
    return LlmFailure(message=f"{name} listener failed: {cause!r}", code="UNKNOWN")


def _no_retry() -> None:
    return None


async def decide_retry(
    waterfall: Waterfall, event: RequestError, failure: LlmFailure, signal: TurnSignal
) -> tuple[LlmFailure, Retry | None] | None:
    """Offer ``event`` (a bounded ``failure``) to the ``agent/request-error`` listeners:
    ``(failure, retry)`` for a valid :class:`Retry`, ``(failure, None)`` for none (its
    message then names what the listeners did wrong, if anything), None if the turn was
    aborted meanwhile. Raises ``TurnAborted`` if the wait for an async listener was."""
    # What the listeners did wrong, if anything: named in the failure the turn ends
    # with (as pre-step and request name theirs), which keeps the request's code.
    problem: str | None = None
    try:
        decision = await waterfall("agent/request-error", event, _no_retry)
    except TurnAborted:
        raise
    except Exception as err:  # a throwing listener: no retry
        log.exception("agent/request-error listener failed; the turn ends as error")
        problem = listener_failure("agent/request-error", err).message
        decision = None
    if signal.aborted:
        return None
    if isinstance(decision, Retry):
        # Retry checks its delay when made; one changed since must not be logged
        # (llm/retry) or waited for.
        bad_delay = retry_delay_problem(decision.delay_s)
        if bad_delay is None:
            return failure, decision
        problem = f"agent/request-error returned a Retry whose {bad_delay}"
    elif decision is not None:
        problem = f"agent/request-error must return a Retry or None, got {shown(decision)}"
    if problem is not None:
        if decision is not None:
            log.error("%s; the turn ends as error without a retry", problem)
        failure = msgspec.structs.replace(
            failure, message=f"{failure.message} (no retry: {problem})"
        )
    return failure, None
