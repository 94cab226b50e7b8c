"""environments: environments and environment_versions (the environments catalogue)

Revision ID: 0011_environments
Revises: 0010_datasets
Create Date: 2026-11-25 18:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_environments"
down_revision = "0010_datasets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "environments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=True),
        sa.Column("visibility", sa.String(length=16), nullable=False),
        sa.Column("official", sa.Boolean(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_environments_owner_id_users"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["group_id"], ["groups.id"], name=op.f("fk_environments_group_id_groups"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environments")),
        sa.UniqueConstraint("name", name=op.f("uq_environments_name")),
    )
    op.create_index(op.f("ix_environments_owner_id"), "environments", ["owner_id"], unique=False)
    op.create_table(
        "environment_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("source_kind", sa.String(length=16), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("python", sa.String(length=32), nullable=False),
        sa.Column("lock", sa.Text(), nullable=True),
        sa.Column("cache_key", sa.String(length=64), nullable=True),
        sa.Column("cache_hit", sa.Boolean(), nullable=False),
        sa.Column("build_job_id", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("built_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["environments.id"],
            name=op.f("fk_environment_versions_environment_id_environments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environment_versions")),
        sa.UniqueConstraint("environment_id", "version", name=op.f("uq_environment_versions_environment_id")),
    )
    for column in ("environment_id", "state", "cache_key", "build_job_id"):
        op.create_index(
            op.f(f"ix_environment_versions_{column}"), "environment_versions", [column], unique=False
        )


def downgrade() -> None:
    for column in ("environment_id", "state", "cache_key", "build_job_id"):
        op.drop_index(op.f(f"ix_environment_versions_{column}"), table_name="environment_versions")
    op.drop_table("environment_versions")
    op.drop_index(op.f("ix_environments_owner_id"), table_name="environments")
    op.drop_table("environments")
