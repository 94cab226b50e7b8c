"""`corral audit ls`: the admin audit log (admins). What is recorded: docs/security.md,
"Admin audit log"."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import Output, OutputOpt, client, friendly_errors, out, print_json, when
from corral.words import plural

audit_app = typer.Typer(help="The admin audit log: who changed what, when, from where.", no_args_is_help=True)
CHANGE_WIDTH = 60
WIDE_TERMINAL = 120  # the CHANGE column needs room: narrower terminals leave it out (-o json has it)


def change_cell(record: dict[str, Any]) -> str:
    """The fields that changed, "key: before -> after"; a whole state where only one side exists."""
    before, after = record.get("before"), record.get("after")
    if isinstance(before, dict) and isinstance(after, dict):
        keys = [k for k in after if before.get(k) != after.get(k)] + [k for k in before if k not in after]
        text = ", ".join(f"{k}: {_short(before.get(k))} -> {_short(after.get(k))}" for k in keys)
    else:
        text = _short(after if after is not None else before) if (after or before) is not None else ""
    if record.get("detail"):
        text = f"{text} ({record['detail']})" if text else str(record["detail"])
    return text if len(text) <= CHANGE_WIDTH else text[: CHANGE_WIDTH - 1] + "…"


def _short(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


@audit_app.command("ls")
@friendly_errors
def ls(
    actor: Annotated[str | None, typer.Option(help="only this user (or system:<loop>)")] = None,
    action: Annotated[
        str | None, typer.Option(help="an action or dotted prefix, e.g. group or token.create")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(help="KIND or KIND:ID, e.g. node or group:vision (an unknown KIND is refused)"),
    ] = None,
    since: Annotated[str | None, typer.Option(help="age (7d, 12h, 30m), unix seconds or ISO time")] = None,
    until: Annotated[str | None, typer.Option(help="as --since; exclusive")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="at most this many records")] = 50,
    output: OutputOpt = Output.table,
) -> None:
    """Audit records, newest first (admin). The CHANGE column (what changed, before -> after)
    shows in terminals at least 120 columns wide; `-o json` has the full before and after."""
    with client() as c:
        page = c.audit(actor=actor, action=action, target=target, since=since, until=until, limit=limit)
    if output is Output.json:
        print_json(page)
        return
    wide = out.width >= WIDE_TERMINAL
    table = Table(box=None)
    # The id and time kept whole (what one reads a record by); the rest fold where the terminal is
    # narrow. All no_wrap, a long actor or target squeezed every column: at 80 columns the ID went
    # and the time read "2026-11-30 0…".
    for heading in ("ID", "WHEN"):
        table.add_column(heading, no_wrap=True)
    for heading in ("ACTOR", "FROM", "ACTION", "TARGET"):
        table.add_column(heading, overflow="fold")
    if wide:
        table.add_column("CHANGE", overflow="fold")
    for r in page["items"]:
        cells = [str(r["id"]), when(r["at"]), r["actor"], r["source"] or "-", r["action"]]
        cells.append(f"{r['target_kind']}:{r['target_id']}")
        table.add_row(*cells, *([change_cell(r)] if wide else []))
    out.print(table)
    out.print(f"{len(page['items'])} of {plural(page['total'], 'record')}")


def register(app: typer.Typer) -> None:
    app.add_typer(audit_app, name="audit")
