"""job_ids: on SQLite, `jobs.id` becomes INTEGER PRIMARY KEY AUTOINCREMENT, so a deleted job's id
is never given to another job. Without it SQLite hands out max(rowid)+1: deleting the newest jobs
(`corral rm`, retention) gave their ids to the next submits, and a model version's lineage, an
environment's build job, audit entries, the engine's attempt dirs ("<job id>.<n>") and users'
own notes then named another (possibly another user's) job.

The table is rebuilt (batch, recreate="always": copy, DROP, rename; migrations/env.py turns
foreign keys off around it, so the DROP cascades to nothing, and checks them after) and
sqlite_sequence is seeded above every job id still recorded anywhere cheap to read: the jobs
there, the lineage of model versions and templates, environment build jobs, the audit log's job
targets. PostgreSQL: nothing to do (its sequence never gives an id twice).

Revision ID: 0024_job_ids
Revises: 0023_code_claims
Create Date: 2026-11-29 19:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024_job_ids"
down_revision = "0023_code_claims"
branch_labels = None
depends_on = None

# Every place a job id outlives its job (no foreign key), with jobs' own ids: the next id is above all.
JOB_IDS_RECORDED = (
    "SELECT MAX(id) FROM jobs",
    "SELECT MAX(source_job_id) FROM model_versions",
    "SELECT MAX(source_job_id) FROM template_versions",
    "SELECT MAX(build_job_id) FROM environment_versions",
    # audit target ids are text; job targets are digits (CAST of anything else gives 0)
    "SELECT MAX(CAST(target_id AS INTEGER)) FROM audit_log WHERE target_kind = 'job'",
)


def _rebuild_jobs(autoincrement: bool) -> None:
    bind = op.get_bind()
    foreign_keys = bind.execute(sa.text("PRAGMA foreign_keys")).scalar()
    if foreign_keys and bind.execute(sa.text("SELECT 1 FROM jobs LIMIT 1")).first():
        # The DROP in the rebuild would run ON DELETE CASCADE (attempts, events...) or fail; the
        # pragma cannot be changed inside the migration's transaction (env.py sets it before,
        # when it opens the connection; one handed in by `engine=` has it on). Empty: harmless.
        raise RuntimeError(
            "0024_job_ids rebuilds jobs: run it with SQLite foreign keys off (corral admin migrate)"
        )
    with op.batch_alter_table(
        "jobs", recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
    ) as batch:
        del batch  # the table is copied as it is; only its AUTOINCREMENT changes


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    _rebuild_jobs(autoincrement=True)
    highest = max((bind.execute(sa.text(q)).scalar() or 0 for q in JOB_IDS_RECORDED), default=0)
    # The copy's explicit ids set the sequence to max(jobs.id) already (0, or no row, when empty).
    updated = bind.execute(
        sa.text("UPDATE sqlite_sequence SET seq = MAX(seq, :n) WHERE name = 'jobs'"), {"n": highest}
    )
    if updated.rowcount == 0 and highest > 0:
        bind.execute(sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', :n)"), {"n": highest})


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    _rebuild_jobs(autoincrement=False)
    bind.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = 'jobs'"))
