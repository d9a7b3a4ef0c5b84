"""The ``corral`` command line: ``corral bench``, ``corral compare``, ``corral log ...``,
``corral run SCRIPT``, ``corral acp``.

``main`` is the console-script entry point (``corral = "runtime.cli:main"``); the global
``--debug`` flag prints tracebacks, otherwise every error is one line on stderr (see
:mod:`runtime.cli.errors` for the exit codes).
"""

from __future__ import annotations

import click

from .acp import acp
from .bench import bench
from .compare import compare
from .errors import CorralGroup
from .log import log
from .reshard import reshard
from .run import run
from .top import top

__all__ = ["cli", "main"]


@click.group(cls=CorralGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--debug",
    is_flag=True,
    envvar="CORRAL_DEBUG",
    help="Print tracebacks for errors (also $CORRAL_DEBUG=1).",
)
@click.version_option(package_name="corral", prog_name="corral")
def cli(debug: bool) -> None:
    """corral: host many LLM agents in one process, benchmark them, read their logs."""


cli.add_command(acp)
cli.add_command(bench)
cli.add_command(compare)
log.add_command(reshard)
cli.add_command(log)
cli.add_command(run)
cli.add_command(top)


def main() -> None:
    """The ``corral`` console script."""
    cli.main(prog_name="corral")
