"""Online backup and offline restore of Corral's database.

SQLite: the backup is taken with SQLite's online backup API (`sqlite3.Connection.backup`), which
copies a consistent snapshot page by page while the server keeps writing (WAL mode: readers never
block the writer). The result is a plain SQLite file. Restore copies it back with the same API,
into the live file, so the WAL and shared-memory files stay consistent.

PostgreSQL: `pg_dump --format=custom` (a consistent snapshot of one transaction, taken online);
restore replays the dump with psql in one transaction after emptying the public schema, so
a failed restore changes nothing. The password travels in PGPASSWORD, never on the command line.

A restore is refused while a server runs against the database. Detection: every running server
renews its loops' rows in the `leases` table every few seconds (`until` = now + 5 s) and a clean
stop sets `until` to 0, so a lease whose `until` lies in the future means a live server. A server
killed with SIGKILL holds its leases at most LOOP_LEASE_TTL_S longer: wait that long and retry.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from corral.db.session import is_sqlite, make_engine, normalize_url

PG_BIN_DIRS = ("/usr/lib/postgresql",)
SQLITE_MAGIC = b"SQLite format 3\x00"
PGDUMP_MAGIC = b"PGDMP"


class BackupError(RuntimeError):
    """A backup or restore that cannot be done; the message says why and what to do."""


@dataclass(frozen=True)
class LiveServer:
    lease: str
    owner: str
    until: float


def sqlite_path(url: str) -> Path:
    database = make_url(normalize_url(url)).database
    if not database or database == ":memory:":
        raise BackupError(f"not a SQLite file database: {url}")
    return Path(database).expanduser()


def live_servers(url: str, now: float | None = None) -> list[LiveServer]:
    """Servers that hold an unexpired loop lease on the database at `url` (empty: none running).
    A database without the leases table (empty, or never migrated) has no server."""
    if is_sqlite(url) and not sqlite_path(url).exists():
        return []
    now = time.time() if now is None else now
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("leases"):
                return []
            rows = conn.execute(
                sa.text("SELECT name, owner, until FROM leases WHERE until > :now ORDER BY name"),
                {"now": now},
            ).all()
    finally:
        engine.dispose()
    return [LiveServer(lease=r[0], owner=r[1], until=float(r[2])) for r in rows]


def backup(url: str, dest: Path) -> Path:
    """Write a consistent copy of the database at `url` to `dest` (mode 0600), online."""
    dest = dest.expanduser()
    if dest.is_dir():
        raise BackupError(f"{dest} is a directory: give the backup's file name")
    if not dest.parent.is_dir():
        raise BackupError(f"directory {dest.parent} does not exist")
    partial = dest.with_name(dest.name + ".partial")
    # 0600 from the start: the dump holds password hashes and token hashes.
    partial.unlink(missing_ok=True)
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        if is_sqlite(url):
            _sqlite_backup(sqlite_path(url), partial)
        else:
            _pg_dump(url, partial)
        os.replace(partial, dest)  # never a half-written file under the final name
    finally:
        partial.unlink(missing_ok=True)
    return dest


def restore(url: str, source: Path) -> None:
    """Replace the database at `url` with the backup `source`. Refused while a server runs."""
    source = source.expanduser()
    if not source.is_file():
        raise BackupError(f"backup file {source} does not exist")
    live = live_servers(url)
    if live:
        owners = ", ".join(sorted({s.owner for s in live}))
        raise BackupError(
            f"a Corral server is running against this database (live leases held by {owners}); "
            "stop it first (systemctl stop corral), then restore"
        )
    with source.open("rb") as fh:
        head = fh.read(16)
    shown = make_url(url).render_as_string(hide_password=True)  # an error must not print it
    if is_sqlite(url):
        if not head.startswith(SQLITE_MAGIC):
            raise BackupError(f"{source} is not a SQLite backup (the database at {shown} is SQLite)")
        _sqlite_restore(source, sqlite_path(url))
    else:
        if not head.startswith(PGDUMP_MAGIC):
            raise BackupError(
                f"{source} is not a pg_dump custom-format backup (the database at {shown} is PostgreSQL)"
            )
        _pg_restore(url, source)
    release_leases(url)


def release_leases(url: str) -> None:
    """Expire the leases the backed-up server held when the backup was taken: no server runs on
    this database now (checked above), and a live-looking lease would make the next server wait
    for it and `restore` refuse for a few seconds."""
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            if sa.inspect(conn).has_table("leases"):
                conn.execute(sa.text("UPDATE leases SET until = 0"))
            if sa.inspect(conn).has_table("jobs"):
                conn.execute(
                    sa.text(
                        "UPDATE jobs SET lease_owner = NULL, lease_until = NULL WHERE lease_owner IS NOT NULL"
                    )
                )
    finally:
        engine.dispose()


def _sqlite_backup(src: Path, dest: Path) -> None:
    if not src.exists():
        raise BackupError(f"SQLite database {src} does not exist")
    source = sqlite3.connect(src, timeout=30)
    target = sqlite3.connect(dest)
    try:
        # One step: the copy reads one snapshot under a single read transaction, which in WAL
        # mode never blocks the server's writers. (Copying in several steps would restart
        # whenever the server committed in between, and might never finish on a busy server.)
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
    except sqlite3.Error as exc:
        raise BackupError(f"SQLite backup of {src} failed: {exc}") from exc
    finally:
        target.close()
        source.close()


def _sqlite_restore(source: Path, dest: Path) -> None:
    check = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        result = check.execute("PRAGMA integrity_check").fetchone()
        tables = {r[0] for r in check.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"{source} is not a readable SQLite database: {exc}") from exc
    finally:
        check.close()
    if result is None or result[0] != "ok":
        raise BackupError(f"{source} fails SQLite's integrity check: {result}")
    if "alembic_version" not in tables:
        raise BackupError(f"{source} is not a Corral database (no alembic_version table)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists():
        os.close(os.open(dest, os.O_WRONLY | os.O_CREAT, 0o600))
    src_conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst_conn = sqlite3.connect(dest, timeout=30)
    try:
        src_conn.backup(dst_conn)
    finally:
        dst_conn.close()
        src_conn.close()


def pg_tool(name: str) -> str:
    """`pg_dump`/`pg_restore`: CORRAL_PG_BIN, else PATH, else the newest /usr/lib/postgresql/N/bin."""
    env_dir = os.environ.get("CORRAL_PG_BIN")
    if env_dir and (Path(env_dir) / name).exists():
        return str(Path(env_dir) / name)
    found = shutil.which(name)
    if found:
        return found
    for root in PG_BIN_DIRS:
        candidates = sorted(Path(root).glob(f"*/bin/{name}"), key=lambda p: p.parent.parent.name)
        if candidates:
            return str(candidates[-1])
    raise BackupError(f"{name} not found: apt-get install postgresql-client (or set CORRAL_PG_BIN)")


def _pg_args(url: str) -> tuple[list[str], dict[str, str]]:
    """libpq connection options and environment for `url` (the password only in PGPASSWORD)."""
    parsed: URL = make_url(normalize_url(url))
    args = ["--dbname", str(parsed.database or "postgres")]
    if parsed.host:
        args += ["--host", parsed.host]
    if parsed.port:
        args += ["--port", str(parsed.port)]
    if parsed.username:
        args += ["--username", parsed.username]
    env = dict(os.environ)
    if parsed.password is not None:
        env["PGPASSWORD"] = str(parsed.password)
    return args, env


def _run_pg(argv: list[str], env: dict[str, str], what: str) -> None:
    result = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=3600, stdin=subprocess.DEVNULL
    )
    if result.returncode != 0:
        raise BackupError(f"{what} (exit {result.returncode}) {result.stderr.strip()}")


def _pg_dump(url: str, dest: Path) -> None:
    args, env = _pg_args(url)
    _run_pg(
        [pg_tool("pg_dump"), "--format=custom", "--no-password", "--file", str(dest), *args],
        env,
        "pg_dump failed:",
    )


def _pg_restore(url: str, source: Path) -> None:
    """Replay the dump with psql in one transaction that first empties the public schema: tables
    a newer schema added (absent from the dump) must go too, or the next `upgrade` would trip over
    them. The dump is first converted to SQL in full: pg_restore reading a truncated or corrupt
    file prints part of it before failing, and psql would commit that part (test_backup.py)."""
    args, env = _pg_args(url)
    with tempfile.TemporaryDirectory(prefix="corral-restore-") as scratch:  # 0700: password hashes
        sql = Path(scratch) / "restore.sql"
        _run_pg(
            [
                pg_tool("pg_restore"),
                "--no-owner",
                "--no-privileges",
                "--exit-on-error",
                "--file",
                str(sql),
                str(source),
            ],
            env,
            f"pg_restore could not read {source}; nothing changed:",
        )
        _run_pg(
            [
                pg_tool("psql"),
                "--no-password",
                "--quiet",
                "--single-transaction",
                "--set",
                "ON_ERROR_STOP=1",
                "--command",
                "DROP SCHEMA IF EXISTS public CASCADE",
                "--command",
                "CREATE SCHEMA public",
                "--file",
                str(sql),
                *args,
            ],
            env,
            "restore into the database failed; nothing changed:",
        )
