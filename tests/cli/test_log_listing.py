"""``corral log`` at scale: ``ls`` filters, sorts and limits; a unique prefix of an id is
taken wherever an id is; ``--store`` (and ``$CORRAL_STORE``) at the group level."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import LlmFailure, RetryPolicy, Runtime, ScriptedModel
from runtime.cluster.layout import claim_layout, shard_path
from runtime.cluster.routing import Router
from storage import Store
from storage.events import MessageTrigger, TurnStart

from .conftest import assert_one_error_line, corral, run_ok

IDS = ("abc-one", "abc-two", "xyz-failed", "open-one", "new-one")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("listing") / "store"
    failure = LlmFailure(message="overloaded", code="SERVER", status=503)
    with Runtime.open(path, retry_policy=RetryPolicy(base_s=0.001, cap_s=0.002)) as rt:
        one = rt.spawn(model=ScriptedModel.echo(), session_id="abc-one")
        for text in ("a", "b", "c"):
            one.followup(text)
        two = rt.spawn(model=ScriptedModel([failure, "ok"]), session_id="abc-two")
        two.followup("x")
        assert one.wait_idle(10) and two.wait_idle(10)
    with Runtime.open(path, retry_policy=None) as rt:
        failed = rt.spawn(model=ScriptedModel([failure]), session_id="xyz-failed")
        failed.followup("y")
        assert failed.wait_idle(10)
    with Store.open(path) as st:  # a turn left open, as a killed process leaves it
        st.create_session("open-one").append_fact(TurnStart(turn=1, trigger=MessageTrigger()))
        st.create_session("new-one")
        st.flush()
    return path


def rows(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["session", "created", "turns"]
    return {line.split()[0]: line.split() for line in lines[1:-1]}


def test_ls_counts_chains_with_retries_apart_and_shows_each_sessions_state(store: Path) -> None:
    listed = rows(run_ok(["log", "ls", "--store", store]))
    assert list(listed) == list(IDS)
    # columns: session, date, time, turns, retries, last turn, state, events
    assert listed["abc-one"][3:7] == ["3", "0", "completed", "idle"]
    assert listed["abc-two"][3:7] == ["1", "1", "completed", "idle"]
    assert listed["xyz-failed"][3:7] == ["1", "0", "error", "idle"]
    assert listed["open-one"][3:7] == ["1", "0", "-", "open"]
    assert listed["new-one"][3:7] == ["0", "0", "-", "new"]


def test_ls_filters_by_state_and_outcome_and_says_how_many_of_all_it_shows(store: Path) -> None:
    out = run_ok(["log", "ls", "--store", store, "--state", "open", "--state", "new"])
    assert list(rows(out)) == ["open-one", "new-one"]
    assert f"2 of 5 session(s) in {store}" in out
    assert list(rows(run_ok(["log", "ls", "--store", store, "--outcome", "error"]))) == [
        "xyz-failed"
    ]


def test_ls_sorts_reverses_and_limits(store: Path) -> None:
    out = run_ok(["log", "ls", "--store", store, "--sort", "events", "-r", "--limit", "2"])
    assert list(rows(out)) == ["abc-one", "abc-two"]
    assert list(rows(run_ok(["log", "ls", "--store", store, "-r", "-n", "1"]))) == ["new-one"]
    by_id = list(rows(run_ok(["log", "ls", "--store", store, "--sort", "id"])))
    assert by_id == sorted(IDS)


def test_ls_filters_by_time(store: Path) -> None:
    assert len(rows(run_ok(["log", "ls", "--store", store, "--since", "1h"]))) == len(IDS)
    assert rows(run_ok(["log", "ls", "--store", store, "--until", "1h"])) == {}
    assert rows(run_ok(["log", "ls", "--store", store, "--since", "2100-01-01"])) == {}
    result = corral("log", "ls", "--store", store, "--since", "yesterday")
    assert result.returncode == 2 and "neither a duration" in result.stderr


def test_a_unique_prefix_of_an_id_is_taken_by_show_tail_and_export(store: Path) -> None:
    assert run_ok(["log", "show", "xyz", "--store", store]).startswith("session xyz-failed")
    assert "user: y" in run_ok(["log", "tail", "xy", "--store", store])
    assert '"session":{"id":"abc-two"' in run_ok(["log", "export", "abc-t", "--store", store])


def test_an_ambiguous_or_unknown_prefix_is_one_clear_error(store: Path) -> None:
    line = assert_one_error_line(corral("log", "show", "abc", "--store", store))
    assert "2 sessions start with 'abc' (abc-one, abc-two): give more characters" in line
    line = assert_one_error_line(corral("log", "tail", "nope", "--store", store))
    assert "no session 'nope'" in line


def test_store_is_taken_at_the_group_level_and_from_the_environment(
    store: Path, tmp_path: Path
) -> None:
    assert "sessions" in run_ok(["log", "--store", store, "stats"])
    assert list(rows(run_ok(["log", "--store", store, "ls"]))) == list(IDS)
    # the command's own --store wins over the group's
    missing = tmp_path / "missing"
    assert list(rows(run_ok(["log", "--store", missing, "ls", "--store", store]))) == list(IDS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_STORE"] = str(store)
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "log", "ls"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert list(rows(done.stdout)) == list(IDS)


# A cluster's store, as runtime.cluster lays it out (cluster.json, one ordinary store per
# shard, each session in the shard its id routes to), written here without Ray.
SHARDED = ("team-red-1", "team-red-2", "team-blue-1", "team-blue-2", "lone-wolf", "omega-7")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster") / "store"
    claim_layout(root, 2)
    for shard, ids in Router(2).group(SHARDED).items():
        with Runtime.open(shard_path(root, shard)) as rt:
            for sid in ids:
                agent = rt.spawn(model=ScriptedModel.echo(), session_id=sid)
                agent.followup(f"hello from {sid}")
                assert agent.wait_idle(10)
    return root


def test_on_a_cluster_store_an_id_or_a_unique_prefix_is_found_in_its_shard(
    sharded: Path,
) -> None:
    router = Router(2)
    # The prefixes below route elsewhere than their sessions: found by reading every shard.
    assert router.shard_of("lone-wolf") == 1 and router.shard_of("lo") == 0
    assert router.shard_of("omega-7") == 0 and router.shard_of("om") == 1
    assert {router.shard_of(sid) for sid in SHARDED} == {0, 1}
    for sid in SHARDED:  # exact ids, each in the shard it routes to
        out = run_ok(["log", "show", sid, "--store", sharded])
        assert out.startswith(f"session {sid} ") and f"hello from {sid}" in out
    assert run_ok(["log", "show", "lo", "--store", sharded]).startswith("session lone-wolf ")
    assert "hello from omega-7" in run_ok(["log", "tail", "om", "-n", "50", "--store", sharded])
    exported = run_ok(["log", "export", "team-blue-2", "--store", sharded])
    assert '"session":{"id":"team-blue-2"' in exported.splitlines()[0]
    assert '"session":{"id":"lone-wolf"' in run_ok(["log", "export", "lone", "--store", sharded])


def test_on_a_cluster_store_an_ambiguous_or_unknown_prefix_is_one_clear_error(
    sharded: Path,
) -> None:
    # team-blue-1 is in shard 0, team-blue-2 in shard 1: the candidates of both are named.
    line = assert_one_error_line(corral("log", "show", "team-blue", "--store", sharded))
    assert "2 sessions start with 'team-blue' (team-blue-1, team-blue-2): give more" in line
    line = assert_one_error_line(corral("log", "tail", "team-", "--store", sharded))
    assert "4 sessions start with 'team-' (team-blue-1, team-blue-2, team-red-1, " in line
    line = assert_one_error_line(corral("log", "export", "nope", "--store", sharded))
    assert "no session 'nope' (nor one starting with it) in the cluster store at " in line
    assert "(2 shard stores)" in line


def test_ls_on_a_cluster_store_lists_every_shards_sessions(sharded: Path) -> None:
    assert sorted(rows(run_ok(["log", "ls", "--store", sharded]))) == sorted(SHARDED)
