"""Monitoring test fixtures: a migrated SQLite database in a temp CORRAL_HOME, the real FastAPI
app (create_app) with the metrics middleware, an admin token and a small synthetic cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from corral.api.app import create_app
from corral.config import Settings
from corral.db.session import init_db, make_engine, make_session_factory
from corral.monitor.middleware import install
from corral.services import auth
from tests.monitor.synthetic import ClusterShape, seed_cluster
from tests.support import copy_migrated_sqlite

WEBHOOK_TOKEN = "test-webhook-secret"


@dataclass
class Mon:
    home: Path
    settings: Settings
    engine: sa.Engine
    factory: sessionmaker[Session]
    admin: dict[str, str]
    seeded: dict[str, int]

    def app_client(self) -> TestClient:
        app = create_app(self.settings, db_engine=self.engine)
        install(app)
        return TestClient(app)


@pytest.fixture
def mon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mon]:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CORRAL_MONITOR_WEBHOOK_TOKEN", WEBHOOK_TOKEN)
    monkeypatch.delenv("CORRAL_MONITOR_CONFIG_FILE", raising=False)
    url = copy_migrated_sqlite(home / "corral.db")  # a copy: no migrations per test (tests/support.py)
    init_db(url)
    engine = make_engine(url)
    factory = make_session_factory(engine)
    settings = Settings(home=home, database_url=url)
    with factory() as db:
        token = auth.bootstrap_admin(db, settings)
        assert token is not None
        shape = ClusterShape(
            nodes=2,
            gpus_per_node=4,
            jobs=10,
            groups=2,
            users=3,
            running_share=0.2,
            queued_share=0.3,
            gpus_per_job=2,
        )
        seeded = seed_cluster(db, shape, time.time())
    yield Mon(home, settings, engine, factory, {"Authorization": f"Bearer {token}"}, seeded)
    engine.dispose()
