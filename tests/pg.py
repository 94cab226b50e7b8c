"""A real PostgreSQL server for tests: initdb + pg_ctl in a temp dir, on a free port, stopped at
the end. PostgreSQL refuses to run as root, so as root it runs as `nobody` (via runuser).

Use the session fixture `postgres_server` (import it into a conftest.py) or `PostgresServer`
directly. Under CI=true a missing PostgreSQL fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import free_port, require

PG_BIN_DIRS = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")
SUPERUSER = "corral"


def find_pg_bin() -> Path | None:
    env = os.environ.get("CORRAL_PG_BIN")
    for candidate in ([env] if env else []) + list(PG_BIN_DIRS):
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresServer:
    """One throwaway cluster. `url(db)` gives a SQLAlchemy URL; `create_database()` a fresh DB."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="corral-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as_root = os.geteuid() == 0
        self.started = False
        self._migrated_template: str | None = None  # made by the first create_migrated_database()

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if self._as_root:
            cmd = ["runuser", "-u", "nobody", "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=60)

    def start(self) -> None:
        if self._as_root:
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, user="nobody")
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        result = self._run(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-o",
            options,
            "-w",
            "-t",
            "30",
            "start",
            check=False,
        )
        if result.returncode != 0:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {result.stderr}\n{log}")
        self.started = True

    def stop(self) -> None:
        if self.started:
            self._run(
                str(self.bin_dir / "pg_ctl"),
                "-D",
                str(self.data),
                "-m",
                "immediate",
                "-w",
                "stop",
                check=False,
            )
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _admin(self, statement: str) -> None:
        """Run one statement as the superuser on the `postgres` database (CREATE/DROP DATABASE
        cannot run in a transaction)."""
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(statement)

    def create_database(self, name: str | None = None, template: str | None = None) -> str:
        """Create an empty database (or a copy of `template`); returns its URL."""
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        self._admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def create_migrated_database(self, name: str | None = None) -> str:
        """Create a database with the newest schema; returns its URL. The first call migrates a
        template database with `init_db`; each database is then a copy of it (CREATE DATABASE ...
        TEMPLATE: a fraction of a second, where Alembic's migrations take seconds on a loaded
        machine). The migrations themselves run on empty databases in tests/api/test_migrations.py."""
        from corral.db.session import init_db

        if self._migrated_template is None:
            template = f"template_{uuid.uuid4().hex[:12]}"
            init_db(self.create_database(template))  # its engine is disposed: no connection left
            self._migrated_template = template
        return self.create_database(name, template=self._migrated_template)

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = find_pg_bin()
    require(bin_dir is not None, "PostgreSQL (initdb/pg_ctl)")
    assert bin_dir is not None
    server = PostgresServer(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def sqlite_or_postgres_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_file: str) -> Iterator[str]:
    """For a fixture parametrised ["sqlite", "postgres…"]: an empty database's URL, a SQLite
    file under `tmp_path` or a fresh PostgreSQL database dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / sqlite_file}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.create_database()
    yield url
    server.drop_database(url.rsplit("/", 1)[1])
