"""Shared pytest configuration: ``--soak`` enables the long ``@pytest.mark.soak`` tests;
``--clock=manual`` runs the scenario suite's runtimes on a ``ManualClock``
(``tests/scenarios/conftest.py``)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("corral")
    group.addoption(
        "--soak", action="store_true", default=False, help="also run @pytest.mark.soak tests"
    )
    group.addoption(
        "--soak-kills",
        type=int,
        default=200,
        help="how many times the soak crash test kills its child (default 200)",
    )
    group.addoption(
        "--clock",
        choices=("system", "manual"),
        default="system",
        help="the clock of every runtime a scenario test opens (default system; manual: a "
        "ManualClock that only the test moves)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reaches beyond loopback (see ``tests/network_guard.py``)."""
    from tests.network_guard import install

    install(monkeypatch)
