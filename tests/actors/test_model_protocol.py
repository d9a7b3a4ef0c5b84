"""``implements``: protocol checks remembered per class when the class has every member."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from actors.model import ImmediateModel, Model
from actors.protocols import _CONFORMING, implements
from actors.streams import is_immediate
from runtime import ScriptedModel


class Own:
    """A model whose members are its class's."""

    @property
    def provider(self) -> str:
        return "test"

    @property
    def name(self) -> str:
        return "own"

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        yield None


class PerInstance:
    """A model whose members are set on each instance (or not)."""

    def __init__(self, complete: bool) -> None:
        if complete:
            self.provider = "test"
            self.name = "per-instance"
            self.stream = Own().stream


def test_a_class_that_has_every_member_is_remembered_and_its_instances_pass() -> None:
    assert implements(Own(), Model)
    assert _CONFORMING[(Own, Model)]
    assert implements(Own(), Model)
    assert not implements(Own(), ImmediateModel)  # no answer_now: another protocol
    assert (Own, ImmediateModel) not in _CONFORMING


def test_members_set_per_instance_are_checked_on_every_instance() -> None:
    assert implements(PerInstance(complete=True), Model)
    assert (PerInstance, Model) not in _CONFORMING
    assert not implements(PerInstance(complete=False), Model)


def test_an_object_without_the_members_does_not_implement_the_protocol() -> None:
    assert not implements(object(), Model)
    assert not implements("openai:gpt", Model)


def test_a_scripted_model_may_answer_inline_and_a_streaming_only_model_may_not() -> None:
    assert is_immediate(ScriptedModel.echo())
    assert is_immediate(ScriptedModel.echo(latency=0.5))  # answer_now says "not now" itself
    assert not is_immediate(Own())
