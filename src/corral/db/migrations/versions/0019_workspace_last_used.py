"""workspaces.last_used_at: when a session (SSH gateway, `corral exec`, `corral port-forward`)
into the workspace's current job was last open, as written by the server holding it
(corral.services.session_use); idle reclamation reads it, so every server's sessions count

Revision ID: 0019_workspace_last_used
Revises: 0018_jobs_user_name_index
Create Date: 2026-11-28 07:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_workspace_last_used"
down_revision = "0018_jobs_user_name_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        batch.add_column(sa.Column("last_used_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        batch.drop_column("last_used_at")
