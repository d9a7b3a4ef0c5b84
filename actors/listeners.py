"""The listeners of one event name, as the bus keeps them: immutable chains in
registration order (``last=True`` ones after all others), replaced whole on change
(copy-on-write), so that an emit reads a consistent chain without taking a lock."""

from __future__ import annotations

import inspect
from bisect import bisect_right
from collections.abc import Callable
from functools import partial
from typing import Final

__all__ = ["EMPTY_CHAIN", "LAST", "Chain", "Entry", "Listener", "Topic", "is_async"]

Listener = Callable[..., object]
"""``(event)`` for emit/serial, ``(event, next)`` for waterfall; sync or ``async def``."""


class Entry:
    __slots__ = ("is_async", "listener", "scope", "seq")

    def __init__(self, seq: int, listener: Listener, scope: str | None) -> None:
        self.seq = seq
        self.listener = listener
        self.scope = scope
        self.is_async = is_async(listener)


class Chain:
    """An immutable, ordered tuple of listeners plus whether any of them is async."""

    __slots__ = ("entries", "has_async")

    def __init__(self, entries: tuple[Entry, ...]) -> None:
        self.entries = entries
        self.has_async = any(e.is_async for e in entries)


EMPTY_CHAIN = Chain(())

# Added to the seq of a ``last=True`` entry: chains are ordered by seq, so such an entry
# comes after every other one, the ones registered after it included.
LAST: Final = 1 << 62


def _with(chain: Chain, entry: Entry) -> Chain:
    """``chain`` with ``entry`` in its seq order (at the end, unless ``last`` entries are)."""
    entries = chain.entries
    if not entries or entries[-1].seq < entry.seq:
        return Chain((*entries, entry))
    index = bisect_right(entries, entry.seq, key=_seq)
    return Chain((*entries[:index], entry, *entries[index:]))


class Topic:
    """The listeners of one event name.

    Chains are immutable and replaced whole under the bus lock (copy-on-write), so a
    reader always iterates a consistent tuple without locking. Registering costs
    O(listeners of the same scope), so 10,000 agents each with a scoped listener
    stay cheap.
    """

    __slots__ = ("everyone", "merged", "scoped", "version")

    def __init__(self) -> None:
        self.everyone = EMPTY_CHAIN
        self.scoped: dict[str, Chain] = {}
        # Invariant: bumped after every change; a cached merge of an older version is stale.
        self.version = 0
        self.merged: dict[str, tuple[int, Chain]] = {}

    def is_empty(self) -> bool:
        return not self.everyone.entries and not self.scoped

    def add(self, entry: Entry) -> None:
        if entry.scope is None:
            self.everyone = _with(self.everyone, entry)
        else:
            self.scoped[entry.scope] = _with(self.scoped.get(entry.scope, EMPTY_CHAIN), entry)
        self.version += 1

    def remove(self, entry: Entry) -> None:
        if entry.scope is None:
            self.everyone = Chain(tuple(e for e in self.everyone.entries if e is not entry))
        else:
            mine = self.scoped.get(entry.scope, EMPTY_CHAIN)
            kept = tuple(e for e in mine.entries if e is not entry)
            if kept:
                self.scoped[entry.scope] = Chain(kept)
            else:
                self.scoped.pop(entry.scope, None)
                self.merged.pop(entry.scope, None)
        self.version += 1

    def select(self, scope: str | None) -> Chain:
        if scope is None:
            return self.everyone
        version = self.version  # read before the chains: see the invariant above
        mine = self.scoped.get(scope)
        if mine is None:
            return self.everyone
        everyone = self.everyone
        if not everyone.entries:
            return mine
        cached = self.merged.get(scope)
        if cached is not None and cached[0] == version:
            return cached[1]
        chain = Chain(tuple(sorted(everyone.entries + mine.entries, key=_seq)))
        self.merged[scope] = (version, chain)
        return chain


def _seq(entry: Entry) -> int:
    return entry.seq


def is_async(listener: Listener) -> bool:
    """Whether ``listener`` is known up front to return a coroutine: an ``async def``, an
    object with an ``async def __call__``, either of them under ``functools.partial``
    or a decorator that sets ``__wrapped__`` (``functools.wraps``). A listener this
    misses (a lambda returning a coroutine, say) is called as sync and what it returns
    is awaited all the same when it is awaitable (see ``isawaitable`` below)."""
    for _ in range(100):  # a cycle of __wrapped__ must not hang registration
        if inspect.iscoroutinefunction(listener):
            return True
        call = getattr(type(listener), "__call__", None)  # noqa: B004 - async callable objects
        if call is not None and inspect.iscoroutinefunction(call):
            return True
        if isinstance(listener, partial):
            listener = listener.func
            continue
        wrapped = getattr(listener, "__wrapped__", None)
        if wrapped is None or not callable(wrapped):
            return False
        listener = wrapped
    return False
