"""The same monitoring SQL on a real PostgreSQL server: migration, /metrics, alert intake."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.config import Settings
from corral.db.session import downgrade, init_db, make_engine, make_session_factory
from corral.services import auth
from tests.monitor.conftest import WEBHOOK_TOKEN, Mon
from tests.monitor.synthetic import ClusterShape, seed_cluster
from tests.monitor.test_alert_visibility import assert_alert_visibility
from tests.monitor.test_metrics import one, scrape
from tests.monitor.test_webhook import payload
from tests.pg import PostgresServer, postgres_server

__all__ = ["postgres_server"]
pytestmark = pytest.mark.postgres


def test_metrics_and_webhook_on_postgres(
    postgres_server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_MONITOR_WEBHOOK_TOKEN", WEBHOOK_TOKEN)
    url = postgres_server.create_database("monitor_tests")
    init_db(url)
    engine = make_engine(url)
    try:
        factory = make_session_factory(engine)
        settings = Settings(home=tmp_path, database_url=url)
        with factory() as db:
            token = auth.bootstrap_admin(db, settings)
            seeded = seed_cluster(
                db, ClusterShape(nodes=3, gpus_per_node=4, jobs=12, gpus_per_job=2), time.time()
            )
        with TestClient(create_app(settings, db_engine=engine)) as client:
            m = scrape(client.get("/metrics").text)
            hook = client.post(
                "/api/v1/alerts/webhook", json=payload(), headers={"Authorization": f"Bearer {WEBHOOK_TOKEN}"}
            )
            listed = client.get("/api/v1/alerts", headers={"Authorization": f"Bearer {token}"}).json()
        assert len(m["corral_gpu_info"]) == 12
        assert sum(v for _, v in m["corral_gpu_allocated"]) == seeded["claimed"] > 0
        assert one(m, "corral_node_gpus", node="node0000") == 4
        assert sum(v for _, v in m["corral_queue_length"]) == seeded["queued"]
        assert hook.status_code == 200 and listed["total"] == 1
    finally:
        engine.dispose()
    downgrade(url, "0001_core")  # the monitoring migration goes down on PostgreSQL too


def test_alert_visibility_on_postgres(postgres_server: PostgresServer, tmp_path: Path) -> None:
    url = postgres_server.create_database("alert_visibility")
    init_db(url)
    engine = make_engine(url)
    try:
        factory = make_session_factory(engine)
        settings = Settings(home=tmp_path, database_url=url)
        with factory() as db:
            token = auth.bootstrap_admin(db, settings)
            assert token is not None
            shape = ClusterShape(nodes=1, gpus_per_node=4, jobs=4, groups=2, users=3, running_share=0.5)
            seeded = seed_cluster(db, shape, time.time())
        assert_alert_visibility(
            Mon(tmp_path, settings, engine, factory, {"Authorization": f"Bearer {token}"}, seeded)
        )
    finally:
        engine.dispose()
