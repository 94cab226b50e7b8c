"""job_labels: a job's labels (the spec's `labels`, `{experiment: e1, trial: "7"}`) as rows, so
that jobs are listed, waited for and cancelled by label (GET /jobs?label=k=v, POST /jobs/cancel)
along the index (key, value, job_id) instead of reading every visible job's spec. Jobs submitted
before have no labels (their specs hold none), so there is nothing to copy.

Revision ID: 0036_job_labels
Revises: 0035_security_fixes
Create Date: 2026-11-30 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0036_job_labels"
down_revision = "0035_security_fixes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_labels",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_labels_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "key", name=op.f("pk_job_labels")),
    )
    op.create_index("ix_job_labels_key_value", "job_labels", ["key", "value", "job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_labels_key_value", table_name="job_labels")
    op.drop_table("job_labels")
