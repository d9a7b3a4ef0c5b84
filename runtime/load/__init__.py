"""Load tests of agent stacks: host a pool of agents, send them traffic, measure.

- :func:`run_load` drives agents on a :class:`~runtime.Runtime` you opened;
  :func:`run_bench` opens one over a store path, drives it, closes it and checks this
  run's session logs; :func:`run_sweep` runs one point per swept value.
- What is hosted: an :class:`AgentStack` (your factory's, ``package.module:factory``)
  on the built-in scripted model, a :class:`SimulatedModel` (vendor-like streaming
  without paying for tokens) or a real one.
- Traffic: a closed loop (each agent's next turn when its last settled) or an open one
  (:class:`Traffic`: arrivals at a rate, Poisson or constant).
- The record: :class:`LoadReport` / :class:`SweepReport` (``--json``; docs/load.md),
  with a per-turn :class:`Breakdown` read from the session logs
  (:func:`turn_times`); :func:`compare_reports` sets two side by side.

No terminal or CLI concerns here: ``corral bench`` and ``benchmarks/`` build on it.
"""

from .bench import (
    FAST_RETRY,
    SessionViolations,
    StoreCheck,
    check_store,
    knee,
    run_bench,
    run_sweep,
    store_bytes,
)
from .breakdown import PARTS, TurnTimes, breakdown, latency_of, turn_times
from .compare import Comparison, compare_reports, compare_sweeps, read_report
from .driver import LoadDriver, run_load
from .failures import FailureTally
from .merge import Part, merge_runs
from .report import (
    SCHEMA,
    Breakdown,
    FailureCount,
    LatencySummary,
    LoadProgress,
    LoadReport,
    LoadSamples,
    OpenLoop,
    SweepPoint,
    SweepReport,
    percentile,
)
from .simulated import Dist, Draw, SimulatedModel, SimulatedSettings
from .spec import LoadSpec
from .stack import (
    AgentStack,
    AgentStackError,
    Prompts,
    PromptsError,
    build_stack,
    load_factory,
    lookup_stack,
    lookup_tool,
    read_prompts,
    scripted_load_model,
)
from .traffic import Traffic, arrival_times

__all__ = [
    "FAST_RETRY",
    "PARTS",
    "SCHEMA",
    "AgentStack",
    "AgentStackError",
    "Breakdown",
    "Comparison",
    "Dist",
    "Draw",
    "FailureCount",
    "FailureTally",
    "LatencySummary",
    "LoadDriver",
    "LoadProgress",
    "LoadReport",
    "LoadSamples",
    "LoadSpec",
    "OpenLoop",
    "Part",
    "Prompts",
    "PromptsError",
    "SessionViolations",
    "SimulatedModel",
    "SimulatedSettings",
    "StoreCheck",
    "SweepPoint",
    "SweepReport",
    "Traffic",
    "TurnTimes",
    "arrival_times",
    "breakdown",
    "build_stack",
    "check_store",
    "compare_reports",
    "compare_sweeps",
    "knee",
    "latency_of",
    "load_factory",
    "lookup_stack",
    "lookup_tool",
    "merge_runs",
    "percentile",
    "read_prompts",
    "read_report",
    "run_bench",
    "run_load",
    "run_sweep",
    "scripted_load_model",
    "store_bytes",
    "turn_times",
]
