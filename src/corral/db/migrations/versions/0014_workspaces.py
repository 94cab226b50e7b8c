"""workspaces: interactive workspaces and the per-group idle timeouts

Revision ID: 0014_workspaces
Revises: 0013_oncall
Create Date: 2026-11-25 18:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_workspaces"
down_revision = "0013_oncall"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workspaces",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_model", sa.String(length=256), nullable=True),
        sa.Column("cpus", sa.Float(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.Column("environment", sa.String(length=256), nullable=False),
        sa.Column("idle_timeout_s", sa.Float(), nullable=True),
        sa.Column("current_job_id", sa.Integer(), nullable=True),
        sa.Column("jupyter_token", sa.String(length=64), nullable=False),
        sa.Column("reclaimed_gpu_hours", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["current_job_id"],
            ["jobs.id"],
            name=op.f("fk_workspaces_current_job_id_jobs"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["group_id"], ["groups.id"], name=op.f("fk_workspaces_group_id_groups"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_workspaces_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workspaces")),
        sa.UniqueConstraint("user_id", "name", name=op.f("uq_workspaces_user_id")),
    )
    op.create_index(op.f("ix_workspaces_current_job_id"), "workspaces", ["current_job_id"], unique=True)
    op.create_index(op.f("ix_workspaces_group_id"), "workspaces", ["group_id"], unique=False)
    op.create_index(op.f("ix_workspaces_user_id"), "workspaces", ["user_id"], unique=False)
    op.create_table(
        "workspace_group_policies",
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.Column("default_idle_timeout_s", sa.Float(), nullable=True),
        sa.Column("max_idle_timeout_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["group_id"],
            ["groups.id"],
            name=op.f("fk_workspace_group_policies_group_id_groups"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("group_id", name=op.f("pk_workspace_group_policies")),
    )


def downgrade() -> None:
    op.drop_table("workspace_group_policies")
    op.drop_index(op.f("ix_workspaces_user_id"), table_name="workspaces")
    op.drop_index(op.f("ix_workspaces_group_id"), table_name="workspaces")
    op.drop_index(op.f("ix_workspaces_current_job_id"), table_name="workspaces")
    op.drop_table("workspaces")
