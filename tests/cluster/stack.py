"""Factories the cluster tests name as ``tests.cluster.stack:...`` (importable in every
Ray worker: the workers inherit the test process's PYTHONPATH)."""

from __future__ import annotations

from runtime import Runtime, ScriptedModel, tool


def echo_model() -> ScriptedModel:
    return ScriptedModel.echo()


def slow_echo_model() -> ScriptedModel:
    """An echo that takes 20 ms a reply."""
    return ScriptedModel.echo(latency=0.02)


def slower_echo_model() -> ScriptedModel:
    """An echo that takes 100 ms a reply: queued turns are still owed when a shard is
    killed."""
    return ScriptedModel.echo(latency=0.1)


@tool
def shout(text: str) -> str:
    """Upper-case ``text``."""
    return text.upper()


def shout_tool():  # type: ignore[no-untyped-def]
    return shout


def block_forbidden(rt: Runtime) -> None:
    """A shard setup: an agent/pre-step waterfall, run inside the shard, that rejects a
    step whose messages say 'forbidden'."""
    from runtime import Reject

    def pre_step(event, next):  # type: ignore[no-untyped-def]
        texts = [block.text for m in event.messages for block in m.content]
        if any("forbidden" in text for text in texts):
            return Reject(reason="forbidden")
        return next()

    rt.on("agent/pre-step", pre_step)
