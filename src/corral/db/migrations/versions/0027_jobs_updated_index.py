"""ix_jobs_updated: jobs by updated_at, for the job list sorted by it (`corral ls --sort
updated_at`, `GET /jobs?sort=updated_at`: ORDER BY updated_at, id with a LIMIT). Without it an
admin's page scanned every job and sorted them all in a temporary B-tree; with it SQLite walks
the index (its entries end with the rowid, the job id: the tie-break too) and stops at the page.
A member's page rides their (user_id, submitted_at) index as before and sorts only their jobs.

Revision ID: 0027_jobs_updated_index
Revises: 0026_code_snapshot_claims
Create Date: 2026-11-29 21:50:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0027_jobs_updated_index"
down_revision = "0026_code_snapshot_claims"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_updated", "jobs", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_updated", table_name="jobs")
