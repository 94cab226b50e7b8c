"""workspace_passes: one-time tickets that hand a browser from the portal's `/ws/<id>/` to the
workspace origin (its own listener, CORRAL_WORKSPACE_PORT), and the cookies of that origin they
are exchanged for (corral.services.workspace_passes); a ticket is bound to the browser that asked for
it by the hash of a state secret in that browser's cookie. Only sha256 hashes of the secrets are
stored; a row goes with its portal session (logout, revoke) and with its workspace.

Revision ID: 0039_workspace_passes
Revises: 0038_page_claims
Create Date: 2026-11-30 21:15:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0039_workspace_passes"
down_revision = "0038_page_claims"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workspace_passes",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("session_hash", sa.String(length=64), nullable=False),
        sa.Column("path", sa.String(length=2048), nullable=False),
        sa.Column("state_hash", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_workspace_passes_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_hash"],
            ["web_sessions.id_hash"],
            name=op.f("fk_workspace_passes_session_hash_web_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_workspace_passes")),
    )
    op.create_index(op.f("ix_workspace_passes_workspace_id"), "workspace_passes", ["workspace_id"])
    op.create_index(op.f("ix_workspace_passes_session_hash"), "workspace_passes", ["session_hash"])


def downgrade() -> None:
    op.drop_index(op.f("ix_workspace_passes_session_hash"), table_name="workspace_passes")
    op.drop_index(op.f("ix_workspace_passes_workspace_id"), table_name="workspace_passes")
    op.drop_table("workspace_passes")
