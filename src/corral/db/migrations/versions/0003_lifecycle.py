"""lifecycle: per-job failure/loss/preemption counts, GPU health (healthy | quarantined | lost)

Revision ID: 0003_lifecycle
Revises: 0002_monitor
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_lifecycle"
down_revision = "0002_monitor"
branch_labels = None
depends_on = None

JOB_COUNTS = ("own_failures", "platform_losses", "preemptions")


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for name in JOB_COUNTS:
            batch_op.add_column(sa.Column(name, sa.Integer(), server_default="0", nullable=False))
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("health", sa.String(length=16), server_default="healthy", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.drop_column("health")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for name in reversed(JOB_COUNTS):
            batch_op.drop_column(name)
