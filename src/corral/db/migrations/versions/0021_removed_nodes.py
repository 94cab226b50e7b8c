"""removed_nodes: names an admin removed (`corral node remove`), so that a node the engine still
reports comes back cordoned, not ready for work (services.nodes.remove_node, server.nodes.upsert_node)

Revision ID: 0021_removed_nodes
Revises: 0020_version_counters
Create Date: 2026-11-29 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_removed_nodes"
down_revision = "0020_version_counters"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "removed_nodes",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("removed_at", sa.Float(), nullable=False),
        sa.Column("removed_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_removed_nodes")),
    )


def downgrade() -> None:
    op.drop_table("removed_nodes")
