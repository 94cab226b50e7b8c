"""code_claims: which users uploaded each `--code` blob (its bytes, checked against its sha256),
so that a blob counts as present only for them and their groups' members: `POST /code/missing`
no longer tells anyone whether another user stored a file of a given hash. Blobs stored before
have no claims: each user uploads such a file once more (deduplicated on disk).

Revision ID: 0023_code_claims
Revises: 0022_retired_names
Create Date: 2026-11-29 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023_code_claims"
down_revision = "0022_retired_names"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "code_claims",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_code_claims_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("sha256", "user_id", name=op.f("pk_code_claims")),
    )
    op.create_index(op.f("ix_code_claims_user_id"), "code_claims", ["user_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_code_claims_user_id"), table_name="code_claims")
    op.drop_table("code_claims")
