"""CPU and memory quotas per group: groups.cpus_guaranteed, cpus_max, memory_guaranteed_mib,
memory_max_mib

Revision ID: 0004_quotas
Revises: 0003_lifecycle
Create Date: 2026-11-25 12:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_quotas"
down_revision = "0003_lifecycle"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("groups", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cpus_guaranteed", sa.Float(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("cpus_max", sa.Float(), nullable=True))
        batch_op.add_column(
            sa.Column("memory_guaranteed_mib", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("memory_max_mib", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("groups", schema=None) as batch_op:
        batch_op.drop_column("memory_max_mib")
        batch_op.drop_column("memory_guaranteed_mib")
        batch_op.drop_column("cpus_max")
        batch_op.drop_column("cpus_guaranteed")
