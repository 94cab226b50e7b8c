"""Job notification fixtures: a migrated SQLite database, the real app (create_app) with the
loopback allowed for webhooks (CORRAL_WEBHOOK_ALLOW_NETWORKS), alice and bob in group vision
(alice with an email address; bob, the group's admin, without), a real SMTP server (aiosmtpd) and a real HTTP
server receiving webhooks (tests.oncall.conftest's)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from corral.api.app import create_app
from corral.config import Settings
from corral.db.session import init_db, make_engine, make_session_factory
from corral.services import accounts, auth
from tests.oncall.conftest import hook, postgres_server, smtp
from tests.support import copy_migrated_sqlite

__all__ = ["hook", "postgres_server", "smtp"]  # the fixtures, for this directory's tests
LOOPBACK = "127.0.0.0/8"


@dataclass
class Team:
    settings: Settings
    url: str
    engine: sa.Engine
    factory: sessionmaker[Session]
    client: TestClient
    headers: dict[str, dict[str, str]]  # name -> auth header

    def post(self, path: str, body: dict[str, Any], as_user: str = "alice") -> Any:
        return self.client.post(f"/api/v1{path}", json=body, headers=self.headers[as_user])

    def get(self, path: str, as_user: str = "alice") -> Any:
        response = self.client.get(f"/api/v1{path}", headers=self.headers[as_user])
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture
def team(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Team]:
    """SQLite, or PostgreSQL for a test parametrized `@pytest.mark.parametrize("team", ["sqlite",
    "postgres"], indirect=True)`."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CORRAL_PUBLIC_URL", "http://corral.test")
    if getattr(request, "param", "sqlite") == "postgres":
        url = request.getfixturevalue("postgres_server").create_migrated_database()
    else:
        url = copy_migrated_sqlite(home / "corral.db")  # a copy: no migrations per test (tests/support.py)
    init_db(url)
    engine = make_engine(url)
    factory = make_session_factory(engine)
    settings = Settings(home=home, database_url=url, webhook_allow_networks=LOOPBACK)
    headers: dict[str, dict[str, str]] = {}
    with factory() as db:
        token = auth.bootstrap_admin(db, settings)
        assert token is not None
        headers["admin"] = {"Authorization": f"Bearer {token}"}
        vision = accounts.create_group(db, "vision")
        for name in ("alice", "bob"):
            user = accounts.create_user(db, accounts.NewUser(name, groups=("vision",)))
            user.email = "alice@example.org" if name == "alice" else None
            user.created_at = time.time()
            _, secret = auth.create_token(db, user, "test")
            headers[name] = {"Authorization": f"Bearer {secret}"}
        accounts.add_member(db, vision, accounts.user_by_name(db, "bob"), "admin")  # sees alice's jobs
        db.commit()
    client = TestClient(create_app(settings, db_engine=engine))
    yield Team(settings, url, engine, factory, client, headers)
    client.close()
    engine.dispose()
