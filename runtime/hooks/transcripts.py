"""``transcript_path``: each session's log exported as JSON lines for its hooks to read.

Claude Code and Codex hand a hook the path of the session's transcript. corral's is an
export of the session log, one event record per line (``{"type","seq","time","data"}``,
what ``corral log show --raw`` prints): corral's record format, not Claude Code's. The
file is brought up to date (the events appended since its last refresh) before each
hook run, in a worker thread of the I/O side, so it is never read half written by a
hook of that session.
"""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec

from storage import Session

__all__ = ["Transcripts"]

_encode = msgspec.json.Encoder().encode


class Transcripts:
    """Per-session transcript files under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._written: dict[str, int] = {}  # session id -> next seq to write

    def path(self, session_id: str) -> Path:
        return self.directory / f"{session_id}.jsonl"

    def refresh(self, session: Session) -> str:
        """Append the events not written yet; return the file's path."""
        path = self.path(session.id)
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            start = self._written.get(session.id)
            if start is None:  # first refresh in this process: the whole log, anew
                start = 0
                path.write_bytes(b"")
            events = session.events(start)
            if events:
                with path.open("ab") as out:
                    out.writelines(_encode(event) + b"\n" for event in events)
                self._written[session.id] = events[-1].seq + 1
            else:
                self._written[session.id] = start
        return str(path)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._written.pop(session_id, None)
