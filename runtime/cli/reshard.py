"""``corral log reshard --store PATH --shards M``: give a cluster store another shard count.

Moves only the sessions whose shard changes (see :mod:`runtime.cluster.reshard`), with
the cluster closed; finishes an interrupted reshard when run again. Needs no Ray: it
reads and writes the shard stores directly, so run it where all of them are reachable.
"""

from __future__ import annotations

from pathlib import Path

import click

from runtime.cluster.layout import is_sharded

from .errors import CliError
from .options import inherited_store_option

__all__ = ["reshard"]


@click.command(name="reshard")
@inherited_store_option
@click.option(
    "--shards", type=click.IntRange(min=1), required=True, help="The shard count to have."
)
def reshard(store: Path, shards: int) -> None:
    """Move a cluster store's sessions to SHARDS shards (the cluster must be closed)."""
    from runtime.cluster.reshard import reshard as run  # noqa: PLC0415 - only this command

    if not is_sharded(store):
        raise CliError(f"{store} is not a cluster store (no cluster.json): nothing to reshard")
    report = run(store, shards)
    if report.before == report.after:
        click.echo(f"{store} has {shards} shards already: nothing to do")
        return
    click.echo(
        f"resharded {store}: {report.before} -> {report.after} shards; moved "
        f"{report.moved} of {report.sessions} sessions ({report.agents_moved} agents)"
    )
