"""storage: storage_identities (stable uid per user, gid per group, never reused)

Revision ID: 0007_storage
Revises: 0006_diag
Create Date: 2026-11-25 15:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_storage"
down_revision = "0006_diag"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "storage_identities",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("subject_id", sa.Integer(), nullable=False),
        sa.Column("subject_created_at", sa.Float(), nullable=False),
        sa.Column("subject_name", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_storage_identities")),
        sa.UniqueConstraint("kind", "number", name="uq_storage_identities_kind_number"),
        sa.UniqueConstraint("kind", "subject_id", "subject_created_at", name="uq_storage_identities_subject"),
    )


def downgrade() -> None:
    op.drop_table("storage_identities")
