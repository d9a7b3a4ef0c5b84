"""The built-in retry policy: an ``agent/request-error`` listener (CONTRACT section 5).

Up to ``max_retries`` retries for transient failures (``RATE_LIMIT``, ``SERVER``,
``TIMEOUT``, ``TRANSPORT``, ``EMPTY_RESPONSE``), exponential backoff from ``base_s`` to
``cap_s`` with ``jitter`` (10%) either way, honouring the provider's ``retry_after_s``
(never sooner, later by up to ``jitter``, so that the agents told one retry-after do
not all retry at one instant) up to ``max_retry_after_s`` (2 minutes): a provider that
asks for a longer wait is not retried, and the failure ends the turn. The loop logs
each accepted retry durably as ``llm/retry`` and opens a retry turn.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Final

from actors import MAX_RETRY_DELAY_S, RequestError, Retry

__all__ = ["DEFAULT_RETRYABLE", "RetryPolicy"]

DEFAULT_RETRYABLE: Final = frozenset(
    {"RATE_LIMIT", "SERVER", "TIMEOUT", "TRANSPORT", "EMPTY_RESPONSE"}
)


class RetryPolicy:
    """Decides retries, as an ``agent/request-error`` waterfall listener.

    Every runtime registers ``RetryPolicy()`` unless told otherwise: give another with
    ``Runtime.open(retry_policy=RetryPolicy(max_retries=2))``, or none with
    ``retry_policy=None``. The runtime's policy is the innermost listener, whenever the
    others were added: a listener added with ``rt.on("agent/request-error", ...)`` or
    ``agent.on(...)`` sees every failure first and may own its recovery (return a
    ``Retry``, or ``None`` for no retry, without calling ``next``); a failure it passes
    on (it calls ``next``) reaches the runtime's policy, which decides. So a listener
    that only observes calls ``next()`` and returns what it gives; a stricter policy may
    join the runtime's (deciding what it must, passing the rest on) or replace it."""

    def __init__(
        self,
        *,
        max_retries: int = 5,
        retryable: frozenset[str] = DEFAULT_RETRYABLE,
        base_s: float = 0.5,
        cap_s: float = 10.0,
        jitter: float = 0.1,
        max_retry_after_s: float = 120.0,
        rng: random.Random | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {jitter}")
        for name, value in (
            ("base_s", base_s),
            ("cap_s", cap_s),
            ("max_retry_after_s", max_retry_after_s),
        ):
            if not (isinstance(value, int | float) and 0 <= value <= MAX_RETRY_DELAY_S):
                raise ValueError(
                    f"{name} must be a finite number of seconds from 0 to "
                    f"{MAX_RETRY_DELAY_S:g} (the longest a Retry may wait), got {value!r}"
                )
        self.max_retries = max_retries
        self.retryable = retryable
        self.base_s = base_s
        self.cap_s = cap_s
        self.jitter = jitter
        self.max_retry_after_s = max_retry_after_s
        self._rng = rng or random.Random()

    def delay(self, attempt: int, retry_after_s: float | None) -> float:
        """The wait before retry number ``attempt`` (1-based)."""
        if retry_after_s is not None and retry_after_s >= 0:
            # Never sooner than the provider asked, and spread later by up to
            # ``jitter``: agents told the same retry-after do not all retry at once.
            spread = retry_after_s * (1 + self.jitter * self._rng.random())
            return float(min(MAX_RETRY_DELAY_S, spread))
        backoff = min(self.cap_s, self.base_s * 2 ** (attempt - 1))
        jittered = backoff * (1 + self.jitter * (2 * self._rng.random() - 1))
        return float(min(MAX_RETRY_DELAY_S, jittered))

    def __call__(self, event: RequestError, next_: Callable[[], Any]) -> Any:
        failure = event.failure
        attempt = len(event.prior_failures) + 1
        retry_after = failure.retry_after_s
        if (
            failure.code in self.retryable
            and attempt <= self.max_retries
            and not event.signal.aborted
            and (retry_after is None or retry_after <= self.max_retry_after_s)
        ):
            return Retry(delay_s=self.delay(attempt, retry_after))
        return next_()
