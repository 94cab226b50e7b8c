"""Alembic migrations up and down on SQLite and PostgreSQL, and models == migrations."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.orm import Session

from corral.db import audit_models, models
from corral.db.base import Base
from corral.db.session import downgrade, init_db, make_engine
from corral.server.eta_record import calibration_of, note_started
from corral.services import incidents
from corral.services.auth import Principal
from corral.services.jobs import JobFilter, list_jobs
from tests.pg import PostgresServer, postgres_server, sqlite_or_postgres_url
from tests.server.fakes import FakeEngine, add_job, make_context, seed_tenant

CORE_TABLES = {
    t.name
    for t in Base.metadata.sorted_tables
    if t.name
    in {
        m.__tablename__
        for module in (models, audit_models)
        for m in vars(module).values()
        if isinstance(m, type) and hasattr(m, "__tablename__")
    }
}

__all__ = ["postgres_server"]  # the fixture


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sqlite_or_postgres_url(request, tmp_path, "mig.db")


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(fresh_url: str) -> None:
    assert {"jobs", "attempts", "users", "groups", "gpu_claims", "nodes"} <= CORE_TABLES
    init_db(fresh_url)
    assert tables(fresh_url) >= CORE_TABLES
    init_db(fresh_url)  # idempotent
    downgrade(fresh_url, "base")
    assert tables(fresh_url) == set()
    init_db(fresh_url)
    assert tables(fresh_url) >= CORE_TABLES


def test_core_models_match_the_migrations(fresh_url: str) -> None:
    init_db(fresh_url)
    engine = make_engine(fresh_url)
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()

    def table_of(diff: object) -> str | None:
        item = diff[0] if isinstance(diff, list) else diff
        for part in item[1:] if isinstance(item, tuple) else ():
            name = getattr(part, "name", None) if not isinstance(part, str) else None
            table = getattr(part, "table", None)
            if table is not None:
                return str(table.name)
            if hasattr(part, "columns") and name:
                return str(name)
        return None

    core = [d for d in diffs if table_of(d) in CORE_TABLES or table_of(d) is None]
    assert core == [], f"models and migrations differ: {core}"


def test_the_job_list_sorted_by_updated_at_walks_its_index(tmp_path: Path) -> None:
    """`corral ls --sort updated_at` (GET /jobs?sort=updated_at) ordered by a column no index
    held: an admin's page scanned every job and sorted them all ("USE TEMP B-TREE FOR ORDER BY")
    to return 50. Migration 0027's ix_jobs_updated serves it in order, stopping at the page."""
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    init_db(url)
    engine = make_engine(url)
    statements: list[tuple[str, object]] = []

    def seen(conn: object, cursor: object, sql: str, params: object, context: object, many: bool) -> None:
        if sql.lstrip().startswith("SELECT jobs.id") and "ORDER BY" in sql:
            statements.append((sql, params))

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        with Session(engine) as db:
            admin = Principal(user_id=1, name="admin", is_admin=True, default_group_id=None)
            for order in ("desc", "asc"):
                list_jobs(db, admin, JobFilter(sort="updated_at", order=order))
        assert len(statements) == 2, statements
        with engine.connect() as conn:
            for sql, params in statements:
                plan = " | ".join(r[3] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params))
                assert "INDEX ix_jobs_updated" in plan and "TEMP B-TREE" not in plan, plan
    finally:
        engine.dispose()


def test_the_flapping_pass_reads_only_its_partial_index(tmp_path: Path) -> None:
    """The incidents loop looks for flapping incidents every 5 s: migration 0031's partial
    ix_incidents_flapping (only rows with flapping_since set, by key) serves it, in the key order
    it locks them in, instead of a scan of every incident ever opened."""
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    init_db(url)
    engine = make_engine(url)
    statements: list[tuple[str, object]] = []

    def seen(conn: object, cursor: object, sql: str, params: object, context: object, many: bool) -> None:
        if sql.lstrip().startswith("SELECT incidents.id") and "flapping_since IS NOT NULL" in sql:
            statements.append((sql, params))

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        with Session(engine) as db:
            assert incidents.end_quiet_flapping(db, time.time()) == []
        assert len(statements) == 1, statements
        with engine.connect() as conn:
            sql, params = statements[0]
            plan = " | ".join(r[3] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params))
            assert "INDEX ix_incidents_flapping" in plan and "TEMP B-TREE" not in plan, plan
    finally:
        engine.dispose()


def test_the_eta_outcome_reads_walk_the_first_attempts_by_start(tmp_path: Path) -> None:
    """The ETA calibration's outcomes are the jobs' first attempts' starts: a rebuild reads the
    last ones started, the schedule loop those started since it last looked, and the latest start.
    Migration 0034's ix_attempts_number_started (number, started_at) serves all three as an index
    range, in order, instead of a scan and a sort of every attempt."""
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    init_db(url)
    engine = make_engine(url)
    statements: list[tuple[str, object]] = []

    def seen(conn: object, cursor: object, sql: str, params: object, context: object, many: bool) -> None:
        if sql.lstrip().startswith("SELECT") and "attempts.started_at" in sql:
            statements.append((sql, params))

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        ctx = make_context(engine, FakeEngine(), str(tmp_path))
        with Session(engine) as db:
            gid, uid = seed_tenant(db)
            job_id = add_job(db, gid, uid, gpus=1)
            db.add(models.Attempt(job_id=job_id, number=1, state="running", created_at=1.0, started_at=5.0))
            db.commit()
            now = time.time()
            calibration_of(
                ctx, db, now
            )  # the rebuild: the latest start, its window's count, the last outcomes
            note_started(ctx, db, now)  # nothing new: the window's latest start and count alone
            second = add_job(db, gid, uid, gpus=1)
            db.add(models.Attempt(job_id=second, number=1, state="running", created_at=6.0, started_at=7.0))
            db.commit()
            note_started(ctx, db, now)  # the window moved: its count from the new latest, the outcomes since
        assert len(statements) == 3 + 1 + 3, statements
        with engine.connect() as conn:
            for sql, params in statements:
                plan = " | ".join(r[3] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params))
                assert "INDEX ix_attempts_number_started" in plan and "TEMP B-TREE" not in plan, plan
    finally:
        engine.dispose()


def test_the_label_filter_reads_the_label_index(tmp_path: Path) -> None:
    """GET /jobs?label=experiment=e1 (an AutoML tool's trials): each label is one lookup on
    migration 0036's ix_job_labels_key_value (key, value, job_id), never a scan of every label."""
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    init_db(url)
    engine = make_engine(url)
    statements: list[tuple[str, object]] = []

    def seen(conn: object, cursor: object, sql: str, params: object, context: object, many: bool) -> None:
        if sql.lstrip().startswith("SELECT") and "job_labels" in sql:
            statements.append((sql, params))

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        with Session(engine) as db:
            admin = Principal(user_id=1, name="admin", is_admin=True, default_group_id=None)
            member = Principal(user_id=2, name="alice", is_admin=False, default_group_id=None)
            labels = (("experiment", "e1"), ("trial", None))
            for who in (admin, member):
                list_jobs(db, who, JobFilter(labels=labels))
        assert len(statements) == 4, statements  # a page and its count, for each
        with engine.connect() as conn:
            for sql, params in statements:
                plan = " | ".join(r[3] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params))
                assert plan.count("COVERING INDEX ix_job_labels_key_value") == 2, plan
                assert "SCAN job_labels" not in plan, plan
    finally:
        engine.dispose()


def test_the_label_filter_reads_the_label_index_on_postgres(postgres_server: PostgresServer) -> None:
    """The same on PostgreSQL, whose planner weighs the table's statistics: with a few thousand
    labels (ANALYZEd), the NAME=VALUE label is an Index (Only) Scan of ix_job_labels_key_value,
    and no label is a Seq Scan of job_labels."""
    url = postgres_server.create_database()
    init_db(url)
    engine = make_engine(url)
    statements: list[tuple[str, object]] = []

    def seen(conn: object, cursor: object, sql: str, params: object, context: object, many: bool) -> None:
        if sql.lstrip().startswith("SELECT") and "job_labels" in sql:
            statements.append((sql, params))

    try:
        with Session(engine) as db:
            group_id, user_id = seed_tenant(db)
            jobs = [add_job(db, group_id, user_id) for _ in range(400)]
            db.execute(
                sa.insert(models.JobLabel),
                [
                    {"job_id": job, "key": key, "value": f"{key}-{(n * 7 + k) % 50}"}
                    for n, job in enumerate(jobs)
                    for k, key in enumerate(
                        ("experiment", "trial", "lr", "momentum", "seed", "run", "arch", "ds")
                    )
                ],
            )
            db.commit()
        with engine.connect() as conn:
            conn.execute(sa.text("ANALYZE job_labels"))
            conn.execute(sa.text("ANALYZE jobs"))
            conn.commit()
        sa.event.listen(engine, "before_cursor_execute", seen)
        with Session(engine) as db:
            admin = Principal(user_id=1, name="admin", is_admin=True, default_group_id=None)
            member = Principal(user_id=user_id, name="u", is_admin=False, default_group_id=group_id)
            labels = (("experiment", "experiment-3"), ("trial", None))
            for who in (admin, member):
                assert list_jobs(db, who, JobFilter(labels=labels))[1] == 8
        sa.event.remove(engine, "before_cursor_execute", seen)
        assert len(statements) == 4, statements  # a page and its count, for each
        with engine.connect() as conn:
            for sql, params in statements:
                plan = " | ".join(str(r[0]) for r in conn.exec_driver_sql(f"EXPLAIN {sql}", params))
                # the NAME=VALUE label on the key/value index; the bare NAME may take the primary
                # key (job_id, key) per job found instead: an index either way, no label scanned
                used = r"Index (Only )?Scan (Backward )?(using|on) ix_job_labels_key_value"
                assert re.search(used, plan), plan
                assert "Seq Scan on job_labels" not in plan, plan
    finally:
        engine.dispose()
        postgres_server.drop_database(url.rsplit("/", 1)[1])
