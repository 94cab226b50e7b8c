"""Storage commands: `corral job outputs ID [--pull DIR]` (a job's /outputs files) and
`corral storage ids` (the stable uids/gids, admin)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from corral.cli.common import Output, OutputOpt, client, err, friendly_errors, out, print_json, when
from corral.cli.data import storage_app  # one `corral storage` group: a second one hid this one's `ids`
from corral.words import plural

job_app = typer.Typer(help="A job's files: outputs.", no_args_is_help=True)


@storage_app.command("ids")
@friendly_errors
def ids(output: OutputOpt = Output.table) -> None:
    """Every user's uid and group's gid on the storage root (admin; gives out missing ones)."""
    with client() as c:
        items = c.storage_identities()
    if output is Output.json:
        print_json(items)
        return
    table = Table("KIND", "NAME", "ID", "CURRENT")
    for item in items:
        table.add_row(
            item["kind"], item["name"], str(item["id"]), "yes" if item["current"] else "no (deleted)"
        )
    out.print(table)


@job_app.command("outputs")
@friendly_errors
def outputs(
    job_id: Annotated[int, typer.Argument(help="job id")],
    pull: Annotated[
        Path | None, typer.Option("--pull", help="download every output file into this directory")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """List the files a job wrote to /outputs (kept after it ends), or fetch them with --pull."""
    with client() as c:
        if pull is not None:
            pulled = c.pull_outputs(job_id, pull)
            err.print(f"{plural(len(pulled), 'file')} of job {job_id} pulled into {pull}")
            return
        items = c.job_outputs(job_id)
    if output is Output.json:
        print_json(items)
        return
    if not items:
        out.print(f"job {job_id} has no outputs")
        return
    table = Table("PATH", "SIZE", "MODIFIED")
    for item in items:
        table.add_row(item["path"], str(item["size"]), when(item["modified_at"]))
    out.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(job_app, name="job")  # storage_app: registered by corral.cli.data
