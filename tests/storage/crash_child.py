"""The child process of ``test_crash``: appends to several sessions until it is killed.

Usage: ``python crash_child.py STORE_PATH SESSIONS DURABILITY [JOURNAL_MAX_RECORDS
[DIRECT_MIN_BYTES]]`` (a small journal threshold makes the writer compact often, in
rounds of several steps, so kills land during compactions and between the steps of a
round too; a small direct threshold makes it write runs of
sessions with nothing in the journal straight to ``events``).

It opens (or creates) sessions ``s0..s{N-1}``, prints ``loaded <id> <last seq>`` for
each, repairs any turn a previous kill left open, then loops forever: every session
gets the first half of a turn (one append per fact), then a flush, then the second half
(one ``Session.extend``: durable whole or not at all), then a flush. After
each flush returns it prints ``ack <id> <last seq>`` for every session (stdout is
line-buffered), so the parent knows exactly which seqs a flush acknowledged.

Every ``assistant/chunk`` carries the text ``<id>@<its own seq>``, so the parent can
tell a record that moved from one that is where it was written.
"""

from __future__ import annotations

import sys
from typing import Literal, cast

from storage import Session, Store
from storage.events import (
    AssistantChunk,
    AssistantMessage,
    AssistantMessageData,
    Completed,
    MessageTrigger,
    StepEnd,
    StepStart,
    TextBlock,
    TextDelta,
    TurnEnd,
    TurnStart,
    UserMessage,
    UserMessageData,
)
from storage.lmdb import compaction as compaction_module
from storage.lmdb import writer as writer_module


def chunk_at(session: Session, turn: int, seq: int) -> AssistantChunk:
    return AssistantChunk(turn=turn, step=1, chunk=TextDelta(text=f"{session.id}@{seq}"))


def chunk(session: Session, turn: int) -> int:
    seq = session.last_seq + 1
    return session.append("assistant/chunk", chunk_at(session, turn, seq)).seq


def first_half(session: Session) -> None:
    turn = session.state.last_turn + 1
    session.append("turn/start", TurnStart(turn=turn, trigger=MessageTrigger()))
    session.append("step/start", StepStart(turn=turn, step=1))
    message = UserMessage(id=f"m-{session.last_seq}", content=[TextBlock(text="go on")])
    session.append("user/message", UserMessageData(message=message, turn=turn, step=1))
    chunk(session, turn)


def second_half(session: Session) -> None:
    turn = session.state.last_turn
    cited = [session.last_seq + 1, session.last_seq + 2]
    reply = AssistantMessage(content=[TextBlock(text="done")])
    data = AssistantMessageData(turn=turn, step=1, message=reply, source_event_seqs=cited)
    session.extend(
        [
            *(("assistant/chunk", chunk_at(session, turn, seq)) for seq in cited),
            ("assistant/message", data),
            ("step/end", StepEnd(turn=turn, step=1)),
            ("turn/end", TurnEnd(turn=turn, reason=Completed())),
        ]
    )


def acknowledge(store: Store, sessions: list[Session]) -> None:
    store.flush()
    for session in sessions:
        print(f"ack {session.id} {session.last_seq}")


def main() -> None:
    path, count = sys.argv[1], int(sys.argv[2])
    durability = cast(Literal["write-ahead", "turn", "none"], sys.argv[3])
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if len(sys.argv) > 4:
        threshold = int(sys.argv[4])
        writer_module.JOURNAL_MAX_RECORDS = threshold  # type: ignore[misc]
        # Rounds of a step per session, so that kills land in the middle of rounds too.
        compaction_module.COMPACT_STEP_RECORDS = 1  # type: ignore[misc]
        compaction_module.COMPACT_STEP_FACTOR = 0  # type: ignore[misc]
    if len(sys.argv) > 5:
        compaction_module.DIRECT_MIN_BYTES = int(sys.argv[5])  # type: ignore[misc]
    store = Store.open(path, durability=durability)
    sessions: list[Session] = []
    for index in range(count):
        name = f"s{index}"
        known = store.has_session(name)
        session = store.open_session(name) if known else store.create_session(name)
        print(f"loaded {name} {session.last_seq}")
        session.repair()
        sessions.append(session)
    acknowledge(store, sessions)
    while True:
        for session in sessions:
            first_half(session)
        acknowledge(store, sessions)
        for session in sessions:
            second_half(session)
        acknowledge(store, sessions)


if __name__ == "__main__":
    main()
