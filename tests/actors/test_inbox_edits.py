"""Unit tests of inbox edits that insert an id they also remove (``replace(id, message
with that id)``, a splice that reorders): the id is not reserved a second time, and an
edit that fails never frees an id another send holds."""

from __future__ import annotations

from typing import Any

import pytest

from actors.agent import Edit, apply_edit
from actors.errors import DuplicateMessageError, UnknownMessageError
from actors.inbox import Inbox
from storage.events import TextBlock, UserMessage


class _Agent:
    id = "agent"


def _message(message_id: str, text: str = "x") -> UserMessage:
    return UserMessage(id=message_id, content=[TextBlock(text=text)])


def _inbox(*pending: str) -> tuple[Inbox, list[Any]]:
    facts: list[Any] = []
    inbox = Inbox(append_fact=facts.append, emit=lambda name, payload: None, agent=_Agent())
    for message_id in pending:
        inbox.reserve(message_id)
        inbox.insert("next-step", _message(message_id))
    return inbox, facts


def test_a_same_id_replace_whose_message_was_claimed_meanwhile_keeps_a_newer_send_of_it() -> None:
    inbox, _ = _inbox("m1")
    reused = inbox.reserve_all(["m1"], lambda: ["m1"])  # replace("m1", <m1>) is sent
    assert reused == {"m1"}
    assert inbox.claim(1, new_turn=False)[0].id == "m1"  # a turn claims m1 first
    inbox.reserve("m1")  # then a send of m1 is accepted: m1 left the inbox
    edit = Edit(op="replace", message_id="m1", message=_message("m1", "new"), reused=reused)
    with pytest.raises(UnknownMessageError, match="no pending message 'm1'"):
        apply_edit(inbox, edit)
    with pytest.raises(DuplicateMessageError, match="message id 'm1' is already pending"):
        # the newer send still holds m1
        inbox.reserve("m1")


def test_a_splice_reinserting_an_id_it_does_not_remove_refuses_it_if_pending_or_takes_it() -> None:
    inbox, facts = _inbox("a", "b")
    reused = inbox.reserve_all(["b", "a"], lambda: ["a", "b"])  # splice(0, 2, [b, a])
    assert reused == {"a", "b"}
    inbox.claim(1, new_turn=False)  # a turn claims both first
    inbox.reserve("a")  # a newer send of a (b stays free)
    splice = Edit(
        op="splice",
        lane="next-step",
        start=0,
        removed_count=2,
        messages=(_message("b"), _message("a")),
        reused=reused,
    )
    written = len(facts)
    with pytest.raises(DuplicateMessageError, match="'a' is already pending .* outside the"):
        apply_edit(inbox, splice)
    assert len(facts) == written  # nothing was logged
    with pytest.raises(DuplicateMessageError, match="message id 'a' is already pending"):
        inbox.reserve("a")  # still the newer send's
    inbox.reserve("b")  # b was not kept by the refused splice
    inbox.release("b")
    only_b = Edit(op="splice", lane="next-step", messages=(_message("b"),), reused=frozenset("b"))
    apply_edit(inbox, only_b)  # b is free: the splice takes it
    assert inbox.view().ids() == ["b"]
    with pytest.raises(DuplicateMessageError, match="message id 'b' is already pending"):
        inbox.reserve("b")
