"""API test fixtures: every test runs against SQLite AND a real PostgreSQL server.

Each backend's database is migrated once per session with Alembic (`init_db`); between tests all
rows are deleted, so tests stay independent and the whole suite stays fast.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.config import Settings
from corral.db.session import init_db, make_engine, make_session_factory
from corral.services import accounts, auth
from tests.pg import PostgresServer, postgres_server

__all__ = ["postgres_server"]


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def db_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[sa.Engine]:
    server: PostgresServer | None = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'corral.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = server.create_database("api_tests")
    init_db(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()
    if server is not None:  # it may be set up again in this session: its own database each time
        server.drop_database("api_tests")


def wipe(engine: sa.Engine) -> None:
    tables = [t for t in sa.inspect(engine).get_table_names() if t != "alembic_version"]
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            # DELETE with triggers off (the replica role: no foreign-key checks, and the audit
            # log's guard does not refuse): TRUNCATE made every table's files anew, 0.05-0.3 s a
            # test, where deleting the few rows a test leaves costs next to nothing.
            conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
            for table in tables:
                if table != "audit_purge_gate":
                    conn.execute(sa.text(f'DELETE FROM "{table}"'))
            # Ids restart at 1, as TRUNCATE's RESTART IDENTITY had them: each sequence drawn from.
            drawn = conn.execute(
                sa.text("SELECT schemaname, sequencename FROM pg_sequences WHERE last_value IS NOT NULL")
            ).all()
            for schema, name in drawn:
                conn.execute(sa.text("SELECT setval(:seq, 1, false)"), {"seq": f'"{schema}"."{name}"'})
        return
    with engine.connect() as conn:
        # SQLite changes foreign_keys outside a transaction only (inside one the PRAGMA does
        # nothing): turned ON inside the deletes' transaction, it stayed OFF on this pooled
        # connection, and later requests on it deleted no rows by ON DELETE CASCADE (a deleted
        # dataset's versions stayed, and a new dataset given its id collided with them).
        conn.execute(sa.text("PRAGMA foreign_keys=OFF"))
        # The audit log refuses deletes unless its purge gate is open (corral.db.audit_models):
        # open it for this transaction, keep the gate's row, close it again.
        conn.execute(sa.text("UPDATE audit_purge_gate SET cutoff = 9e999"))
        for table in tables:
            if table != "audit_purge_gate":
                conn.execute(sa.text(f'DELETE FROM "{table}"'))
        conn.execute(sa.text("UPDATE audit_purge_gate SET cutoff = NULL"))
        # AUTOINCREMENT tables (jobs) go on from their highest id ever: start again at 1, as
        # PostgreSQL's RESTART IDENTITY above does
        if sa.inspect(conn).has_table("sqlite_sequence"):
            conn.execute(sa.text("DELETE FROM sqlite_sequence"))
        conn.commit()
        conn.execute(sa.text("PRAGMA foreign_keys=ON"))
        assert conn.execute(sa.text("PRAGMA foreign_keys")).scalar() == 1
        conn.commit()


ALICE_PASSWORD = "alice-password"


@functools.cache
def alice_password_hash() -> str:
    return auth.hash_password(ALICE_PASSWORD)


@dataclass
class World:
    """A small organisation: groups vision and nlp; alice (vision member), bob (vision group
    admin), carol (nlp member), the admin. `headers[name]` authenticates as that user."""

    client: TestClient
    session_factory: sa.orm.sessionmaker[sa.orm.Session]
    headers: dict[str, dict[str, str]] = field(default_factory=dict)

    def as_(self, name: str) -> dict[str, str]:
        return self.headers[name]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", database_url="sqlite:///unused")


@pytest.fixture
def world(db_engine: sa.Engine, settings: Settings) -> Iterator[World]:
    wipe(db_engine)
    factory = make_session_factory(db_engine)
    headers: dict[str, dict[str, str]] = {}
    with factory() as db:
        admin_token = auth.bootstrap_admin(db, settings)
        assert admin_token is not None
        headers["admin"] = {"Authorization": f"Bearer {admin_token}"}
        vision = accounts.create_group(db, "vision")
        nlp = accounts.create_group(db, "nlp")
        users = {
            "alice": accounts.NewUser("alice", groups=("vision",)),
            "bob": accounts.NewUser("bob", groups=("vision",)),
            "carol": accounts.NewUser("carol", groups=("nlp",)),
        }
        for name, new in users.items():
            user = accounts.create_user(db, new)
            # argon2 is slow on purpose: hash alice's password once per session, not per test.
            user.password_hash = alice_password_hash() if name == "alice" else None
            _row, secret = auth.create_token(db, user, "test")
            headers[name] = {"Authorization": f"Bearer {secret}"}
        accounts.add_member(db, vision, accounts.user_by_name(db, "bob"), "admin")
        del nlp
        db.commit()
    app = create_app(settings, db_engine=db_engine)
    with TestClient(app) as client:
        yield World(client=client, session_factory=factory, headers=headers)


SIMPLE_JOB = {"name": "hello", "command": "echo hello", "resources": {"cpus": 1, "memory": "256MiB"}}
