"""login protection: login_failures (counters and lockouts per account and per source address)

Revision ID: 0005_auth
Revises: 0004_quotas
Create Date: 2026-11-25 13:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_auth"
down_revision = "0004_quotas"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "login_failures",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=8), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("first_failed_at", sa.Float(), nullable=False),
        sa.Column("last_failed_at", sa.Float(), nullable=False),
        sa.Column("locked_until", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_login_failures")),
        sa.UniqueConstraint("scope", "key", name=op.f("uq_login_failures_scope")),
    )


def downgrade() -> None:
    op.drop_table("login_failures")
