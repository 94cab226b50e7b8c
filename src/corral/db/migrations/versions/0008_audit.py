"""admin audit log: audit_log (append-only, guarded by triggers) and audit_purge_gate

Revision ID: 0008_audit
Revises: 0007_storage
Create Date: 2026-11-25 15:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_audit"
down_revision = "0007_storage"
branch_labels = None
depends_on = None

REFUSAL = "audit_log is append-only: rows are never updated, and deleted only by retention"
# The same statements as corral.db.audit_models (copied: a migration does not change after release).
SQLITE_GUARD = (
    f"CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log "
    f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END",
    f"CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log "
    f"WHEN (SELECT cutoff FROM audit_purge_gate WHERE id = 1) IS NULL "
    f"OR OLD.at >= (SELECT cutoff FROM audit_purge_gate WHERE id = 1) "
    f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END",
)
POSTGRES_GUARD = (
    f"""CREATE OR REPLACE FUNCTION audit_log_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.at < (SELECT cutoff FROM audit_purge_gate WHERE id = 1) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '{REFUSAL}' USING ERRCODE = 'insufficient_privilege';
END $$""",
    "CREATE TRIGGER audit_log_guard BEFORE UPDATE OR DELETE ON audit_log "
    "FOR EACH ROW EXECUTE FUNCTION audit_log_guard()",
)


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("actor_user_id", sa.Integer(), nullable=True),
        sa.Column("credential", sa.String(length=64), nullable=True),
        sa.Column("source", sa.String(length=128), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target_kind", sa.String(length=32), nullable=False),
        sa.Column("target_id", sa.String(length=255), nullable=False),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_actor_at", "audit_log", ["actor", "at"])
    op.create_index("ix_audit_log_target", "audit_log", ["target_kind", "target_id"])
    op.create_table(
        "audit_purge_gate",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cutoff", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_purge_gate")),
    )
    op.execute("INSERT INTO audit_purge_gate (id, cutoff) VALUES (1, NULL)")
    guard = SQLITE_GUARD if op.get_bind().dialect.name == "sqlite" else POSTGRES_GUARD
    for statement in guard:
        op.execute(statement)


def downgrade() -> None:
    op.drop_table("audit_purge_gate")
    op.drop_table("audit_log")  # its triggers go with it
    if op.get_bind().dialect.name != "sqlite":
        op.execute("DROP FUNCTION IF EXISTS audit_log_guard()")
