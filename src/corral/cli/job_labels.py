"""`corral label`: edit a job's labels after submit, as `kubectl label` does (PATCH
/jobs/{id}/labels; the rules: corral.services.job_labels)."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli.common import Output, OutputOpt, client, friendly_errors, out, print_json
from corral.sdk import CorralError


def label_changes(changes: list[str]) -> tuple[dict[str, str], list[str]]:
    """`trial=8 best=yes stale-` -> ({"trial": "8", "best": "yes"}, ["stale"]); the server checks
    the names and values. A name given twice is refused: which of its changes was meant?"""
    setting: dict[str, str] = {}
    removing: list[str] = []
    for change in changes:
        name, sep, value = change.partition("=")
        if not sep and not change.endswith("-"):
            raise CorralError(f"{change!r}: give NAME=VALUE to set a label or NAME- to remove it")
        name = name if sep else change[:-1]
        if name in setting or name in removing:
            raise CorralError(f"label {name!r} is named twice: set it or remove it, once")
        if sep:
            setting[name] = value
        else:
            removing.append(name)
    return setting, removing


@friendly_errors
def label(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    changes: Annotated[list[str], typer.Argument(metavar="NAME=VALUE|NAME-", show_default=False)],
    output: OutputOpt = Output.table,
) -> None:
    """Set or remove a job's labels, in any state: `corral label 7 trial=8 best=yes stale-` sets
    trial and best (a new value replaces the old) and removes stale (`tag--` removes a label
    named tag-); the others stay. The rules of submit (at most 16 labels); you, an admin of the
    job's group, or an admin."""
    setting, removing = label_changes(changes)
    with client() as c:
        job = c.set_labels(job_id, setting, remove=removing)
    if output is Output.json:
        print_json(job)
        return
    shown = " ".join(f"{name}={value}" for name, value in sorted(job["labels"].items()))
    out.print(f"job {job_id} labels: {shown or '(none)'}", highlight=False, markup=False, soft_wrap=True)
