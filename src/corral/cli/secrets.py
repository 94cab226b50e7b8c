"""`corral secret`: secrets for jobs (set, ls, rm). A value is never taken from the command line
(it would land in the shell history and in `ps`): it comes from a file, from stdin, or from a
hidden prompt. See docs/security.md, "Secrets for jobs"."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import Output, OutputOpt, ago, client, friendly_errors, out, print_json
from corral.sdk import CorralError
from corral.words import plural

secret_app = typer.Typer(
    help="Secrets for jobs: a job gets one only when its spec names it (`secrets:`).",
    no_args_is_help=True,
)
GroupOpt = Annotated[
    str | None, typer.Option("--group", "-g", help="the group's secret (set/rm: group admins and admins)")
]
ListGroupOpt = Annotated[
    str | None,
    typer.Option("--group", "-g", help="list only this group's secrets (one of yours; admins: any group)"),
]


def _value(from_file: Path | None) -> bytes:
    if from_file is not None:
        try:
            return from_file.read_bytes()  # exactly the file's bytes (keys keep their last newline)
        except OSError as exc:
            raise CorralError(f"cannot read {from_file}: {exc.strerror}")
    if not sys.stdin.isatty():
        data = sys.stdin.buffer.read()
        return data[:-1] if data.endswith(b"\n") else data  # `echo $X |` adds one newline
    return typer.prompt("Value", hide_input=True, confirmation_prompt=True).encode()


@secret_app.command("set")
@friendly_errors
def set_secret(
    name: Annotated[str, typer.Argument(help="letters, digits, '.', '_', '-'")],
    group: GroupOpt = None,
    from_file: Annotated[
        Path | None, typer.Option("--from-file", "-f", help="read the value from this file (exact bytes)")
    ] = None,
) -> None:
    """Create or replace a secret (the value is never taken from the command line).

    The value comes from --from-file (exact bytes), else stdin (one trailing newline dropped),
    else a hidden prompt."""
    value = _value(from_file)
    if not value:
        raise CorralError("the value is empty: nothing was set")
    with client() as c:
        c.set_secret(name, value, group=group)
    where = f"group {group}'s" if group else "your"
    out.print(f"{where} secret [bold]{name}[/bold] set ({plural(len(value), 'byte')})", markup=True)


@secret_app.command("ls")
@friendly_errors
def list_secrets(group: ListGroupOpt = None, output: OutputOpt = Output.table) -> None:
    """Your secrets and your groups' (or only one group's): names, scope, last change. Values are
    never shown."""
    with client() as c:
        rows: list[dict[str, Any]] = c.secrets(group=group)
    if output is Output.json:
        print_json(rows)
        return
    table = Table("NAME", "SCOPE", "UPDATED", "BY", box=None)
    for s in rows:
        scope = f"group {s['group']}" if s["scope"] == "group" else "user"
        table.add_row(s["name"], scope, ago(s["updated_at"]), s["updated_by"])
    out.print(table)


@secret_app.command("rm")
@friendly_errors
def remove_secret(name: str, group: GroupOpt = None) -> None:
    """Delete a secret. Jobs that name it and have not started fail at dispatch, saying so."""
    with client() as c:
        c.delete_secret(name, group=group)
    out.print(f"secret {name} deleted")


def register(app: typer.Typer) -> None:
    app.add_typer(secret_app, name="secret")
