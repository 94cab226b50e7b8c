"""Account commands: `corral user ...` (admin, default groups, passwords) and `corral token ...`."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import (
    Output,
    OutputOpt,
    ago,
    client,
    err,
    error_line,
    friendly_errors,
    out,
    print_json,
    when,
)
from corral.sdk import CorralError

user_app = typer.Typer(help="Users (admin), default groups and passwords.", no_args_is_help=True)


@user_app.command("ls")
@friendly_errors
def user_ls(output: OutputOpt = Output.table) -> None:
    """List users (admin)."""
    with client() as c:
        users = c.users()
    if output is Output.json:
        print_json(users)
        return
    table = Table("USER", "ROLE", "DEFAULT GROUP", "GROUPS", box=None)
    for u in users:
        groups = ", ".join(g["name"] + (" (admin)" if g["role"] == "admin" else "") for g in u["groups"])
        role = u["role"] if u.get("active", True) else f"{u['role']} (deactivated)"
        table.add_row(u["name"], role, u["default_group"] or "-", groups or "-")
    out.print(table)


@user_app.command("create")
@friendly_errors
def user_create(
    name: str,
    group: Annotated[
        list[str] | None, typer.Option("--group", "-g", help="repeat for several groups")
    ] = None,
    default_group: Annotated[str | None, typer.Option(help="default: the first --group")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="make the user an administrator")] = False,
    password: Annotated[
        str | None, typer.Option(help="for the web portal; omit for token-only users")
    ] = None,
    token: Annotated[bool, typer.Option("--token", help="also create an API token and print it")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Create a user (admin)."""
    with client() as c:
        user = c.create_user(
            name, password=password, is_admin=admin, groups=group or [], default_group=default_group
        )
        secret = c.create_token("cli", user=name)["token"] if token else None
    if output is Output.json:
        print_json({**user, "token": secret} if token else user)
        return
    out.print(f"user {name} created")
    if secret:
        out.print(f"API token (shown once): {secret}")


@user_app.command("add-to-group")
@friendly_errors
def user_add_to_group(
    name: str,
    group: str,
    group_admin: Annotated[bool, typer.Option("--admin", help="as an admin of the group")] = False,
    member: Annotated[
        bool, typer.Option("--member", help="as a plain member (demotes a group admin)")
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Add user NAME to GROUP, or set their role there (admin, or an admin of GROUP). Without
    --admin or --member a new member joins as member and an existing one keeps their role; says so
    when nothing changed. An admin of GROUP may add any user without asking them: the group's
    mounts, secrets and shared data become theirs to use (docs/security.md)."""
    if group_admin and member:
        error_line("give --admin or --member, not both")
        raise typer.Exit(2)
    role = "admin" if group_admin else "member" if member else None
    with client() as c:
        added = c.add_member(group, name, role)
    if output is Output.json:
        print_json(added)
    elif added.get("changed", True):
        out.print(f"{name} is now {added['role']} of {group}")
    elif role is None:
        other = "--member" if added["role"] == "admin" else "--admin"
        out.print(f"{name} is already {added['role']} of {group} (role kept; {other} changes it)")
    else:
        out.print(f"{name} is already {added['role']} of {group}")


CancelJobsOpt = Annotated[
    bool, typer.Option("--cancel-jobs", help="cancel the user's live jobs first (else refused while any run)")
]


@user_app.command("remove-from-group")
@friendly_errors
def user_remove_from_group(name: str, group: str, cancel_jobs: CancelJobsOpt = False) -> None:
    """Take user NAME out of GROUP (admin, or an admin of GROUP)."""
    with client() as c:
        c.remove_member(group, name, cancel_jobs=cancel_jobs)
    out.print(f"{name} is no longer a member of {group}")


@user_app.command("deactivate")
@friendly_errors
def user_deactivate(name: str, cancel_jobs: CancelJobsOpt = False, output: OutputOpt = Output.table) -> None:
    """Deactivate user NAME (admin): no login, token or SSH key works, open sessions end."""
    with client() as c:
        user = c.deactivate_user(name, cancel_jobs=cancel_jobs)
    _say_active(user, name, "deactivated", output)


@user_app.command("activate")
@friendly_errors
def user_activate(name: str, output: OutputOpt = Output.table) -> None:
    """Reactivate user NAME (admin): their tokens and SSH keys work again."""
    with client() as c:
        user = c.activate_user(name)
    _say_active(user, name, "activated", output)


def _say_active(user: dict[str, Any], name: str, done: str, output: Output) -> None:
    """What (de)activating did: "user bob activated", or "user bob is already active"."""
    if output is Output.json:
        print_json(user)
    elif user.get("changed", True):
        out.print(f"user {name} {done}")
    else:
        out.print(f"user {name} is already {'active' if user['active'] else 'deactivated'}")


@user_app.command("default-group")
@friendly_errors
def user_default_group(name: str, group: str, output: OutputOpt = Output.table) -> None:
    """Set the group USER's jobs go to when their spec names none (admin, or yourself)."""
    with client() as c:
        user = c.set_default_group(name, group)
    print_json(user) if output is Output.json else out.print(f"{name}'s default group is now {group}")


@user_app.command("passwd")
@friendly_errors
def user_passwd(
    name: Annotated[str | None, typer.Argument(metavar="[USER]", help="default: yourself")] = None,
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="read the new password from the first line of stdin (and your current one, when "
            "changing your own as a non-admin, from the second)",
        ),
    ] = False,
) -> None:
    """Set the portal password of USER (admin) or your own."""
    with client() as c:
        me = c.me()
        target = name or me["name"]
        needs_current = target == me["name"] and me["role"] != "admin"
        if password_stdin:
            lines = sys.stdin.read().splitlines()
            password = lines[0] if lines else ""
            current = lines[1] if needs_current and len(lines) > 1 else None
        else:
            current = (
                typer.prompt("Current password (empty if you have none)", hide_input=True, default="")
                if needs_current
                else None
            )
            password = typer.prompt(f"New password for {target}", hide_input=True, confirmation_prompt=True)
        if not password:
            raise CorralError("the new password is empty")
        c.set_password(target, password, current_password=current or None)
    out.print(f"password of {target} set")


token_app = typer.Typer(help="Your API tokens.", no_args_is_help=True)


@token_app.command("create")
@friendly_errors
def token_create(
    name: Annotated[str, typer.Option(help="a label to recognise it")] = "cli",
    user: Annotated[str | None, typer.Option(help="admins: for another user")] = None,
    expires_in_days: Annotated[
        float | None,
        typer.Option(
            help="default: the server's (CORRAL_TOKEN_DEFAULT_LIFETIME_DAYS); never past your token's expiry"
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Create an API token; the secret is printed once.

    Made with a token that expires, it expires no later than that token; the portal's Profile
    page makes longer ones."""
    with client() as c:
        token = c.create_token(name, user=user, expires_in_days=expires_in_days)
    if output is Output.json:
        print_json(token)
        return
    out.print(token["token"])  # alone on stdout, for scripts; the rest on stderr
    err.print(f"token {token['id']} ({token['name']}) expires {expires(token['expires_at'])}")
    if token.get("note"):
        err.print(token["note"])


@token_app.command("ls")
@friendly_errors
def token_ls(
    user: Annotated[str | None, typer.Option("--user", "-u", help="admins: this user's tokens")] = None,
    all_users: Annotated[bool, typer.Option("--all", help="admins: everyone's tokens")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """List your API tokens (prefixes only); admins: another user's (--user) or everyone's (--all),
    to revoke one by its id."""
    with client() as c:
        tokens = c.tokens(user=user, all_users=all_users)
    if output is Output.json:
        print_json(tokens)
        return
    table = Table("ID", "USER", "NAME", "PREFIX", "CREATED", "LAST USED", "EXPIRES", "REVOKED", box=None)
    for t in tokens:
        table.add_row(
            str(t["id"]),
            t["user"],
            t["name"],
            t["prefix"],
            when(t["created_at"]),
            ago(t["last_used_at"]),
            expires(t["expires_at"]),
            "yes" if t["revoked_at"] else "",
        )
    out.print(table)


def expires(at: float | None) -> str:
    """When a token stops working: never (the bootstrap admin's), a time, or that it has."""
    if at is None:
        return "never"
    return when(at) if at > time.time() else f"expired {when(at)}"


@token_app.command("revoke")
@friendly_errors
def token_revoke(
    token_id: Annotated[int, typer.Argument(metavar="ID", help="see `corral token ls`")],
) -> None:
    """Revoke one of your API tokens (admins: anyone's) by its id; it stops working at once."""
    with client() as c:
        c.revoke_token(token_id)
    out.print(f"token {token_id} revoked")


def register(app: typer.Typer) -> None:
    """Add `corral user` and `corral token` to the root `corral` app."""
    app.add_typer(user_app, name="user")
    app.add_typer(token_app, name="token")
