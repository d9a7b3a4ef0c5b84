"""``corral bench``'s own option types (a distribution, a rate, a sweep) and the checks
made before a run: options of one model or loop refused with another (instead of being
silently ignored), and a real model's many paid requests confirmed."""

from __future__ import annotations

import sys
from typing import Any, Final

import click

from runtime.load import Dist, Traffic

from .errors import CliError

__all__ = ["DistType", "RateType", "SweepType", "check_options", "confirm_cost", "given"]

_SIMULATED: Final = ("ttft", "tokens_per_s", "reply_tokens", "tool_probability")
_CONFIRM_OVER: Final = 100  # paid requests a real model's run sends without --yes


class DistType(click.ParamType[Dist, str]):
    """``MEAN`` or ``MEAN~SPREAD``: a :class:`runtime.load.Dist`."""

    name = "MEAN[~SPREAD]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Dist):
            return value
        try:
            return Dist.parse(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


class RateType(click.ParamType[float, str]):
    """``200``, ``200/s``, ``12000/min``: arrivals per second."""

    name = "N[/s|/min|/h]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            return value
        try:
            return Traffic.parse_rate(str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


class SweepType(click.ParamType[tuple[str, tuple[float, ...]], str]):
    """``agents=100,1000,10000`` or ``rate=50,100,200``."""

    name = "agents=N,N,...|rate=R,R,..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        what, _, listed = str(value).partition("=")
        if what not in ("agents", "rate") or not listed:
            self.fail(f"expected agents=N,N,... or rate=R,R,..., got {value!r}", param, ctx)
        values: list[float] = []
        for item in listed.split(","):
            try:
                number = Traffic.parse_rate(item) if what == "rate" else float(int(item))
            except ValueError:
                self.fail(f"{item!r} is not a valid {what} value in {value!r}", param, ctx)
            if number <= 0:
                self.fail(f"{what} values must be > 0, got {item!r}", param, ctx)
            values.append(number)
        if len(values) < 2:
            self.fail("a sweep needs at least two values", param, ctx)
        return (what, tuple(values))


def given(ctx: click.Context, *names: str) -> list[str]:
    """The options among ``names`` given on the command line (or by $ENV), as flags."""
    out = []
    for name in names:
        source = ctx.get_parameter_source(name)
        if source not in (None, click.core.ParameterSource.DEFAULT):
            out.append("--" + name.replace("_", "-"))
    return out


def refuse(ctx: click.Context, given: list[str], why: str) -> None:
    if given:
        raise click.UsageError(f"{', '.join(given)} {why}", ctx)


def check_options(ctx: click.Context, p: dict[str, Any]) -> None:
    """Options that only one model, or only one kind of loop, uses are refused with
    another (instead of silently ignored)."""
    scripted = given(ctx, "latency", "latency_jitter", "chunks", "tool_calls", "failure_rate")
    simulated = given(ctx, *_SIMULATED)
    if p["model_spec"]:
        refuse(ctx, scripted + simulated, "shape the scripted or simulated model: not --model")
    elif simulated:
        refuse(ctx, scripted, "shape the scripted model: not the simulated one (--ttft & co.)")
    sweep = p["sweep"]
    open_loop = p["rate"] is not None or (sweep is not None and sweep[0] == "rate")
    if open_loop:
        refuse(ctx, given(ctx, "turns"), "is a closed loop's: an open loop runs for --duration")
    else:
        refuse(ctx, given(ctx, "arrivals", "duration", "queue_limit"), "need --rate")
    if sweep is not None:
        refuse(ctx, given(ctx, sweep[0]), f"is what --sweep {sweep[0]}=... varies")
    if p["shards"] is not None:
        pools = list(sweep[1]) if sweep is not None and sweep[0] == "agents" else [p["agents"]]
        if min(pools) < p["shards"]:
            raise click.UsageError(
                f"--shards {p['shards']} for {min(pools):g} agents: each shard hosts one at least",
                ctx,
            )
    if p["prompt_order"] != "cycle" and p["prompts"] is None:
        raise click.UsageError("--prompt-order needs --prompts", ctx)


def _paid_requests(p: dict[str, Any]) -> int:
    """About how many model requests the run sends (one per turn, at least)."""
    sweep = p["sweep"]
    agents = [p["agents"]] if sweep is None or sweep[0] != "agents" else list(sweep[1])
    if p["rate"] is not None or (sweep is not None and sweep[0] == "rate"):
        rates = list(sweep[1]) if sweep is not None and sweep[0] == "rate" else [p["rate"]]
        return int(sum(r * p["duration"] for r in rates))
    return int(sum(a * p["turns"] for a in agents))


def confirm_cost(p: dict[str, Any]) -> None:
    requests = _paid_requests(p)
    if requests <= _CONFIRM_OVER or p["yes"]:
        return
    what = f"about {requests:,} requests to {p['model_spec']}, each paid"
    if not sys.stdin.isatty():
        raise CliError(f"this run sends {what}: pass --yes to confirm (or fewer --agents/--turns)")
    click.confirm(f"This run sends {what}. Go on?", abort=True, err=True)
