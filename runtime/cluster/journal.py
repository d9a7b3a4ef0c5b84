"""A shard's agent journal: which agents it hosts and what each is made of.

The session log holds every fact of a conversation but not the agent's recipe (model,
tools, system prompt are not in the log: ``Runtime.resume`` takes them again). A shard
that Ray restarts must resume its agents by itself, so it appends each spawn's recipe
here, fsynced *before* the spawn, and each disposal after it. One JSON line per record;
recipes are written once and referred to by number. A torn last line (a kill mid-write)
is ignored: its spawn was never acknowledged.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import msgspec

from .factories import AgentRecipe

__all__ = ["Journal"]


class _Line(msgspec.Struct, frozen=True, omit_defaults=True):
    recipe: int | None = None  # a recipe's number, with `spec` (a definition) or `agent`
    spec: AgentRecipe | None = None
    agent: str | None = None
    disposed: str | None = None
    closed: bool = False  # the shard closed cleanly here (see Journal.clean)


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(_Line).decode


class Journal:
    """The journal file at ``path``, read at open. Not thread-safe: the shard holds its
    own lock around it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._recipes: dict[AgentRecipe, int] = {}
        self._by_number: dict[int, AgentRecipe] = {}
        self.agents: dict[str, AgentRecipe] = {}  # live agents, in spawn order
        # Whether the last record is a clean close: the shard's runtime closed (running
        # turns aborted, inboxes kept, all flushed) rather than its process dying.
        self.clean = False
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):  # a torn tail: cut it, or the next
                data = data[: data.rfind(b"\n") + 1]  # append would join it
                os.truncate(path, len(data))
            self._load(data)
        self._file = open(path, "ab")  # noqa: SIM115 - held open for the shard's lifetime

    def _load(self, data: bytes) -> None:
        for raw in data.splitlines():
            try:
                line = _decode(raw)
            except msgspec.DecodeError:
                continue  # a torn tail (see module doc)
            self.clean = line.closed
            if line.spec is not None and line.recipe is not None:
                self._recipes[line.spec] = line.recipe
                self._by_number[line.recipe] = line.spec
            elif line.agent is not None and line.recipe in self._by_number:
                self.agents[line.agent] = self._by_number[line.recipe]
            elif line.disposed is not None:
                self.agents.pop(line.disposed, None)

    def spawned(self, entries: Iterable[tuple[str, AgentRecipe]]) -> None:
        """Record agents about to be spawned, durably (fsync) before returning."""
        lines: list[bytes] = []
        for agent_id, spec in entries:
            number = self._recipes.get(spec)
            if number is None:
                number = self._recipes[spec] = len(self._recipes)
                self._by_number[number] = spec
                lines.append(_encode(_Line(recipe=number, spec=spec)))
            lines.append(_encode(_Line(recipe=number, agent=agent_id)))
            self.agents[agent_id] = spec
        self._write(lines)

    def disposed(self, agent_ids: Iterable[str]) -> None:
        lines = []
        for agent_id in agent_ids:
            if self.agents.pop(agent_id, None) is not None:
                lines.append(_encode(_Line(disposed=agent_id)))
        self._write(lines)

    def _write(self, lines: list[bytes]) -> None:
        if lines:
            self._file.write(b"\n".join(lines) + b"\n")
            self._file.flush()
            os.fsync(self._file.fileno())

    def opened(self) -> None:
        """Record that a shard started on this journal: until its clean close, a later
        start reads a crash."""
        self._write([_encode(_Line())])

    def close(self, clean: bool = False) -> None:
        """Close the file; ``clean``: record a clean close first."""
        if clean:
            self._write([_encode(_Line(closed=True))])
        self._file.close()
