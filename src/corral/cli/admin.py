"""Host-side admin commands: `corral admin backup|restore|migrate` and `corral doctor`.

Unlike the API commands these act on the database and the machine directly, with the server's own
settings (CORRAL_* variables, CORRAL_*_FILE secrets), so run them as the server's Unix user with
its environment (e.g. `sudo -u corral env $(cat /etc/corral/corral.env) corral admin backup ...`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.cli.common import Output, OutputOpt, error_line
from corral.config import settings_error
from corral.words import plural

if TYPE_CHECKING:
    from corral.config import Settings

admin_app = typer.Typer(
    help="Database backup, restore and migration (run on the server host).", no_args_is_help=True
)
out = Console(markup=False)  # paths and checks' details as they are (see corral.cli.common)

DatabaseOpt = Annotated[
    str | None,
    typer.Option("--database-url", help="default: CORRAL_DATABASE_URL, else SQLite under $CORRAL_HOME"),
]


def _settings() -> Settings:
    """The server's settings; a bad one (e.g. an unreadable CORRAL_*_FILE) is one line, exit 2."""
    from corral.config import Settings

    try:
        return Settings()
    except ValueError as exc:
        error_line(settings_error(exc))
        raise typer.Exit(2) from None


def _database_url(database_url: str | None) -> str:
    return database_url or _settings().db_url


def _fail(message: str) -> None:
    error_line(message)
    raise typer.Exit(1)


@admin_app.command("backup")
def backup(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="where to write the backup")],
    database_url: DatabaseOpt = None,
) -> None:
    """Back the database up while the server runs (SQLite backup API, or pg_dump)."""
    from corral.ops.backup import BackupError
    from corral.ops.backup import backup as take_backup

    try:
        written = take_backup(_database_url(database_url), file)
    except BackupError as exc:
        _fail(str(exc))
    out.print(f"backup written to {written} ({plural(written.stat().st_size, 'byte')})")


@admin_app.command("restore")
def restore(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="a file written by `corral admin backup`")],
    database_url: DatabaseOpt = None,
) -> None:
    """Replace the database with a backup. The server must be stopped (refused otherwise)."""
    from corral.ops.backup import BackupError
    from corral.ops.backup import restore as do_restore

    try:
        do_restore(_database_url(database_url), file)
    except BackupError as exc:
        _fail(str(exc))
    out.print(f"restored from {file}; start the server (it upgrades an older schema on start)")


@admin_app.command("migrate")
def migrate(database_url: DatabaseOpt = None) -> None:
    """Bring the database schema to the newest revision (the server also does this on start)."""
    from corral.db.session import DatabaseUnavailable, check_database, init_db
    from corral.ops.files import secure_sqlite_file

    url = _database_url(database_url)
    try:
        check_database(url)
    except DatabaseUnavailable as exc:
        _fail(str(exc))
    secure_sqlite_file(url)
    init_db(url)
    out.print("database schema is up to date")


def doctor(output: OutputOpt = Output.table) -> None:
    """Check this host for what a Corral server needs; print each missing piece and its fix."""
    from corral.ops.doctor import run_checks

    checks = run_checks(_settings())
    if output == Output.json:
        sys.stdout.write(json.dumps([c.as_dict() for c in checks], indent=2) + "\n")
    else:
        table = Table("CHECK", "STATUS", "DETAIL", "FIX")
        for column in table.columns[2:]:  # paths, URLs, file:line: break them, never cut them
            column.overflow = "fold"
        colour = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}
        for c in checks:
            table.add_row(c.name, Text(c.status, style=colour[c.status]), c.detail, c.fix or "")
        out.print(table)
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(admin_app, name="admin")
    app.command()(doctor)
