"""page_notifications: `claimed_by`, the server process (its lease owner id) that claimed a
notification to send it. The paging loop claims each due notification by compare-and-set on its
state and due time (`sending`, due again after the claim's expiry) and writes its outcome only
where its own claim still stands, so two servers never send one page notification twice
(corral.monitor.pager). NULL on existing rows: none is claimed.

Revision ID: 0038_page_claims
Revises: 0037_job_notifications
Create Date: 2026-11-30 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0038_page_claims"
down_revision = "0037_job_notifications"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("page_notifications") as batch:
        batch.add_column(sa.Column("claimed_by", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("page_notifications") as batch:
        batch.drop_column("claimed_by")
