"""Failures are visible: a failing provider's turns show up by code with a message and
fail the run; a provider that never answers is named as such; options a real model does
not use are refused; many paid requests need a confirmation; Ctrl-C prints the report."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import assert_one_error_line, corral, spawn_corral


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A loopback port bound but not listening: every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


def test_a_provider_that_refuses_connections_fails_the_run_with_its_reason(
    tmp_path: Path, refusing_port: int
) -> None:
    report = tmp_path / "report.json"
    model = f"ollama:llama3.2@http://127.0.0.1:{refusing_port}/v1"
    result = corral(
        "bench", "--store", tmp_path / "store", "--model", model, "--agents", "2",
        "--turns", "1", "--json", report, "-q",
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    line = assert_one_error_line(result, "2 of 2 turns ended in error", "TRANSPORT")
    assert "--max-error-rate" in line
    # the report shows the failures by code, with one message, and the retries
    assert "failed model requests" in result.stdout and "TRANSPORT" in result.stdout
    data = json.loads(report.read_text())
    (failure,) = data["failures"]
    assert failure["code"] == "TRANSPORT" and failure["turns"] == 2
    assert failure["requests"] == 12  # each turn: the request and its 5 retries
    assert failure["example"]
    assert data["errored"] == 2 and data["retried"] == 10 and data["error_rate"] == 1.0


def test_a_max_error_rate_above_the_failures_lets_the_run_pass(
    tmp_path: Path, refusing_port: int
) -> None:
    model = f"ollama:llama3.2@http://127.0.0.1:{refusing_port}/v1"
    result = corral(
        "bench", "--store", tmp_path / "store", "--model", model, "--agents", "1",
        "--turns", "1", "--max-error-rate", "1", "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "TRANSPORT" in result.stdout


def test_a_provider_that_never_answers_is_named_when_the_run_times_out(
    tmp_path: Path, silent_port: int
) -> None:
    model = f"ollama:llama3.2@http://127.0.0.1:{silent_port}/v1"
    result = corral(
        "bench", "--store", tmp_path / "store", "--model", model, "--agents", "3",
        "--turns", "1", "--timeout", "1", "-q",
    )  # fmt: skip
    assert_one_error_line(result, "timed out: 0 of 3 turns", "3 requests in flight never answered")
    assert "in flight at the end" in result.stdout


def test_the_scripted_failure_rate_is_retried_and_passes_a_zero_max_error_rate(
    tmp_path: Path,
) -> None:
    """CI's smoke line: --failure-rate fails requests, the retries absorb them (a turn
    ends in error only if all six attempts fail), so no turn errs and the run passes."""
    report = tmp_path / "report.json"
    result = corral(
        "bench", "--store", tmp_path / "store", "--agents", "50", "--turns", "3",
        "--tool-calls", "1", "--failure-rate", "0.05", "--json", report, "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(report.read_text())
    assert data["errored"] == 0 and data["retried"] > 0
    assert data["failures"][0]["code"] == "SERVER" and data["failures"][0]["turns"] == 0


def test_a_scripted_failure_rate_that_ends_turns_fails_the_run(tmp_path: Path) -> None:
    result = corral(
        "bench", "--store", tmp_path / "store", "--agents", "20", "--turns", "2",
        "--failure-rate", "0.9", "-q",
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert_one_error_line(result, "turns ended in error", "SERVER: scripted server error")


@pytest.mark.parametrize(
    ("option", "value"),
    [("--latency", "0.1"), ("--tool-calls", "1"), ("--failure-rate", "0.1"), ("--ttft", "1")],
)
def test_options_of_the_scripted_or_simulated_model_are_refused_with_a_real_one(
    tmp_path: Path, option: str, value: str
) -> None:
    result = corral(
        "bench", "--store", tmp_path / "store", "--model", "openai:gpt-4.1-mini",
        option, value, "--agents", "1", "--turns", "1",
    )  # fmt: skip
    assert result.returncode == 2
    assert_one_error_line(result, option, "not --model")
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ttft", "0.1", "--latency", "0.1"], "--latency shape the scripted model"),
        (["--rate", "10", "--turns", "3"], "--turns is a closed loop's"),
        (["--duration", "3"], "--duration need --rate"),
        (["--sweep", "agents=1,2", "--agents", "3"], "--agents is what --sweep agents"),
        (["--sweep", "agents=5"], "at least two values"),
        (["--prompt-order", "sample"], "--prompt-order needs --prompts"),
        (["--shards", "3", "--agents", "2"], "--shards 3 for 2 agents"),
        (["--shards", "2", "--sweep", "agents=1,4"], "--shards 2 for 1 agents"),
        (["--address", "127.0.0.1:1"], "--address goes with --shards"),
    ],
)
def test_options_that_do_not_go_together_are_refused(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    result = corral("bench", "--store", tmp_path / "store", *args)
    assert result.returncode == 2
    assert_one_error_line(result, needle)


def test_a_real_model_with_the_default_load_needs_yes(tmp_path: Path, refusing_port: int) -> None:
    model = f"ollama:llama3.2@http://127.0.0.1:{refusing_port}/v1"
    result = corral("bench", "--store", tmp_path / "store", "--model", model, input="")
    assert_one_error_line(result, "about 10,000 requests", "pass --yes")
    assert not (tmp_path / "store").exists()  # nothing was sent, nothing made


def test_ctrl_c_prints_the_report_of_what_ran_and_exits_130(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ("bench", "--store", store, "--agents", "4", "--turns", "1000", "--latency", "0.05")
    with spawn_corral(*args) as process:
        assert process.stderr is not None and process.stdout is not None
        for line in process.stderr:  # the plain progress line: turns are settling
            if line.startswith("bench: ") and " turns/s" in line:
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "interrupted:" in err and "the report above is of what ran" in err
    assert "turns/s" in out and "settled" in out
    assert "invariants: 4 sessions OK" in out


def test_the_progress_lines_name_each_failure_codes_first_message(
    tmp_path: Path, refusing_port: int
) -> None:
    model = f"ollama:llama3.2@http://127.0.0.1:{refusing_port}/v1"
    result = corral(
        "bench", "--store", tmp_path / "store", "--model", model, "--agents", "1",
        "--turns", "1",
    )  # fmt: skip
    assert result.returncode == 4
    firsts = [line for line in result.stderr.splitlines() if "bench: first " in line]
    assert len(firsts) == 1 and "first TRANSPORT failure: ollama connection failed" in firsts[0]
