"""code_snapshot_claims: which users may run each `--code` snapshot (a job's `code:`): whoever
posted its manifest with every blob theirs (or their groups'), and their groups' members. Before,
a snapshot id was not per caller: a job naming another user's snapshot was accepted, so anyone
told the id ran that user's code.

Snapshots made before: each is claimed by the users whose jobs (still in the jobs table) named
it, as of now; a snapshot no remaining job named is claimed by nobody until someone posts its
manifest again (`corral submit --code DIR` always does).

Revision ID: 0026_code_snapshot_claims
Revises: 0025_row_ids
Create Date: 2026-11-29 21:40:00.000000
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0026_code_snapshot_claims"
down_revision = "0025_row_ids"
branch_labels = None
depends_on = None

# (user, snapshot) of every job that names a snapshot; the spec is JSON text on SQLite, json on PG
JOB_SNAPSHOTS = {
    "sqlite": "SELECT DISTINCT user_id, json_extract(spec, '$.code') AS code FROM jobs"
    " WHERE json_extract(spec, '$.code') IS NOT NULL",
    "postgresql": "SELECT DISTINCT user_id, spec->>'code' AS code FROM jobs WHERE spec->>'code' IS NOT NULL",
}


def upgrade() -> None:
    table = op.create_table(
        "code_snapshot_claims",
        sa.Column("snapshot", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_code_snapshot_claims_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("snapshot", "user_id", name=op.f("pk_code_snapshot_claims")),
    )
    op.create_index(
        op.f("ix_code_snapshot_claims_user_id"), "code_snapshot_claims", ["user_id"], unique=False
    )
    bind = op.get_bind()
    now = time.time()
    found = bind.execute(sa.text(JOB_SNAPSHOTS[bind.dialect.name])).all()
    claims = [
        {"snapshot": code, "user_id": user, "created_at": now}
        for user, code in found
        if isinstance(code, str)
    ]
    if claims:
        op.bulk_insert(table, claims)


def downgrade() -> None:
    op.drop_index(op.f("ix_code_snapshot_claims_user_id"), table_name="code_snapshot_claims")
    op.drop_table("code_snapshot_claims")
