"""Every Alembic migration, one revision at a time, on a POPULATED database (SQLite and
PostgreSQL): rows written at the oldest revision survive each step up to head, each step back down
to the oldest revision, and up again; then base and head once more. Written over the revisions
Alembic reports, so migrations added later are covered without touching this file.

The rows are inserted with plain SQL, each filtered to the columns the table has at that
revision, so the same data set fits the oldest schema; at head a second set is inserted so every
downgrade also runs with rows in the newest columns and tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from corral.db.session import alembic_config, downgrade, make_engine, upgrade
from tests.pg import sqlite_or_postgres_url

T0 = 1_700_000_000.0
# a dataset row's columns other than its id and name (migration tests 0020 and 0022)
DATASET_ROW = {"owner_user_id": 1, "public": False, "description": "", "created_at": T0, "created_by": "u"}
SPEC = {"name": "train", "tasks": {"main": {"command": "python train.py", "resources": {"gpus": 2}}}}


def rows(base: int) -> dict[str, list[dict[str, Any]]]:
    """A small installation: two groups with quotas, three users, tokens, a node with GPUs, jobs
    with attempts (one retried) and their events. `base` offsets the ids of a second set."""
    g1, g2, u1, u2, u3 = base + 1, base + 2, base + 1, base + 2, base + 3
    node = f"gpu-node-{base}"
    jobs, attempts, events = [], [], []
    for k in range(4):
        job_id = base + 10 + k
        state = ("succeeded", "failed", "running", "queued")[k]
        jobs.append(
            {
                "id": job_id,
                "name": f"job-{job_id}",
                "user_id": (u1, u2, u3, u1)[k],
                "group_id": (g1, g2, g1, g2)[k],
                "state": state,
                "priority": 1 + k % 3,
                "preemptible": k % 2 == 0,
                "spec": json.dumps(SPEC),
                "max_retries": k,
                "attempt_count": 0 if state == "queued" else 1 + (k == 1),
                "runtime_estimate_s": None,
                "submitted_at": T0 + k,
                "updated_at": T0 + 10 + k,
                "finished_at": T0 + 20 if k < 2 else None,
                "cancel_requested": False,
                "reason": "exit 1" if state == "failed" else "",
                "attained_gpu_seconds": 7.5 * k,
                "diagnosis": None,
                "lease_owner": None,
                "lease_until": None,
            }
        )
        for number in range(1, jobs[-1]["attempt_count"] + 1):
            attempts.append(
                {
                    "id": base + 100 + 10 * k + number,
                    "job_id": job_id,
                    "number": number,
                    "state": "succeeded",
                    "placement": json.dumps([{"role": "main", "node": node, "gpu_indices": [0, 1]}]),
                    "borrowed": False,
                    "engine": "local",
                    "engine_ref": f"{job_id}.{number}",
                    "created_at": T0 + k,
                    "started_at": T0 + k + 1,
                    "ended_at": None,
                    "exit_code": 0 if k == 0 else None,
                    "reason": None,
                    "message": "",
                    "stop_requested_at": None,
                    "stop_grace_s": None,
                }
            )
        events.append(
            {
                "id": base + 200 + k,
                "job_id": job_id,
                "at": T0 + k,
                "kind": "transition",
                "from_state": "queued",
                "to_state": state,
                "message": f"to {state}",
            }
        )
    return {
        "groups": [
            {
                "id": g,
                "name": f"group-{g}",
                "user_max_gpus": 4,
                "weight": 1.5,
                "borrowing": True,
                "created_at": T0,
                "cpus_guaranteed": 2.0,
                "cpus_max": 16.0,
                "memory_guaranteed_mib": 1024,
                "memory_max_mib": 65536,
            }
            for g in (g1, g2)
        ],
        "users": [
            {
                "id": u,
                "name": f"user-{u}",
                "password_hash": None,
                "is_admin": u == u1,
                "default_group_id": g1,
                "active": True,
                "created_at": T0,
            }
            for u in (u1, u2, u3)
        ],
        "memberships": [
            {"user_id": u1, "group_id": g1, "role": "admin"},
            {"user_id": u2, "group_id": g2, "role": "member"},
            {"user_id": u3, "group_id": g1, "role": "member"},
        ],
        "group_quotas": [
            {"id": base + 1, "group_id": g1, "gpu_model": "*", "guaranteed": 2, "max": 8},
            {"id": base + 2, "group_id": g2, "gpu_model": "A100", "guaranteed": 1, "max": None},
        ],
        "api_tokens": [
            {
                "id": base + 1,
                "user_id": u1,
                "name": "ci",
                "token_hash": f"{base:064d}",
                "prefix": "crl_abc",
                "created_at": T0,
                "last_used_at": None,
                "expires_at": None,
                "revoked_at": None,
            }
        ],
        "nodes": [
            {
                "name": node,
                "cpus": 32.0,
                "memory_mib": 256_000,
                "state": "ready",
                "admin_state": "none",
                "address": "10.0.0.5",
                "labels": json.dumps({"rack": "a"}),
                "engine": "local",
                "last_heartbeat": T0,
                "message": "",
            }
        ],
        "gpus": [
            {
                "node_name": node,
                "index": i,
                "uuid": f"GPU-{base}-{i}",
                "model": "A100",
                "memory_mib": 81920,
                "topology_group": 0,
                "healthy": True,
            }
            for i in range(2)
        ],
        "jobs": jobs,
        "attempts": attempts,
        "job_events": events,
        "usage_ledger": [
            {"group_name": f"group-{g1}", "user_name": f"user-{u1}", "gpu_seconds": 3600.0, "updated_at": T0}
        ],
    }


def insert(engine: sa.Engine, data: dict[str, list[dict[str, Any]]]) -> None:
    """Insert each row with the columns its table has at the current revision."""
    with engine.begin() as conn:
        inspector = sa.inspect(conn)
        for table, table_rows in data.items():
            columns = {c["name"] for c in inspector.get_columns(table)}
            target = sa.table(table, *(sa.column(c) for c in columns))
            for row in table_rows:
                conn.execute(sa.insert(target).values({k: v for k, v in row.items() if k in columns}))


def snapshot(engine: sa.Engine, data: dict[str, list[dict[str, Any]]], columns: dict[str, list[str]]) -> Any:
    """The given columns of every table in `data`, sorted: what must survive every migration."""
    out = {}
    with engine.connect() as conn:
        for table in data:
            cols = ", ".join(f'"{c}"' for c in columns[table])
            result = conn.execute(sa.text(f'SELECT {cols} FROM "{table}"'))
            out[table] = sorted(tuple(str(v) for v in r) for r in result)
    return out


def revisions_oldest_first(url: str) -> list[str]:
    script = ScriptDirectory.from_config(alembic_config(url))
    heads = script.get_heads()
    assert len(heads) == 1, f"the migrations must have one head, found {heads}"
    return [r.revision for r in reversed(list(script.walk_revisions("base", "heads")))]


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sqlite_or_postgres_url(request, tmp_path, "populated.db")


def test_every_migration_keeps_the_data_up_down_and_up(url: str) -> None:
    revisions = revisions_oldest_first(url)
    oldest = rows(0)
    upgrade(url, revisions[0])
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        insert(engine, oldest)
        inspector = sa.inspect(engine)
        first_columns = {t: sorted(c["name"] for c in inspector.get_columns(t)) for t in oldest}
        expected = snapshot(engine, oldest, first_columns)
        assert sum(len(v) for v in expected.values()) == sum(len(v) for v in oldest.values())

        for revision in revisions[1:]:
            upgrade(url, revision)
            assert snapshot(engine, oldest, first_columns) == expected, (
                f"data changed by upgrade to {revision}"
            )

        newest = rows(1000)  # every column of head's tables filled: downgrades meet real data
        insert(engine, newest)
        expected_both = snapshot(engine, {**oldest}, first_columns)
        for previous in reversed(revisions[:-1]):
            downgrade(url, previous)
            assert snapshot(engine, oldest, first_columns) == expected_both, (
                f"data lost by downgrade to {previous}"
            )

        upgrade(url, "heads")
        assert snapshot(engine, oldest, first_columns) == expected_both
        downgrade(url, "base")
        assert set(sa.inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade(url, "heads")
        assert {"jobs", "attempts", "users", "groups"} <= set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_version_counters_start_above_every_number_given(url: str) -> None:
    # 0020: a dataset's and a model's next version comes after every number given so far: those
    # of the versions there and those jobs recorded (lineage outlives a deleted latest version).
    upgrade(url, "0019_workspace_last_used")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        insert(engine, rows(0))
        made = {"bytes": 1, "files": 1, "digest": "d", "created_at": T0, "created_by": "u"}
        model = {"owner_user_id": 1, "visibility": "private", "description": "", "created_at": T0}
        insert(engine, {
            "datasets": [{"id": i, "name": n, **DATASET_ROW}
                         for i, n in enumerate(["kept", "used", "new"], 1)],
            "dataset_versions": [{"id": i, "dataset_id": d, "version": v, "source": "upload", **made}
                                 for i, (d, v) in enumerate([(1, 1), (1, 2), (2, 1)], 1)],
            "job_datasets": [{"job_id": 10, "dataset_id": 2, "version": 3, "dataset_name": "used"}],
            "registered_models": [{"id": 1, "name": "m", "created_by": "u", **model}],
            "model_versions": [{"id": 1, "model_id": 1, "version": 1, "stage": "none", "framework": "",
                                "metrics": "{}", "card": "", "source_path": "", "lineage": "{}",
                                "source_job_id": 10, **made}],
            "job_models": [{"job_id": 10, "model_version_id": 9, "model_name": "m", "version": 4}],
        })  # fmt: skip
        upgrade(url, "0020_version_counters")
        with engine.connect() as conn:
            datasets = conn.execute(sa.text("SELECT name, last_version FROM datasets ORDER BY id")).all()
            models = conn.execute(sa.text("SELECT name, last_version FROM registered_models")).all()
        assert [tuple(r) for r in datasets] == [("kept", 2), ("used", 3), ("new", 0)]
        assert [tuple(r) for r in models] == [("m", 4)]
    finally:
        engine.dispose()


def test_retired_names_keep_the_numbers_jobs_recorded(url: str) -> None:
    # 0022: a name whose dataset or model was deleted keeps the highest number jobs recorded for
    # it, for one made again with that name; an environment's counter starts at its highest.
    upgrade(url, "0021_removed_nodes")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        insert(engine, rows(0))
        built = {
            "state": "failed",
            "source_kind": "requirements",
            "source": "x",
            "python": "3",
            "interpreter": "",
            "cache_hit": False,
            "error": "",
            "created_by": "u",
            "created_at": T0,
        }
        insert(engine, {
            "datasets": [{"id": 1, "name": "kept", "last_version": 1, **DATASET_ROW}],
            "job_datasets": [{"job_id": 10, "dataset_id": 1, "version": 1, "dataset_name": "kept"},
                             {"job_id": 10, "dataset_id": 7, "version": 5, "dataset_name": "gone"},
                             {"job_id": 11, "dataset_id": 7, "version": 2, "dataset_name": "gone"}],
            "job_models": [{"job_id": 10, "model_version_id": 9, "model_name": "old", "version": 2}],
            "environments": [{"id": 1, "name": "e", "owner_id": 1, "visibility": "private",
                              "official": False, "description": "", "created_at": T0}],
            "environment_versions": [{"id": i, "environment_id": 1, "version": v, **built}
                                     for i, v in ((1, 1), (2, 3))],
        })  # fmt: skip
        upgrade(url, "0022_retired_names")
        with engine.connect() as conn:
            retired = conn.execute(
                sa.text("SELECT kind, name, last_version FROM retired_names ORDER BY kind")
            )
            envs = conn.execute(sa.text("SELECT name, last_version FROM environments")).all()
            assert [tuple(r) for r in retired] == [("dataset", "gone", 5), ("model", "old", 2)]
        assert [tuple(r) for r in envs] == [("e", 3)]
    finally:
        engine.dispose()


def test_job_ids_are_never_given_again_after_0024(url: str) -> None:
    # 0024: jobs rebuilt with AUTOINCREMENT on SQLite (a no-op on PostgreSQL): every job and the
    # rows that reference it survive with their cascades, and the next job's id comes after every
    # job id still recorded, jobs deleted before the upgrade included (lineage, audit).
    upgrade(url, "0023_code_claims")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        data = rows(0)  # jobs 10..13, their attempts and events
        insert(engine, data)
        made = {"bytes": 1, "files": 1, "digest": "d", "created_at": T0, "created_by": "u"}
        model = {"owner_user_id": 1, "visibility": "private", "description": "", "created_at": T0}
        children = {
            "job_avoid": [{"job_id": 11, "nodes": "[]", "gpus": "[]", "not_before": None}],
            "datasets": [{"id": 1, "name": "d", "last_version": 1, **DATASET_ROW}],
            "job_datasets": [{"job_id": 10, "dataset_id": 1, "version": 1, "dataset_name": "d"}],
            "job_models": [{"job_id": 12, "model_version_id": 1, "model_name": "m", "version": 1}],
            "registered_models": [{"id": 1, "name": "m", "created_by": "u", "last_version": 1, **model}],
            # a job deleted before the upgrade, still named by a model's lineage (job 30) and
            # by the audit of its deletion (job 31)
            "model_versions": [{"id": 1, "model_id": 1, "version": 1, "stage": "none", "framework": "",
                                "metrics": "{}", "card": "", "source_path": "", "lineage": "{}",
                                "source_job_id": 30, **made}],
            "audit_log": [{"id": 1, "at": T0, "actor": "u", "action": "job.delete", "target_kind": "job",
                           "target_id": "31"}],
        }  # fmt: skip
        insert(engine, children)
        every = {**data, **children}
        with engine.connect() as conn:
            columns = {t: sorted(c["name"] for c in sa.inspect(conn).get_columns(t)) for t in every}
        expected = snapshot(engine, every, columns)

        upgrade(url, "0024_job_ids")
        assert snapshot(engine, every, columns) == expected
        with engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                assert conn.execute(sa.text("PRAGMA foreign_key_check")).all() == []
            new_id = conn.execute(
                sa.text(
                    "INSERT INTO jobs (name, user_id, group_id, state, priority, preemptible, spec,"
                    " max_retries, attempt_count, submitted_at, updated_at, cancel_requested, reason,"
                    " attained_gpu_seconds) VALUES ('next', 1, 1, 'queued', 1, false, '{}', 0, 0, 0, 0,"
                    " false, '', 0) RETURNING id"
                )
            ).scalar_one()
        if engine.dialect.name == "sqlite":
            assert new_id > 31, f"job {new_id} after jobs up to 13 and deleted jobs 30, 31"
        else:  # the rows above were inserted with explicit ids: PostgreSQL's sequence was not used
            assert new_id not in (10, 11, 12, 13)

        with engine.begin() as conn:  # cascades still hold: deleting a job takes its rows with it
            conn.execute(sa.text("DELETE FROM jobs WHERE id IN (10, 11, 12)"))
            for table in ("attempts", "job_events", "job_avoid", "job_datasets", "job_models"):
                left = conn.execute(sa.text(f"SELECT COUNT(*) FROM {table} WHERE job_id IN (10, 11, 12)"))
                assert left.scalar_one() == 0, table
            kept = conn.execute(sa.text("SELECT COUNT(*) FROM job_events WHERE job_id = 13"))
            assert kept.scalar_one() == 1

        downgrade(url, "0023_code_claims")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM jobs")).scalar_one() == 2
            assert conn.execute(sa.text("SELECT COUNT(*) FROM job_events")).scalar_one() == 1
    finally:
        engine.dispose()


def test_0024_refuses_to_rebuild_populated_jobs_with_foreign_keys_on(tmp_path: Path) -> None:
    # A connection handed in with `engine=` has SQLite's foreign keys on, and the pragma cannot
    # change inside the migration's transaction: the DROP of the old jobs table would then delete
    # every attempt and event by ON DELETE CASCADE. 0024 refuses instead; nothing is lost.
    url = f"sqlite:///{tmp_path / 'fk.db'}"
    upgrade(url, "0023_code_claims")
    engine = make_engine(url)  # foreign keys on, as the server's engine
    try:
        insert(engine, rows(0))
        with pytest.raises(RuntimeError, match="foreign keys off"):
            upgrade(url, "0024_job_ids", engine=engine)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM attempts")).scalar_one() == 4
            assert conn.execute(sa.text("SELECT COUNT(*) FROM job_events")).scalar_one() == 4
        upgrade(url, "0024_job_ids")  # as `corral admin migrate` and the server's start run it
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM attempts")).scalar_one() == 4
    finally:
        engine.dispose()


def test_key_and_override_ids_are_never_given_again_after_0025(url: str) -> None:
    # 0025: ssh_keys and oncall_overrides rebuilt with AUTOINCREMENT on SQLite (a no-op on
    # PostgreSQL): their rows survive, and the next id of each comes after every id still
    # recorded, ones removed before the upgrade included (the audit log names them).
    upgrade(url, "0024_job_ids")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        data = {k: v for k, v in rows(0).items() if k in ("groups", "users", "memberships")}
        audit = {"at": T0, "actor": "u"}
        data |= {
            "ssh_keys": [{"id": i, "user_id": 1, "name": f"k{i}", "public_key": "ssh-ed25519 AAAA",
                          "fingerprint": f"SHA256:{i}", "created_at": T0} for i in (10, 11)],
            "oncall_schedules": [{"id": 1, "name": "s", "time_zone": "UTC", "description": "",
                                  "fallback_user_id": None, "created_at": T0, "updated_at": T0}],
            "oncall_overrides": [{"id": i, "schedule_id": 1, "user_id": 2, "start": T0, "end": T0 + 60,
                                  "created_by": "u", "created_at": T0} for i in (10, 11)],
            # key 19 and override 17 removed before the upgrade: only the audit log names them
            "audit_log": [
                {"id": 1, **audit, "action": "ssh_key.delete", "target_kind": "ssh_key", "target_id": "19"},
                {"id": 2, **audit, "action": "oncall.override.remove", "target_kind": "oncall_schedule",
                 "target_id": "s", "before": json.dumps({"id": 17, "start": T0, "end": T0 + 60})},
            ],
        }  # fmt: skip
        insert(engine, data)
        with engine.connect() as conn:
            columns = {t: sorted(c["name"] for c in sa.inspect(conn).get_columns(t)) for t in data}
        expected = snapshot(engine, data, columns)

        upgrade(url, "0025_row_ids")
        assert snapshot(engine, data, columns) == expected
        with engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                assert conn.execute(sa.text("PRAGMA foreign_key_check")).all() == []
            key = conn.execute(
                sa.text(
                    "INSERT INTO ssh_keys (user_id, name, public_key, fingerprint, created_at)"
                    " VALUES (1, 'n', 'ssh-ed25519 B', 'SHA256:n', 0) RETURNING id"
                )
            ).scalar_one()
            override = conn.execute(
                sa.text(
                    'INSERT INTO oncall_overrides (schedule_id, user_id, start, "end", created_by,'
                    " created_at) VALUES (1, 1, 0, 1, 'u', 0) RETURNING id"
                )
            ).scalar_one()
        if engine.dialect.name == "sqlite":
            assert key > 19, f"key {key} after keys 10, 11 and removed key 19"
            assert override > 17, f"override {override} after overrides 10, 11 and removed override 17"
        else:  # the rows above were inserted with explicit ids: PostgreSQL's sequence was not used
            assert key not in (10, 11) and override not in (10, 11)

        downgrade(url, "0024_job_ids")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM ssh_keys")).scalar_one() == 3
            assert conn.execute(sa.text("SELECT COUNT(*) FROM oncall_overrides")).scalar_one() == 3
    finally:
        engine.dispose()


def test_snapshots_jobs_named_are_claimed_by_their_users_after_0026(url: str) -> None:
    # 0026: a snapshot made before is claimed by each user whose job (still in the table) named
    # it, once however many jobs did; a job without `code` claims nothing.
    upgrade(url, "0025_row_ids")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        data = rows(0)
        snap = "ab" * 32
        for job, code in zip(data["jobs"], (snap, snap, None, snap), strict=True):  # users 1, 2, 3, 1
            job["spec"] = json.dumps(SPEC if code is None else {**SPEC, "code": code})
        insert(engine, data)
        upgrade(url, "0026_code_snapshot_claims")
        with engine.connect() as conn:
            claims = conn.execute(
                sa.text("SELECT snapshot, user_id FROM code_snapshot_claims ORDER BY user_id")
            )
            assert [tuple(r) for r in claims] == [(snap, 1), (snap, 2)]
        downgrade(url, "0025_row_ids")
        assert "code_snapshot_claims" not in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_idle_stops_recorded_only_as_job_events_are_filled_in_by_0028(url: str) -> None:
    # 0028: `corral ws ls/show` read workspaces.idle_stopped_at, no longer the job's events. A
    # workspace the idle policy had stopped before the upgrade (its current job's cancel was
    # requested and its latest idle_gpu event ending ": stopped") shows the same after it.
    upgrade(url, "0027_jobs_updated_index")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        data = rows(0)
        for job in data["jobs"]:  # 10 succeeded, 11 failed, 12 running, 13 queued
            job["cancel_requested"] = job["id"] in (10, 12, 13)
        stop = "GPUs still idle (0.0%) 600 s after the warning: stopped"
        warn = "GPUs idle: mean utilization 0.0% < 10% for 1860 s; it will be stopped in 600 s"
        data["job_events"] += [
            {"id": 300 + i, "job_id": job_id, "at": T0 + at, "kind": kind, "from_state": None,
             "to_state": None, "message": message}
            for i, (job_id, at, kind, message) in enumerate([
                (10, 50, "idle_gpu", stop), (10, 90, "idle_gpu", stop),  # stopped twice: the latest
                (11, 60, "idle_gpu", stop),  # its cancel was not requested (it failed on its own)
                (12, 70, "idle_gpu", warn),  # warned, then cancelled by hand
                (13, 80, "transition", stop),  # another kind's message
            ])
        ]  # fmt: skip
        workspace = {"user_id": 1, "group_id": 1, "gpus": 1, "gpu_model": None, "cpus": 1.0,
                     "memory_mib": 1024, "environment": "default", "idle_timeout_s": None,
                     "jupyter_token": "t", "reclaimed_gpu_hours": 0.0, "last_used_at": None,
                     "created_at": T0, "updated_at": T0}  # fmt: skip
        current = {1: 10, 2: 11, 3: 12, 4: 13, 5: None}
        data["workspaces"] = [
            {"id": i, "name": f"w{i}", "current_job_id": j, **workspace} for i, j in current.items()
        ]
        insert(engine, data)
        upgrade(url, "0028_workspace_idle_stopped")
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT id, idle_stopped_at FROM workspaces ORDER BY id"))
            assert [tuple(r) for r in found] == [(1, T0 + 90), (2, None), (3, None), (4, None), (5, None)]
        downgrade(url, "0027_jobs_updated_index")
        with engine.connect() as conn:
            assert "idle_stopped_at" not in {c["name"] for c in sa.inspect(conn).get_columns("workspaces")}
            assert conn.execute(sa.text("SELECT COUNT(*) FROM workspaces")).scalar_one() == 5
    finally:
        engine.dispose()


@pytest.mark.parametrize("highest_in", ["audit log", "job URL"])
def test_workspace_ids_are_never_given_again_after_0033(url: str, highest_in: str) -> None:
    # 0033: workspaces rebuilt with AUTOINCREMENT on SQLite (a no-op on PostgreSQL): its rows
    # survive, and the next id comes after every id still recorded, removed workspaces' included:
    # the audit log's workspace targets and the workspace jobs' base URLs (/ws/<id>/) name them.
    # Before, `corral ws rm` then another user's `ws create` gave the new workspace the same id.
    # Each case makes one of the two the highest, so each alone decides the next id in one case.
    audit_only, url_only = (40, 21) if highest_in == "audit log" else (17, 40)
    upgrade(url, "0030_group_memory_bigint")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        data = rows(0)
        for job, base in zip(data["jobs"], ("/ws/3/", f"/ws/{url_only}/", None, None), strict=True):
            if base is not None:  # job 11 ran workspace url_only, removed before the upgrade
                job["spec"] = json.dumps({**SPEC, "env": {"CORRAL_WORKSPACE_BASE_URL": base}})
        workspace = {"user_id": 1, "group_id": 1, "gpus": 0, "gpu_model": None, "cpus": 1.0,
                     "memory_mib": 1024, "environment": "default", "idle_timeout_s": None,
                     "jupyter_token": "t", "reclaimed_gpu_hours": 0.0, "last_used_at": None,
                     "idle_stopped_at": None, "created_at": T0, "updated_at": T0}  # fmt: skip
        data["workspaces"] = [{"id": 3, "name": "nb", "current_job_id": 10, **workspace}]
        audit = {"at": T0, "actor": "u", "target_kind": "workspace"}
        data["audit_log"] = [  # workspace audit_only created and removed: only the audit log names it
            {"id": 1, **audit, "action": "workspace.create", "target_id": str(audit_only)},
            {"id": 2, **audit, "action": "workspace.remove", "target_id": str(audit_only)},
        ]
        insert(engine, data)
        with engine.connect() as conn:
            columns = {t: sorted(c["name"] for c in sa.inspect(conn).get_columns(t)) for t in data}
        expected = snapshot(engine, data, columns)

        upgrade(url, "0033_workspace_ids")
        assert snapshot(engine, data, columns) == expected
        with engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                assert conn.execute(sa.text("PRAGMA foreign_key_check")).all() == []
            made = conn.execute(
                sa.text(
                    "INSERT INTO workspaces (name, user_id, group_id, gpus, cpus, memory_mib, environment,"
                    " jupyter_token, reclaimed_gpu_hours, created_at, updated_at)"
                    " VALUES ('nb2', 2, 1, 0, 1, 1024, 'default', 't', 0, 0, 0) RETURNING id"
                )
            ).scalar_one()
        if engine.dialect.name == "sqlite":
            assert made == 41, (
                f"workspace {made} after workspace 3, removed {audit_only} (audit log), {url_only} (job URL)"
            )
        else:  # the row above was inserted with an explicit id: PostgreSQL's sequence was not used
            assert made != 3

        downgrade(url, "0030_group_memory_bigint")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM workspaces")).scalar_one() == 2
    finally:
        engine.dispose()


def test_each_schedule_gets_a_calendar_nonce_of_its_own_in_0035(url: str) -> None:
    # 0035: the calendar URL's HMAC includes a per-schedule nonce; every schedule recorded before
    # gets one of its own (a shared or empty one would let one schedule's URL survive another's
    # rotation), and the column is NOT NULL afterwards.
    upgrade(url, "0034_eta_outcome_start")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        schedule = {"time_zone": "UTC", "description": "", "fallback_user_id": None,
                    "created_at": T0, "updated_at": T0}  # fmt: skip
        insert(engine, {"oncall_schedules": [{"id": i, "name": f"s{i}", **schedule} for i in (1, 2)]})
        upgrade(url, "0035_security_fixes")
        with engine.connect() as conn:
            nonces = (
                conn.execute(sa.text("SELECT feed_nonce FROM oncall_schedules ORDER BY id")).scalars().all()
            )
            nullable = {c["name"]: c["nullable"] for c in sa.inspect(conn).get_columns("oncall_schedules")}
        assert len(nonces) == 2 and len(set(nonces)) == 2, nonces
        assert all(isinstance(n, str) and len(n) == 32 and int(n, 16) >= 0 for n in nonces), nonces
        assert nullable["feed_nonce"] is False
        downgrade(url, "0034_eta_outcome_start")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM oncall_schedules")).scalar_one() == 2
    finally:
        engine.dispose()


def test_job_labels_arrive_empty_for_the_jobs_before_0036_and_go_with_their_job(url: str) -> None:
    # 0036: job_labels, the label filters' rows. Jobs submitted before carry no labels (their
    # specs hold none): they stay, with no label rows; a label row goes with its job (ON DELETE
    # CASCADE, which SQLite enforces on the server's connections: PRAGMA foreign_keys=ON).
    upgrade(url, "0035_security_fixes")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        insert(engine, rows(0))
        upgrade(url, "0036_job_labels")
        with engine.begin() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM jobs")).scalar_one() == 4
            assert conn.execute(sa.text("SELECT COUNT(*) FROM job_labels")).scalar_one() == 0
            conn.execute(
                sa.text("INSERT INTO job_labels (job_id, key, value) VALUES (10, 'experiment', 'e1')")
            )
            indexes = {i["name"] for i in sa.inspect(conn).get_indexes("job_labels")}
        assert "ix_job_labels_key_value" in indexes
        with engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                conn.execute(sa.text("PRAGMA foreign_keys=ON"))
            conn.execute(sa.text("DELETE FROM attempts WHERE job_id = 10"))
            conn.execute(sa.text("DELETE FROM job_events WHERE job_id = 10"))
            conn.execute(sa.text("DELETE FROM jobs WHERE id = 10"))
            assert conn.execute(sa.text("SELECT COUNT(*) FROM job_labels")).scalar_one() == 0
        downgrade(url, "0035_security_fixes")
        with engine.connect() as conn:
            assert "job_labels" not in sa.inspect(conn).get_table_names()
            assert conn.execute(sa.text("SELECT COUNT(*) FROM jobs")).scalar_one() == 3
    finally:
        engine.dispose()


def test_job_notification_tables_arrive_empty_in_0037_and_an_outbox_row_goes_with_its_job(url: str) -> None:
    # 0037: the job notification outbox, its deliveries and the users' defaults. Jobs from before
    # have no outbox rows (their specs ask for none) and stay as they were; an outbox row goes with
    # its job (ON DELETE CASCADE), a delivery (no job key: a digest tells of several jobs) and a
    # user's default stay; "on"/"to" are reserved words in PostgreSQL and work quoted.
    upgrade(url, "0036_job_labels")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        insert(engine, rows(0))
        upgrade(url, "0037_job_notifications")
        with engine.begin() as conn:
            for table in ("job_notifications", "job_notify_deliveries", "job_notify_defaults"):
                assert conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one() == 0, table
            assert conn.execute(sa.text("SELECT COUNT(*) FROM jobs")).scalar_one() == 4
            conn.execute(
                sa.text(
                    "INSERT INTO job_notifications (id, job_id, user_id, event, attempt, at, message, state,"
                    " digest_id) VALUES (1, 10, 1, 'failed', 1, :t, 'exit 1', 'grouped', 1)"
                ),
                {"t": T0},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO job_notify_deliveries (id, digest_id, user_id, kind, address, subject, body,"
                    " payload, events, state, attempts, next_attempt_at, last_error, created_at, sent_at)"
                    " VALUES (1, 1, 1, 'email', 'u1@example.org', 's', 'b', :p, 1, 'sent', 1, :t, '', :t, :t)"
                ),
                {"p": json.dumps({"count": 1}), "t": T0},
            )
            conn.execute(
                sa.text(
                    'INSERT INTO job_notify_defaults (user_id, "on", "to", updated_at)'
                    " VALUES (1, :on, :to, :t)"
                ),
                {"on": json.dumps(["failed"]), "to": json.dumps([]), "t": T0},
            )
            indexes = {i["name"] for i in sa.inspect(conn).get_indexes("job_notifications")}
            indexes |= {i["name"] for i in sa.inspect(conn).get_indexes("job_notify_deliveries")}
        wanted = {"ix_job_notifications_state", "ix_job_notifications_digest_id",
                  "ix_job_notify_deliveries_state", "ix_job_notify_deliveries_digest_id"}  # fmt: skip
        assert wanted <= indexes, indexes
        with engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                conn.execute(sa.text("PRAGMA foreign_keys=ON"))
            conn.execute(sa.text("DELETE FROM attempts WHERE job_id = 10"))
            conn.execute(sa.text("DELETE FROM job_events WHERE job_id = 10"))
            conn.execute(sa.text("DELETE FROM jobs WHERE id = 10"))
            assert conn.execute(sa.text("SELECT COUNT(*) FROM job_notifications")).scalar_one() == 0
            assert conn.execute(sa.text("SELECT COUNT(*) FROM job_notify_deliveries")).scalar_one() == 1
            default = conn.execute(sa.text('SELECT "on", "to" FROM job_notify_defaults')).one()
        assert [json.loads(v) if isinstance(v, str) else v for v in default] == [["failed"], []]
        downgrade(url, "0036_job_labels")
        with engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names())
            assert not names & {"job_notifications", "job_notify_deliveries", "job_notify_defaults"}
            assert conn.execute(sa.text("SELECT COUNT(*) FROM jobs")).scalar_one() == 3
            assert conn.execute(sa.text("SELECT COUNT(*) FROM job_labels")).scalar_one() == 0
    finally:
        engine.dispose()


def test_page_notifications_keep_their_rows_unclaimed_through_0038(url: str) -> None:
    # 0038: page_notifications.claimed_by, the claimer of one being sent (corral.monitor.pager).
    # A notification from before has none (NULL, whatever its state); down again, it stays.
    upgrade(url, "0037_job_notifications")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        insert(engine, rows(0))
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO pages (id, key, policy_name, steps, repeat, subject, body, state, step,"
                    " round, next_at, created_at, log) VALUES (1, 'k', 'gpu', '[]', 0, 's', 'b', 'triggered',"
                    " 0, 0, :t, :t, '[]')"
                ),
                {"t": T0},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO page_notifications (id, page_id, round, step, user_id, kind, address, state,"
                    " attempts, next_attempt_at, last_error, created_at) VALUES (1, 1, 0, 0, 1, 'email',"
                    " 'u1@example.org', 'sending', 1, :t, '', :t)"
                ),
                {"t": T0},
            )
        upgrade(url, "0038_page_claims")
        with engine.begin() as conn:
            row = conn.execute(sa.text("SELECT state, claimed_by FROM page_notifications")).one()
            assert tuple(row) == ("sending", None)
            conn.execute(sa.text("UPDATE page_notifications SET claimed_by = 'host:1:ab'"))
        downgrade(url, "0037_job_notifications")
        with engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("page_notifications")}
            assert "claimed_by" not in columns
            assert conn.execute(sa.text("SELECT state FROM page_notifications")).scalar_one() == "sending"
    finally:
        engine.dispose()
