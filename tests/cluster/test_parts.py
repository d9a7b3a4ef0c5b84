"""The parts of the cluster that need no Ray: routing, the journal, the store layout,
the recipe checks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from runtime.cluster import ClusterLayoutError, Router, UnportableError, shard_stores
from runtime.cluster.factories import AgentRecipe, build, recipe
from runtime.cluster.journal import Journal
from runtime.cluster.layout import claim_layout, stores_for


def test_routing_is_stable_and_spreads_ids_evenly() -> None:
    router = Router(4)
    ids = [f"agent-{n}" for n in range(8000)]
    counts = Counter(router.shard_of(i) for i in ids)
    assert set(counts) == {0, 1, 2, 3}
    assert all(1700 < c < 2300 for c in counts.values())
    assert [Router(4).shard_of(i) for i in ids[:100]] == [router.shard_of(i) for i in ids[:100]]
    # rendezvous: a fifth shard takes about a fifth of the ids, the rest stay put
    moved = sum(Router(5).shard_of(i) != router.shard_of(i) for i in ids)
    assert 1300 < moved < 1900
    with pytest.raises(ValueError, match="shards"):
        Router(0)


def test_the_journal_survives_a_torn_last_line_and_forgets_disposed_agents(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shard-0.agents"
    echo = AgentRecipe(model="tests.cluster.stack:echo_model")
    other = AgentRecipe(model="tests.cluster.stack:echo_model", system="terse")
    journal = Journal(path)
    journal.spawned([("a", echo), ("b", other), ("c", echo)])
    journal.disposed(["b"])
    journal.close()
    with path.open("ab") as f:
        f.write(b'{"recipe":0,"ag')  # a kill mid-write
    reopened = Journal(path)
    assert reopened.agents == {"a": echo, "c": echo}
    reopened.spawned([("d", other)])  # appended after the cut, not glued to it
    reopened.close()
    last = Journal(path)
    last.close()
    assert last.agents == {"a": echo, "c": echo, "d": other}


def test_a_store_keeps_its_shard_count_and_readers_find_its_shard_stores(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    claim_layout(root, 3)
    claim_layout(root, 3)
    with pytest.raises(ClusterLayoutError, match="shards=3"):
        claim_layout(root, 2)
    assert shard_stores(root) == []  # no shard has started yet
    (root / "shard-1").mkdir()
    (root / "shard-1" / "data.mdb").write_bytes(b"")
    assert shard_stores(root) == [root / "shard-1"]
    assert stores_for(root, "x") == [root / f"shard-{Router(3).shard_of('x')}"]
    plain = tmp_path / "plain"
    assert stores_for(plain) == [plain]


def test_recipes_take_model_strings_and_factories_and_refuse_live_objects() -> None:
    assert recipe("openai:gpt-4.1-mini", (), None).model == "openai:gpt-4.1-mini"
    spec = recipe("tests.cluster.stack:echo_model", ["tests.cluster.stack:shout_tool"], "hi")
    model, tools = build(spec)
    assert model.provider == "scripted"
    assert [t.spec.name for t in tools] == ["shout"]
    with pytest.raises(UnportableError, match="cannot be sent"):
        recipe(model, (), None)
    with pytest.raises(UnportableError, match="not a factory"):
        recipe("nocolon", (), None)
    with pytest.raises(UnportableError, match="has no function"):
        build(AgentRecipe(model="tests.cluster.stack:nothing_here"))
