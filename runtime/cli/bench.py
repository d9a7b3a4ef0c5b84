"""``corral bench``: load-test an agent stack on the embedded store and report.

The load itself is :mod:`runtime.load` (:func:`~runtime.load.run_bench`,
:func:`~runtime.load.run_sweep`); this module adds the flags and their checks (options
of one model refused with another, a real model's cost confirmed), the ``--fresh``
wipe (:mod:`.wipe`), and the exit status; :mod:`.benchview` shows the progress and the
tables, :mod:`.benchplot` draws ``--plot``. docs/load.md is the user's guide. A little
over 500 lines, one piece: one command whose flags and the checks between them are read
best side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, cast

import click
import msgspec
from rich.console import Console
from rich.text import Text

from actors import Model
from runtime.load import (
    AgentStackError,
    LoadReport,
    LoadSpec,
    Prompts,
    PromptsError,
    SimulatedModel,
    SweepReport,
    Traffic,
    load_factory,
    lookup_stack,
    read_prompts,
    run_bench,
    run_sweep,
)
from storage import Durability

from .benchoptions import DistType, RateType, SweepType, check_options, confirm_cost, given
from .benchplot import PlotPath, check_plot_support, write_plot, write_sweep_plot
from .benchview import Display, breakdown_table, failures_table, render_table, sweep_table
from .errors import EXIT_INTERRUPTED, CliError, InvariantsError
from .options import (
    FiniteFloatRange,
    NewFilePath,
    durability_option,
    hooks_option,
    refuse_store_file,
    store_option,
    threads_option,
)
from .transcript import plural, shown
from .wipe import wipe_sharded_store, wipe_store

__all__ = ["EXIT_TURNS_FAILED", "bench"]

EXIT_TURNS_FAILED: Final = 4


def _resolve(model: str) -> Model:
    from runtime.providers.resolve import resolve_model  # noqa: PLC0415 - optional vendor SDKs

    return resolve_model(model)


class TurnsFailedError(CliError):
    """More turns ended in error than ``--max-error-rate`` allows (exit code 4)."""

    exit_code = EXIT_TURNS_FAILED


class InterruptedRunError(CliError):
    """Ctrl-C ended the run; its report was printed (exit code 130)."""

    exit_code = EXIT_INTERRUPTED


def _simulated(p: dict[str, Any]) -> SimulatedModel:
    defaults = SimulatedModel()
    return SimulatedModel(
        ttft_s=p["ttft"] or defaults.ttft_s,
        tokens_per_s=p["tokens_per_s"] or defaults.tokens_per_s,
        reply_tokens=p["reply_tokens"] or defaults.reply_tokens,
        tool_probability=p["tool_probability"],
        seed=p["seed"],
    )


@click.command()
@click.option(
    "--agents", type=click.IntRange(min=1), default=1000, show_default=True, help="Agents to host."
)
@click.option(
    "--turns",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Turns per agent, closed loop (follow-ups sent one after the other).",
)
@store_option
@hooks_option
@click.option("--fresh", is_flag=True, help="Wipe the store first (only a corral store).")
@durability_option
@threads_option
@click.option(
    "--agent",
    "agent_target",
    metavar="MODULE:FACTORY",
    default=None,
    help="Your stack: a function (rt) -> runtime.load.AgentStack (model, tools, system, "
    "limits); it may register listeners on rt.",
)
@click.option(
    "--prompts",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help='Prompts, one per line (.jsonl: JSON strings or {"prompt": ...}).',
)
@click.option(
    "--prompt-order",
    type=click.Choice(["cycle", "sample"]),
    default="cycle",
    show_default=True,
    help="Take --prompts in order or at random (seeded).",
)
@click.option(
    "--rate",
    type=RateType(),
    metavar="RATE",
    default=None,
    help="Open loop: arrivals per second (200, 200/s, 12000/min) over the agent pool.",
)
@click.option(
    "--arrivals",
    type=click.Choice(["poisson", "constant"]),
    default="poisson",
    show_default=True,
    help="Open loop: how arrivals are spaced.",
)
@click.option(
    "--duration",
    type=FiniteFloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Open loop: seconds of arrivals.",
)
@click.option(
    "--queue-limit",
    type=click.IntRange(min=0),
    default=None,
    help="Open loop: arrivals waiting for a free agent before more are shed (default: "
    "10 per agent).",
)
@click.option(
    "--sweep",
    type=SweepType(),
    metavar="agents=N,..|rate=R,..",
    default=None,
    help="Run one point per value (agents=100,1000 or rate=50,100,200) and report "
    "throughput and p50/p99 against it.",
)
@click.option(
    "--ttft",
    type=DistType(),
    default=None,
    help="Simulated model: seconds to the first token (e.g. 0.3~0.1).",
)
@click.option(
    "--tokens-per-s", type=DistType(), default=None, help="Simulated model: streaming speed."
)
@click.option(
    "--reply-tokens", type=DistType(), default=None, help="Simulated model: reply length."
)
@click.option(
    "--tool-probability",
    type=FiniteFloatRange(min=0, max=1),
    default=0.0,
    show_default=True,
    help="Simulated model: chance that a turn calls one of the stack's tools.",
)
@click.option(
    "--latency",
    type=FiniteFloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Scripted model: latency per request, seconds.",
)
@click.option(
    "--latency-jitter",
    type=FiniteFloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Scripted model: uniform spread around --latency, seconds.",
)
@click.option(
    "--chunks",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Scripted model: streamed chunks per reply.",
)
@click.option(
    "--tool-calls",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Scripted model: calls of a cheap concurrency-safe tool per turn.",
)
@click.option(
    "--failure-rate",
    type=FiniteFloatRange(min=0, max=1, max_open=True),
    default=0.0,
    show_default=True,
    help="Scripted model: fraction of model requests failing with SERVER (retried).",
)
@click.option(
    "--model",
    "model_spec",
    metavar="STRING",
    default=None,
    help="A real model string (e.g. openai:gpt-4.1-mini); replaces the stack's model.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of all randomness.")
@click.option(
    "--max-error-rate",
    type=FiniteFloatRange(min=0, max=1),
    default=0.0,
    show_default=True,
    help="Fail (exit 4) if more than this fraction of turns ended in error after retries.",
)
@click.option("-y", "--yes", is_flag=True, help="Do not ask before sending many paid requests.")
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Give up after this many seconds (spawning included; per sweep point).",
)
@click.option("--json", "json_path", type=NewFilePath(), help="Write the report as JSON.")
@click.option(
    "--plot",
    "plot_path",
    type=PlotPath(),
    help="Write a PNG, or the image format of its suffix (needs corral[plot]).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress display.")
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    default=None,
    help="Run the load in N shard processes on Ray (corral[ray]; docs/cluster.md).",
)
@click.option(
    "--address",
    metavar="ADDR",
    default=None,
    help="With --shards: a running Ray cluster's address (default: a local Ray).",
)
@click.pass_context
def bench(ctx: click.Context, /, **p: Any) -> None:
    """Load-test an agent stack: host agents, send them turns (closed loop) or arrivals
    at a rate (open loop), report throughput, latency, failures and where the time went."""
    try:
        _bench(ctx, p)
    except (AgentStackError, PromptsError) as err:  # the user's factory or prompts file
        raise CliError(str(err)) from err


def _bench(ctx: click.Context, p: dict[str, Any]) -> None:
    store: Path = p["store"]
    check_options(ctx, p)
    shards = p["shards"]
    if p["address"] is not None and shards is None:
        raise click.UsageError("--address goes with --shards", ctx)
    if p["hooks"] is not None and shards is not None:  # the shards open runtimes of their own
        raise click.UsageError("--hooks does not go with --shards", ctx)
    if p["json_path"] is not None:  # before the run, which may make the store there
        refuse_store_file(p["json_path"], store, "json_path")
    if p["plot_path"] is not None:
        refuse_store_file(p["plot_path"], store, "plot_path")
        check_plot_support()
    factory, factory_name = (None, "scripted")
    if p["agent_target"]:
        factory, factory_name = load_factory(p["agent_target"])
    model: Model | None = None
    target = p["agent_target"]
    if p["model_spec"] and shards is not None:  # each shard resolves the string
        if not p["model_spec"].startswith("scripted:"):
            confirm_cost(p)
    elif p["model_spec"]:
        model = _resolve(p["model_spec"])  # a bad string is refused before any question
        if model.provider != "scripted":
            confirm_cost(p)
    elif given(ctx, "ttft", "tokens_per_s", "reply_tokens", "tool_probability"):
        model = _simulated(p)
        if factory is None:
            factory_name = "simulated"
            if p["tool_probability"]:
                target = "runtime.load.stack:lookup_stack"
                factory = lookup_stack
    texts = read_prompts(p["prompts"]) if p["prompts"] is not None else None
    prompts = None
    if texts is not None:
        prompts = Prompts(texts, order=p["prompt_order"], seed=p["seed"])
    spec = LoadSpec(
        agents=p["agents"],
        turns=p["turns"],
        latency_s=p["latency"],
        jitter_s=p["latency_jitter"],
        chunks=p["chunks"],
        tool_calls=p["tool_calls"],
        failure_rate=p["failure_rate"],
        seed=p["seed"],
        timeout_s=p["timeout"],
    )
    traffic = None
    sweep = p["sweep"]
    if p["rate"] is not None or (sweep is not None and sweep[0] == "rate"):
        traffic = Traffic(
            rate=p["rate"] or sweep[1][0],
            duration_s=p["duration"],
            shape=p["arrivals"],
            queue_limit=p["queue_limit"],
        )
    if p["fresh"] and shards is None:
        wipe_store(store)
    elif p["fresh"]:
        wipe_sharded_store(store)
    out, err = _plain_console(), _plain_console(stderr=True)
    durability = cast(Durability, p["durability"])
    loop = _loop_text(spec, traffic, sweep)
    title = f"corral bench: {loop} ({durability})"
    bench_args: dict[str, Any] = {
        "durability": durability,
        "threads": p["threads"],
        "model": model,
        "factory": factory,
        "factory_name": factory_name,
        "prompts": prompts,
    }
    if p["hooks"] is not None:
        bench_args["hooks"] = p["hooks"]
    runner = run_bench
    if shards is not None:  # the stack, model and prompts go to the shards as data
        runner = _sharded(
            shards,
            p["address"],
            model=p["model_spec"],
            simulated=model.settings if isinstance(model, SimulatedModel) else None,
            factory=target,
            factory_name=factory_name,
            prompts=texts or (),
            prompt_order=p["prompt_order"],
        )
        bench_args = {"durability": durability, "threads": p["threads"]}
    with Display(err, quiet=p["quiet"], title=title) as display:
        bench_args |= {
            "on_progress": display.update,
            "on_phase": display.phase,
            "interval_s": 0.25 if display.live else 0.5,
        }
        if sweep is not None:
            result: LoadReport | SweepReport = run_sweep(
                store,
                sweep[0],
                sweep[1],
                spec,
                traffic=traffic,
                on_point=lambda v: display.phase(f"sweep point {sweep[0]}={v:g}"),
                runner=runner,
                **bench_args,
            )
        else:
            result, samples = runner(store, spec, traffic=traffic, **bench_args)
    if isinstance(result, SweepReport):
        _print_sweep(out, result)
        reports = [point.report for point in result.points]
    else:
        _print_run(out, result)
        reports = [result]
    if p["json_path"] is not None:
        p["json_path"].write_bytes(msgspec.json.format(msgspec.json.encode(result)) + b"\n")
    if p["plot_path"] is not None:
        if isinstance(result, SweepReport):
            write_sweep_plot(p["plot_path"], result, title)
        else:
            write_plot(p["plot_path"], result, samples, title)
    _finish(out, reports, p["max_error_rate"])


def _loop_text(
    spec: LoadSpec, traffic: Traffic | None, sweep: tuple[str, tuple[float, ...]] | None
) -> str:
    if sweep is not None and sweep[0] == "agents":
        return f"agents {_values(sweep[1])} x {plural(spec.turns, 'turn')}"
    if traffic is None:
        return _load(spec.agents, spec.turns)
    rate = f"{_values(sweep[1])}/s" if sweep is not None else f"{traffic.rate:,g}/s"
    return (
        f"{plural(spec.agents, 'agent')}, {traffic.shape} arrivals at {rate} "
        f"for {traffic.duration_s:g} s"
    )


def _values(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:g}" for v in values)


def _print_run(out: Console, report: LoadReport) -> None:
    # two lines, each within 80 columns (rich wraps a pipe's output there) but a long model
    if report.mode == "open" and report.open_loop is not None:
        loop = report.open_loop
        head = f"{plural(report.agents, 'agent')}, {loop.rate:,g}/s for {loop.duration_s:g} s"
    else:
        head = _load(report.agents, report.turns)
    out.print(Text(f"corral bench: {head}, {report.durability}", "bold"))
    stack = "" if report.stack == "scripted" else f", stack {report.stack}"
    out.print(
        Text(f"{_threads(report.threads, report.standby)}, model {report.model}{stack}", "bold"),
        soft_wrap=True,
    )
    out.print(render_table(report))
    if report.failures:
        out.print(failures_table(report.failures))
    if report.breakdown is not None and report.breakdown.turns:
        out.print(breakdown_table(report.breakdown))
    if report.earlier_sessions:
        out.print(
            f"the store held {plural(report.earlier_sessions, 'earlier session')}: "
            "this report counts and checks this run's sessions only"
        )


def _print_sweep(out: Console, sweep: SweepReport) -> None:
    out.print(sweep_table(sweep))
    if sweep.knee is not None:
        out.print(f"knee: {sweep.swept} {sweep.knee:,g} (the last point that still scaled)")
    else:
        out.print("knee: none (every step scaled)")
    for point in sweep.points:
        if point.report.failures:
            out.print(Text(f"{sweep.swept} {point.value:,g}:", "bold"))
            out.print(failures_table(point.report.failures))


def _finish(out: Console, reports: list[LoadReport], max_error_rate: float) -> None:
    """The invariants' verdict over every run (a sweep's points), then the exit status:
    the first run's that failed, or success."""
    if all(r.invariants_ok for r in reports):
        checked = sum(r.sessions_checked or 0 for r in reports)
        out.print(f"invariants: {plural(checked, 'session')} OK")
    else:
        violations = [line for r in reports for line in r.violations]
        for line in violations[:20]:
            out.print(Text(f"  {shown(line)}"))
        more = len(violations) - 20
        if more > 0:
            out.print(f"  ... and {more} more (see `corral log check`)")
    for report in reports:
        _exit_status(report, max_error_rate)


def _exit_status(report: LoadReport, max_error_rate: float) -> None:
    total = report.turns_total or report.agents * report.turns
    if report.interrupted:
        raise InterruptedRunError(
            f"interrupted: {report.settled:,} of {total:,} turns settled, "
            f"{report.in_flight:,} in flight (the report above is of what ran)"
        )
    if report.timed_out:
        hint = ""
        if report.in_flight and not report.failures:
            hint = f"; {report.in_flight:,} requests in flight never answered"
        raise CliError(
            f"timed out: {report.settled:,} of {total:,} turns settled within --timeout{hint}"
        )
    if not report.invariants_ok:
        raise InvariantsError(
            f"invariants: {plural(len(report.violations), 'violation')} over "
            f"{plural(report.sessions_checked or 0, 'session')}"
        )
    error_rate = report.errored / report.settled if report.settled else 0.0
    if error_rate > max_error_rate:
        first = next((f for f in report.failures if f.turns), None)
        cause = f" (first: {first.code}: {first.example})" if first is not None else ""
        raise TurnsFailedError(
            f"{report.errored:,} of {report.settled:,} turns ended in error "
            f"({error_rate:.2%} > --max-error-rate {max_error_rate:g}){cause}"
        )


def _sharded(shards: int, address: str | None, **plan: Any) -> Callable[..., Any]:
    """``run_bench``'s twin that runs the load inside ``shards`` shards on Ray."""
    from runtime.cluster.bench import sharded_bench_runner  # noqa: PLC0415 - optional extra

    return sharded_bench_runner(shards, address, **plan)


def _plain_console(*, stderr: bool = False) -> Console:
    """A console printing text as it is: a model string or a violation may hold brackets
    and colons, never markup or emoji codes (styled parts are rich ``Text``)."""
    return Console(stderr=stderr, highlight=False, markup=False, emoji=False)


def _load(agents: int, turns: int) -> str:
    """``1 agent x 1 turn``, ``1,000 agents x 10 turns``."""
    return f"{plural(agents, 'agent')} x {plural(turns, 'turn')}"


def _threads(workers: int, standby: int) -> str:
    """``1 thread + 1 standby``, ``2 threads``."""
    text = f"{workers} thread{'s' if workers != 1 else ''}"
    return f"{text} + {standby} standby" if standby else text
