"""failure diagnosis: attempt_diagnoses, attempt_faults, job_avoid, node_flags, hang_watches

Revision ID: 0006_diag
Revises: 0005_auth
Create Date: 2026-11-25 15:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_diag"
down_revision = "0005_auth"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "attempt_diagnoses",
        sa.Column("attempt_pk", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("fix", sa.Text(), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["attempt_pk"],
            ["attempts.id"],
            name=op.f("fk_attempt_diagnoses_attempt_pk_attempts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("attempt_pk", name=op.f("pk_attempt_diagnoses")),
    )
    op.create_index(op.f("ix_attempt_diagnoses_job_id"), "attempt_diagnoses", ["job_id"], unique=False)
    op.create_index(op.f("ix_attempt_diagnoses_at"), "attempt_diagnoses", ["at"], unique=False)
    op.create_table(
        "attempt_faults",
        sa.Column("attempt_pk", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["attempt_pk"],
            ["attempts.id"],
            name=op.f("fk_attempt_faults_attempt_pk_attempts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("attempt_pk", name=op.f("pk_attempt_faults")),
    )
    op.create_table(
        "job_avoid",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("not_before", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_avoid_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_avoid")),
    )
    op.create_table(
        "node_flags",
        sa.Column("node", sa.String(length=128), nullable=False),
        sa.Column("flag", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("since", sa.Float(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("node", name=op.f("pk_node_flags")),
    )
    op.create_table(
        "hang_watches",
        sa.Column("attempt_pk", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("ranks", sa.JSON(), nullable=False),
        sa.Column("idle_since", sa.Float(), nullable=True),
        sa.Column("suspected_at", sa.Float(), nullable=True),
        sa.Column("suspect", sa.Text(), nullable=False),
        sa.Column("stragglers", sa.Text(), nullable=False),
        sa.Column("acted", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["attempt_pk"],
            ["attempts.id"],
            name=op.f("fk_hang_watches_attempt_pk_attempts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("attempt_pk", name=op.f("pk_hang_watches")),
    )
    op.create_index(op.f("ix_hang_watches_job_id"), "hang_watches", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_hang_watches_job_id"), table_name="hang_watches")
    op.drop_table("hang_watches")
    op.drop_table("node_flags")
    op.drop_table("job_avoid")
    op.drop_table("attempt_faults")
    op.drop_index(op.f("ix_attempt_diagnoses_at"), table_name="attempt_diagnoses")
    op.drop_index(op.f("ix_attempt_diagnoses_job_id"), table_name="attempt_diagnoses")
    op.drop_table("attempt_diagnoses")
