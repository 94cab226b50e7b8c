"""`corral auth`: failed-login lockouts (admin) and portal sessions (yours; admins: anyone's).
See docs/security.md, "API and login"."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import Output, OutputOpt, ago, client, friendly_errors, out, print_json, when

auth_app = typer.Typer(help="Login lockouts and portal sessions.", no_args_is_help=True)


@auth_app.command("lockouts")
@friendly_errors
def lockouts(
    locked: Annotated[bool, typer.Option("--locked", help="only lockouts still running")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Failed logins per account and per source address, and their lockouts (admin)."""
    with client() as c:
        rows: list[dict[str, Any]] = c.request("GET", "/auth/lockouts", params={"locked": locked})
    if output is Output.json:
        print_json(rows)
        return
    table = Table("ID", "SCOPE", "KEY", "FAILURES", "LAST FAILURE", "LOCKED UNTIL", box=None)
    for r in rows:
        until = when(r["locked_until"]) if r["locked"] else "-"
        table.add_row(str(r["id"]), r["scope"], r["key"], str(r["failures"]), ago(r["last_failed_at"]), until)
    out.print(table)


@auth_app.command("unlock")
@friendly_errors
def unlock(
    lockout_id: Annotated[int, typer.Argument(metavar="ID", help="from `corral auth lockouts`")],
) -> None:
    """Lift a lockout and forget its failures (admin)."""
    with client() as c:
        c.request("DELETE", f"/auth/lockouts/{lockout_id}")
    out.print(f"lockout {lockout_id} lifted")


@auth_app.command("sessions")
@friendly_errors
def sessions(
    user: Annotated[str | None, typer.Option(help="admins: this user's sessions")] = None,
    all_users: Annotated[bool, typer.Option("--all", help="admins: everyone's sessions")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Unexpired portal sessions: yours, or (admins) a user's or everyone's."""
    params: dict[str, Any] = {"all": all_users}
    if user is not None:
        params["user"] = user
    with client() as c:
        rows: list[dict[str, Any]] = c.request("GET", "/sessions", params=params)
    if output is Output.json:
        print_json(rows)
        return
    table = Table("ID", "USER", "CREATED", "EXPIRES", box=None)
    for s in rows:
        table.add_row(s["id"], s["user"], when(s["created_at"]), when(s["expires_at"]))
    out.print(table)


@auth_app.command("end-session")
@friendly_errors
def end_session(
    session_id: Annotated[str, typer.Argument(metavar="ID", help="from `corral auth sessions`")],
) -> None:
    """Log a portal session out (yours; admins: anyone's)."""
    with client() as c:
        c.request("DELETE", f"/sessions/{session_id}")
    out.print(f"session {session_id} ended")


def register(app: typer.Typer) -> None:
    app.add_typer(auth_app, name="auth")
