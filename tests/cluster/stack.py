"""Factories the cluster tests name as ``tests.cluster.stack:...`` (importable in every
Ray worker: the workers inherit the test process's PYTHONPATH)."""

from __future__ import annotations

from runtime import Runtime, ScriptedModel, tool


def echo_model() -> ScriptedModel:
    return ScriptedModel.echo()


def slow_echo_model() -> ScriptedModel:
    """An echo that takes 20 ms a reply: turns are in flight when a shard is killed."""
    return ScriptedModel.echo(latency=0.02)


@tool
def shout(text: str) -> str:
    """Upper-case ``text``."""
    return text.upper()


def shout_tool():  # type: ignore[no-untyped-def]
    return shout


def count_requests(rt: Runtime) -> None:
    """A shard setup: an agent/request waterfall that runs inside the shard."""

    def request(event, next):  # type: ignore[no-untyped-def]
        return next()

    rt.on("agent/request", request)
