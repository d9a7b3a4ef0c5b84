"""What a step sends, checked before it goes: a pre-step listener's rewritten batch
(:func:`checked_batch`), the ``request/header`` logged when the request's configuration
changes (:class:`HeaderLog`), and the request counted on every usage meter
(:func:`take_request`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec

from storage import LimitExceeded, RequestConfig, RequestHeader, ToolSpec, UserMessage

from ..limits import UsageMeter

__all__ = ["HeaderLog", "checked_batch", "take_request"]

_ENCODER: Final = msgspec.json.Encoder()
_MESSAGES: Final = msgspec.json.Decoder(tuple[UserMessage, ...])
_CONFIG: Final = msgspec.json.Decoder(RequestConfig)
_SPECS: Final = msgspec.json.Decoder(tuple[ToolSpec, ...])


def checked_batch(
    messages: Sequence[UserMessage],
    owed: Counter[str],
    was_inboxed: Callable[[str], bool],
    pending: Callable[[str], bool],
) -> tuple[UserMessage, ...]:
    """A pre-step listener's rewritten batch, each field type checked (msgspec does not
    check at construction, and an ill-typed fact would be logged but never read back), as
    typed messages decoded afresh (a content block given as a dict is logged as what it
    reads back as; nothing the listener still holds is shared with the log), each message
    once (a message is entered into the history once per claim).

    A message that went through the inbox (``was_inboxed``) enters only as claimed in
    this turn and not entered yet (``owed``, counted down here): one still pending would
    be entered unclaimed (and run again once claimed), one claimed before entered twice.
    A message of the listener's own (an id the inbox never held) may enter freely."""
    batch = _MESSAGES.decode(_ENCODER.encode(tuple(messages)))  # raises on a wrong type
    ids = [message.id for message in batch]
    if len(set(ids)) < len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"the batch holds message {twice!r} more than once")
    for message_id in ids:
        if owed[message_id] > 0:
            owed[message_id] -= 1
        elif pending(message_id):
            raise ValueError(
                f"message {message_id!r} is still pending in the inbox: it enters once claimed"
            )
        elif was_inboxed(message_id):
            raise ValueError(
                f"message {message_id!r} was not claimed in this turn (it went through the "
                "inbox before: entered in an earlier step or turn, or discarded); a message "
                "enters the history once per claim"
            )
    return batch


class HeaderLog:
    """The latest ``request/header`` of one session, written by its turn machine only."""

    def __init__(self, session: Any) -> None:
        self.session = session
        # The session's latest request/header: read from its state at the first turn
        # (by the machine), then kept current by :meth:`write`.
        self.last: RequestHeader | None = None
        # The tool registry's specs the last header was written for (it holds a copy).
        self._specs: tuple[ToolSpec, ...] | None = None

    def _unchanged(
        self, config: RequestConfig, specs: tuple[ToolSpec, ...], system: str | None
    ) -> bool:
        """Whether the last ``request/header`` holds this request's configuration."""
        last = self.last
        if last is None or last.config != config or last.system != system:
            return False
        if specs is self._specs:
            return True
        if last.tools == specs:  # e.g. the first request after a resume
            self._specs = specs
            return True
        return False

    def write(
        self,
        turn: int,
        step: int,
        config: RequestConfig,
        specs: tuple[ToolSpec, ...],
        system: str | None,
    ) -> RequestConfig:
        """Log a ``request/header`` if the request's configuration changed; return the
        config the request is sent with: the one the log holds."""
        if self._unchanged(config, specs, system):
            assert self.last is not None
            return self.last.config
        # Field types checked (msgspec does not check at construction), as fresh copies
        # that nothing outside holds: a listener's config (its ``stop`` a list it keeps)
        # and the tool registry's specs (their ``parameters`` dicts) are not handed to
        # session/event observers; what the model is sent stays what the log holds.
        config = _CONFIG.decode(_ENCODER.encode(config))
        if self._unchanged(config, specs, system):  # equal once decoded (a stop given as a list)
            assert self.last is not None
            return self.last.config
        tools = _SPECS.decode(_ENCODER.encode(specs))
        header = RequestHeader(turn=turn, step=step, config=config, system=system, tools=tools)
        self.session.append_fact(header)
        self.last = header
        self._specs = specs
        return config


def take_request(meters: Sequence[UsageMeter]) -> LimitExceeded | None:
    """Count the request about to be sent on every meter, or none of them: the
    first limit it would pass (a check at the step's start can race with other
    agents spending the same runtime-wide limit)."""
    taken: list[UsageMeter] = []
    for meter in meters:
        limited = meter.take_request()
        if limited is not None:
            for earlier in taken:
                earlier.give_back_request()
            return limited
        taken.append(meter)
    return None
