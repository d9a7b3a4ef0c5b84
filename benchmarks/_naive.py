"""The baseline of ``bench_turns``: the obvious design of an agent host.

One ``pykka.ThreadingActor`` (one OS thread) per agent; the model call blocks that
thread; every session fact is appended in its own LMDB write transaction, committed
with sync before the next. It writes the same facts per turn as corral (insert splice,
turn/start, claim splice, step/start, user/message, request/header on the first turn,
the chunks, assistant/message, tool call and result when asked, step/end, turn/end), encoded
with the same msgspec codec, so the comparison is about the execution design only.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import pykka

from actors.model import ModelRequest
from runtime import ScriptedModel
from storage.events import (
    AgentInboxSpliced,
    AssistantChunk,
    AssistantMessage,
    AssistantMessageData,
    Completed,
    Event,
    MessageTrigger,
    RequestConfig,
    RequestHeader,
    StepEnd,
    StepStart,
    TextBlock,
    ToolCallData,
    ToolMessage,
    ToolResultData,
    TurnEnd,
    TurnStart,
    UserMessage,
    UserMessageData,
)

__all__ = ["NaiveHost"]

_TYPES = {
    AgentInboxSpliced: "agent/inbox/spliced",
    TurnStart: "turn/start",
    StepStart: "step/start",
    UserMessageData: "user/message",
    RequestHeader: "request/header",
    AssistantChunk: "assistant/chunk",
    AssistantMessageData: "assistant/message",
    ToolCallData: "tool/call",
    ToolResultData: "tool/result",
    StepEnd: "step/end",
    TurnEnd: "turn/end",
}


class _Log:
    """One LMDB environment; every append is its own durable write transaction."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.env = lmdb.open(str(path), map_size=4 << 30, max_dbs=2, sync=True)
        self.db = self.env.open_db(b"events")
        self.encoder = msgspec.json.Encoder()
        self.events = 0
        self._count = threading.Lock()

    def append(self, key: int, seq: int, data: msgspec.Struct) -> None:
        event = Event(type=_TYPES[type(data)], seq=seq, time=int(time.time() * 1000), data=data)
        with self.env.begin(write=True, db=self.db) as txn:
            txn.put(struct.pack(">QQ", key, seq), self.encoder.encode(event))
        with self._count:
            self.events += 1


class _NaiveAgent(pykka.ThreadingActor):
    use_daemon_thread = True

    def __init__(
        self, key: int, log: _Log, model: ScriptedModel, tool: bool, done: Callable[[int], None]
    ) -> None:
        super().__init__()
        self.key, self.log, self.model, self.tool, self.done = key, log, model, tool, done
        self.seq = 0
        self.turn = 0
        self.history: list[Any] = []

    def _append(self, data: msgspec.Struct) -> None:
        self.log.append(self.key, self.seq, data)
        self.seq += 1

    def on_receive(self, message: Any) -> Any:
        text: str = message
        self.turn += 1
        turn = self.turn
        user = UserMessage(id=f"{self.key}-{turn}", content=(TextBlock(text=text),))
        self._append(AgentInboxSpliced(target="next-turn", start=0, inserted=(user,)))
        self._append(TurnStart(turn=turn, trigger=MessageTrigger()))
        self._append(AgentInboxSpliced(target="next-turn", start=0, removed_count=1))
        self._append(StepStart(turn=turn, step=1))
        self._append(UserMessageData(message=user, turn=turn, step=1))
        self.history.append(user)
        if turn == 1:
            self._append(
                RequestHeader(
                    turn=turn, step=1, config=RequestConfig(provider="scripted", model="scripted")
                )
            )
        step = 1
        while True:
            request = ModelRequest(
                config=RequestConfig(provider="scripted", model="scripted"),
                messages=list(self.history),
            )
            chunks = self.model.answer_now(request)
            assert chunks is not None
            for chunk in chunks:
                self._append(AssistantChunk(turn=turn, step=step, chunk=chunk))
            reply = AssistantMessage(content=(TextBlock(text=text),))
            self._append(AssistantMessageData(turn=turn, step=step, message=reply))
            self.history.append(reply)
            if self.tool and step == 1:
                self._append(
                    ToolCallData(turn=turn, step=step, call_id="c", name="noop", arguments="{}")
                )
                result = ToolMessage(call_id="c", name="noop", content=(TextBlock(text="ok"),))
                self._append(ToolResultData(turn=turn, step=step, message=result))
                self.history.append(result)
                self._append(StepEnd(turn=turn, step=step))
                step += 1
                self._append(StepStart(turn=turn, step=step))
                continue
            break
        self._append(StepEnd(turn=turn, step=step))
        self._append(TurnEnd(turn=turn, reason=Completed()))
        self.done(self.key)
        return None


class NaiveHost:
    """Hosts ``agents`` naive agents; ``run(turns)`` drives them like the corral driver."""

    def __init__(self, path: Path, agents: int, *, tool: bool) -> None:
        self.log = _Log(path)
        self.model = ScriptedModel.echo()
        self._on_done: Callable[[int], None] = lambda key: None
        self.refs = [
            _NaiveAgent.start(key, self.log, self.model, tool, self._done) for key in range(agents)
        ]

    def _done(self, key: int) -> None:
        self._on_done(key)

    def send(self, key: int, text: str) -> None:
        self.refs[key].tell(text)

    def set_on_done(self, fn: Callable[[int], None]) -> None:
        self._on_done = fn

    @property
    def events(self) -> int:
        return self.log.events

    def close(self) -> None:
        for ref in self.refs:
            ref.stop(block=False)
        self.log.env.close()
