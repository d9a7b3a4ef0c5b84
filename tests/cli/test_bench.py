"""``corral bench``: exit codes, the final table, the ``--json`` report, ``--fresh``."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from storage.lmdb.store import Store
from tests.cli.conftest import assert_one_error_line, corral

REPORT_FIELDS = {
    "agents",
    "turns",
    "durability",
    "threads",
    "standby",
    "wall_s",
    "turns_per_s",
    "events",
    "events_per_s",
    "latency_ms",
    "settled",
    "errored",
    "retried",
    "rss_peak_mb",
    "log_bytes",
    "invariants_ok",
    "violations",
}


def _bench(tmp_path: Path, *args: str) -> tuple[object, dict[str, object]]:
    report = tmp_path / "report.json"
    result = corral("bench", "--store", tmp_path / "store", "--json", report, *args)
    assert result.returncode == 0, result.stderr
    return result, json.loads(report.read_text())


def test_a_small_load_with_tools_and_failures_reports_counts_its_logs_confirm(
    tmp_path: Path,
) -> None:
    result, report = _bench(
        tmp_path,
        "--agents",
        "20",
        "--turns",
        "3",
        "--tool-calls",
        "1",
        "--chunks",
        "2",
        "--failure-rate",
        "0.3",
        # at 30% a turn's six attempts may all fail (about 1.8% of turns): errored turns
        # are expected here, so they must not fail the run (test_bench_failures.py
        # checks the default, 0)
        "--max-error-rate",
        "1",
    )
    assert report.keys() >= REPORT_FIELDS
    assert report["agents"] == 20 and report["turns"] == 3
    assert report["durability"] == "write-ahead"
    assert report["settled"] == 60
    assert 0 <= report["errored"] <= report["settled"]
    assert report["retried"] > 0  # ~150 requests at 30% failures: a retry is certain
    assert report["invariants_ok"] is True and report["violations"] == []
    assert set(report["latency_ms"]) >= {"p50", "p95", "p99"}
    assert report["latency_ms"]["p50"] <= report["latency_ms"]["p99"]
    assert report["events"] > 0 and report["log_bytes"] > 0 and report["rss_peak_mb"] > 0
    assert "invariants: 20 sessions OK" in result.stdout  # type: ignore[attr-defined]
    for row in ("turns/s", "durable events/s", "turn latency p99", "settled", "RSS peak"):
        assert row in result.stdout  # type: ignore[attr-defined]

    # The logs agree with the report: one message turn per settled follow-up, one retry
    # turn per retry, and every failed turn not followed by a retry is an errored one.
    with Store.open(tmp_path / "store", readonly=True) as store:
        events = [e for h in store.sessions() for e in store.read(h.id)]
    starts = [e.data.trigger.kind for e in events if e.type == "turn/start"]
    error_ends = sum(1 for e in events if e.type == "turn/end" and e.data.reason.kind == "error")
    assert starts.count("message") == report["settled"]
    assert starts.count("retry") == report["retried"]
    assert error_ends - report["retried"] == report["errored"]
    # A chain whose every request failed ended errored before its first tool call.
    tool_calls = sum(1 for e in events if e.type == "tool/call")
    assert tool_calls >= report["settled"] - report["errored"]
    assert len(events) == report["events"]


def test_durability_and_threads_are_reported(tmp_path: Path) -> None:
    result, report = _bench(
        tmp_path,
        "--agents",
        "5",
        "--turns",
        "2",
        "--durability",
        "none",
        "--threads",
        "1",
        "--quiet",
    )
    assert report["durability"] == "none"
    assert report["threads"] == 1 and report["standby"] == 0  # explicit: no standby
    assert "1 thread, " in result.stdout  # type: ignore[attr-defined]
    assert report["settled"] == 10


def test_a_model_string_replaces_the_scripted_load_model(tmp_path: Path) -> None:
    _, report = _bench(tmp_path, "--agents", "3", "--turns", "2", "--model", "scripted:echo")
    assert report["model"] == "scripted:scripted"
    assert report["settled"] == 6 and report["invariants_ok"] is True


def test_fresh_wipes_a_corral_store_and_refuses_anything_else(tmp_path: Path) -> None:
    store = tmp_path / "store"
    for _ in range(2):
        result = corral("bench", "--store", store, "--fresh", "--agents", "4", "--turns", "1")
        assert result.returncode == 0, result.stderr
        assert "invariants: 4 sessions OK" in result.stdout

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    refused = corral("bench", "--store", precious, "--fresh", "--agents", "1", "--turns", "1")
    assert_one_error_line(refused, "--fresh refuses", "not a corral store")
    assert (precious / "notes.txt").read_text() == "keep me"


def test_a_run_that_times_out_says_so_and_fails(tmp_path: Path) -> None:
    result = corral(
        "bench",
        "--store",
        tmp_path / "store",
        "--agents",
        "2",
        "--turns",
        "1",
        "--latency",
        "30",
        "--timeout",
        "0.2",
        "--quiet",
    )
    assert_one_error_line(result, "timed out", "0 of 2 turns")


def test_the_timeout_covers_spawning_so_a_huge_agent_count_still_ends(tmp_path: Path) -> None:
    agents = 10**9  # spawning them all would take hours and all memory
    result = corral(
        "bench", "--store", tmp_path / "store", "--agents", str(agents), "--timeout", "1", "-q"
    )
    assert_one_error_line(result, "timed out", f"of {agents * 10:,} turns")


def test_plot_needs_matplotlib_or_writes_a_png(tmp_path: Path) -> None:
    plot = tmp_path / "bench.png"
    result = corral(
        "bench",
        "--store",
        tmp_path / "store",
        "--agents",
        "3",
        "--turns",
        "2",
        "--plot",
        plot,
        "--quiet",
    )
    if importlib.util.find_spec("matplotlib") is None:
        assert_one_error_line(result, "matplotlib", "corral[plot]")
        assert not (tmp_path / "store").exists()  # it failed before touching the store
    else:
        assert result.returncode == 0, result.stderr
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_report_path_in_a_missing_directory_is_refused_before_the_run(tmp_path: Path) -> None:
    for option in ("--json", "--plot"):
        store = tmp_path / "store"
        missing = tmp_path / "no" / "such" / "x.out"
        result = corral("bench", "--agents", "1", "--turns", "1", "--store", store, option, missing)
        assert result.returncode == 2, result.stderr
        assert f"Invalid value for '{option}'" in result.stderr
        assert "does not exist" in result.stderr
        assert "Traceback" not in result.stderr
        assert not store.exists()  # nothing ran


def test_a_report_path_naming_the_stores_own_files_is_refused_before_the_run(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    made = corral("bench", "--agents", "3", "--turns", "1", "--store", store, "-q")
    assert made.returncode == 0, made.stderr
    data_before = (store / "data.mdb").read_bytes()
    link = tmp_path / "link.png"  # a plot-able suffix: the store check, not the format's
    link.symlink_to(store / "data.mdb")
    for option in ("--json", "--plot"):
        for target, own in (
            (store / "data.mdb", "is the store's own data.mdb"),
            (store / "lock.mdb", "is the store's own lock.mdb"),
            (link, "is the store's own data.mdb"),
        ):
            mdb_plot = option == "--plot" and target.suffix == ".mdb"
            needle = "does not write .mdb files" if mdb_plot else own
            args = ["bench", "--agents", "1", "--turns", "1", "--store", store, "-q"]
            result = corral(*args, option, target)
            assert result.returncode == 2, result.stderr
            assert_one_error_line(result, f"Invalid value for '{option}'", needle)
    assert (store / "data.mdb").read_bytes() == data_before  # nothing ran, nothing written
    checked = corral("log", "check", "--store", store)
    assert checked.returncode == 0 and "3 sessions OK" in checked.stdout, checked


def test_a_report_path_naming_the_store_directory_to_be_made_is_refused_before_the_run(
    tmp_path: Path,
) -> None:
    store = tmp_path / "new"
    for option in ("--json", "--plot"):
        result = corral("bench", "--agents", "1", "--turns", "1", "--store", store, option, store)
        assert result.returncode == 2, result.stderr
        assert_one_error_line(result, f"Invalid value for '{option}'", "is the store directory")
        assert not store.exists()  # nothing ran


def test_a_plot_path_of_a_format_matplotlib_does_not_write_is_refused_before_the_run(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    args = ["bench", "--agents", "1", "--turns", "1", "--store", store]
    result = corral(*args, "--plot", tmp_path / "out.mdb")
    assert result.returncode == 2, result.stderr
    assert_one_error_line(result, "Invalid value for '--plot'", "does not write .mdb files", ".png")
    assert not store.exists()  # nothing ran


def test_one_agent_one_turn_reads_singular_and_every_line_fits_80_columns(
    tmp_path: Path,
) -> None:
    result, report = _bench(tmp_path, "--agents", "1", "--turns", "1", "-q")
    lines = result.stdout.splitlines()  # type: ignore[attr-defined]
    assert lines[0] == "corral bench: 1 agent x 1 turn, write-ahead", lines
    assert lines[1].endswith(", model scripted:load"), lines
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[-1] == "invariants: 1 session OK"
    rows = {line.strip("│ ").split("│")[0].strip(): line for line in lines if "│" in line}
    assert "wall time" not in rows  # the turns' own time, not the run's: said so
    assert f"{report['wall_s']:,.2f} s" in rows["turns wall time"]
    assert f"{report['spawn_s']:,.2f} s" in rows["spawn time"]
