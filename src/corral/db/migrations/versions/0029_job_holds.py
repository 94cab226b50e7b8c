"""jobs: holds (`corral hold`, `corral submit --hold`). held_by (the user who held the QUEUED job
back), held_at (when) and held_as_admin (an admin's hold, which only an admin releases, as
Slurm's admin hold). NULL held_by: not held, as every existing job is. The schedule loop leaves a
held job out of its input (server/snapshot.py); services/lifecycle.py writes these columns.
held_by has no foreign key: adding one would rebuild the jobs table on SQLite (0024_job_ids says
what that takes); columns only, added in place.

Revision ID: 0029_job_holds
Revises: 0028_workspace_idle_stopped
Create Date: 2026-11-30 00:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029_job_holds"
down_revision = "0028_workspace_idle_stopped"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("held_by", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("held_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("held_as_admin", sa.Boolean(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("held_as_admin")
        batch.drop_column("held_at")
        batch.drop_column("held_by")
