"""`corral admin backup` taken while a real server runs jobs, restored into a stopped installation
that then shows the same jobs; restore refused while a server runs; SQLite and PostgreSQL."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.ops.backup import BackupError, live_servers, restore
from corral.ops.backup import backup as backup_database
from tests.pg import PostgresServer
from tests.server_fixture import start_server, submit_spec, wait_state


@pytest.fixture(params=["sqlite", "postgres"])
def database_urls(request: pytest.FixtureRequest) -> Iterator[tuple[str | None, str | None]]:
    """(source, target) database URLs: None = SQLite under each server's home."""
    if request.param == "sqlite":
        yield None, None
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    source, target = server.create_database(), server.create_database()
    yield source, target
    for url in (source, target):
        server.drop_database(url.rsplit("/", 1)[1])


def corral_admin(home: Path, database_url: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    if database_url:
        env["CORRAL_DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "corral.cli.main", "admin", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def job_rows(c: httpx.Client) -> list[tuple[Any, ...]]:
    r = c.get("/api/v1/jobs", params={"limit": 100})
    assert r.status_code == 200, r.text
    body = r.json()
    items = body["items"] if isinstance(body, dict) else body
    return sorted((j["id"], j["name"], j["state"], j["attempt_count"]) for j in items)


def test_online_backup_restores_to_a_server_with_the_same_jobs(
    tmp_path: Path, database_urls: tuple[str | None, str | None]
) -> None:
    source_url, target_url = database_urls
    backup = tmp_path / "corral.backup"
    home = tmp_path / "a"
    with start_server(home, database_url=source_url) as srv, srv.client() as c:
        spec = {"name": "done", "tasks": {"main": {"command": "echo hi", "resources": {"gpus": 1}}}}
        finished = [submit_spec(c, spec) for _ in range(3)]
        for job_id in finished:
            wait_state(c, job_id, ("succeeded",))
        running = submit_spec(
            c, {"name": "long", "tasks": {"main": {"command": "sleep 60", "resources": {"gpus": 1}}}}
        )
        wait_state(c, running, ("running",))
        before = job_rows(c)

        taken = corral_admin(home, source_url, "backup", str(backup))
        assert taken.returncode == 0, taken.stderr
        assert stat.S_IMODE(backup.stat().st_mode) == 0o600  # holds password and token hashes

        database = source_url or f"sqlite:///{home / 'corral.db'}"
        with pytest.raises(BackupError, match="server is running against this database"):
            restore(database, backup)
        token = srv.token

    offline = backup_database(database, tmp_path / "offline.backup")  # a stopped server's too
    assert offline.stat().st_size > 0

    restored_home = tmp_path / "b"
    done = corral_admin(restored_home, target_url, "restore", str(backup))
    assert done.returncode == 0, done.stderr
    restored = target_url or f"sqlite:///{restored_home / 'corral.db'}"
    # The backed-up server's leases do not come back live, whenever the restore happens.
    assert live_servers(restored, now=0.0) == []
    with start_server(restored_home, database_url=target_url, token=token) as srv2, srv2.client() as c2:
        after = job_rows(c2)
        assert [r[:2] for r in after] == [r[:2] for r in before]
        assert [r for r in after if r[0] in finished] == [r for r in before if r[0] in finished]
        states = {row[0]: row[2] for row in after}
        assert all(states[j] == "succeeded" for j in finished)
        assert running in states  # and the job that was running when the backup was taken


def test_restore_rejects_files_that_are_not_backups(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.txt"
    bogus.write_text("not a database\n")
    result = corral_admin(tmp_path / "home", None, "restore", str(bogus))
    assert result.returncode == 1
    assert "is not a SQLite backup" in result.stderr
    missing = corral_admin(tmp_path / "home", None, "restore", str(tmp_path / "nope.db"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert not (tmp_path / "home" / "corral.db").exists()  # nothing half-done


def test_a_refused_restore_hides_the_database_password(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """`corral admin restore notes.txt` on PostgreSQL printed the URL with its password."""
    url = postgres_server.create_database().replace("corral@", "corral:hunter2@")  # trust: accepted
    bogus = tmp_path / "notes.txt"
    bogus.write_text("not a database\n")
    with pytest.raises(BackupError, match="is not a pg_dump custom-format backup") as refused:
        restore(url, bogus)
    assert "hunter2" not in str(refused.value) and "corral:***@" in str(refused.value)


def test_postgres_restore_replaces_everything_or_nothing(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    import sqlalchemy as sa

    from corral.db.session import init_db, make_engine

    url = postgres_server.create_database()
    try:
        init_db(url)
        engine = make_engine(url, poolclass=sa.pool.NullPool)
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO leases (name, owner, until) VALUES ('old', 'gone', 0)"))
        dump = backup_database(url, tmp_path / "pg.dump")
        with engine.begin() as conn:  # after the backup: a row and a table the dump lacks
            conn.execute(sa.text("INSERT INTO leases (name, owner, until) VALUES ('new', 'gone', 0)"))
            conn.execute(sa.text("CREATE TABLE added_later (id integer)"))

        broken = tmp_path / "broken.dump"
        broken.write_bytes(dump.read_bytes()[: len(dump.read_bytes()) // 2])
        with pytest.raises(BackupError):
            restore(url, broken)
        with engine.connect() as conn:  # a failed restore changed nothing
            names = set(conn.execute(sa.text("SELECT name FROM leases")).scalars())
            assert names == {"old", "new"}
            assert sa.inspect(conn).has_table("added_later")

        restore(url, dump)
        with engine.connect() as conn:
            assert set(conn.execute(sa.text("SELECT name FROM leases")).scalars()) == {"old"}
            assert not sa.inspect(conn).has_table("added_later")
            assert conn.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar() == 1
        engine.dispose()
    finally:
        postgres_server.drop_database(url.rsplit("/", 1)[1])
