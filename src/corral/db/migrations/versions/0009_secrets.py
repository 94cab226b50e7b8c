"""secrets for jobs: job_secrets (per-user and per-group, AES-GCM ciphertext)

Revision ID: 0009_secrets
Revises: 0008_audit
Create Date: 2026-11-25 15:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_secrets"
down_revision = "0008_audit"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_secrets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("group_id", sa.Integer(), nullable=True),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("key_id", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("updated_by", sa.String(length=64), nullable=False),
        sa.CheckConstraint("(user_id IS NULL) <> (group_id IS NULL)", name=op.f("ck_job_secrets_one_scope")),
        sa.ForeignKeyConstraint(
            ["group_id"], ["groups.id"], name=op.f("fk_job_secrets_group_id_groups"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_job_secrets_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_secrets")),
        sa.UniqueConstraint("group_id", "name", name=op.f("uq_job_secrets_group_id")),
        sa.UniqueConstraint("user_id", "name", name=op.f("uq_job_secrets_user_id")),
    )
    with op.batch_alter_table("job_secrets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_secrets_group_id"), ["group_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_secrets_user_id"), ["user_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_secrets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_secrets_user_id"))
        batch_op.drop_index(batch_op.f("ix_job_secrets_group_id"))
    op.drop_table("job_secrets")
