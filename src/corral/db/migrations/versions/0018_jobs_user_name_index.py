"""ix_jobs_user_name: jobs by (user_id, name), for the runtime estimate every submission reads
(the user's last successful runs of a job with the same name); without it each submit scanned all
of its user's jobs, a cost that grew with the user's history

Revision ID: 0018_jobs_user_name_index
Revises: 0017_runtime_spread
Create Date: 2026-11-28 01:20:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0018_jobs_user_name_index"
down_revision = "0017_runtime_spread"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_user_name", "jobs", ["user_id", "name"])


def downgrade() -> None:
    op.drop_index("ix_jobs_user_name", table_name="jobs")
