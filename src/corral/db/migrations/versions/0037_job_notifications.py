"""Job notifications: `job_notifications`, the outbox the lifecycle writes in the transaction that
moves a job (started, succeeded, failed, cancelled, requeued) when its spec's `notify` asks for
it, `job_notify_deliveries`, one message to one of the owner's contacts, and
`job_notify_defaults`, a user's own `notify` for the jobs they submit without one
(corral.services.job_notify, corral.monitor.job_notifier).

Revision ID: 0037_job_notifications
Revises: 0036_job_labels
Create Date: 2026-11-30 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0037_job_notifications"
down_revision = "0036_job_labels"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_notifications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("digest_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_notifications_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_job_notifications_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_notifications")),
    )
    with op.batch_alter_table("job_notifications", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_notifications_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_notifications_state"), ["state"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_notifications_digest_id"), ["digest_id"], unique=False)
    op.create_table(
        "job_notify_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("address", sa.String(length=1024), nullable=False),
        sa.Column("subject", sa.String(length=300), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("events", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("sent_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_job_notify_deliveries_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_notify_deliveries")),
    )
    with op.batch_alter_table("job_notify_deliveries", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_notify_deliveries_digest_id"), ["digest_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_notify_deliveries_user_id"), ["user_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_notify_deliveries_state"), ["state"], unique=False)
    op.create_table(
        "job_notify_defaults",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("on", sa.JSON(), nullable=False),
        sa.Column("to", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_job_notify_defaults_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_job_notify_defaults")),
    )


def downgrade() -> None:
    op.drop_table("job_notify_defaults")
    op.drop_table("job_notify_deliveries")
    op.drop_table("job_notifications")
