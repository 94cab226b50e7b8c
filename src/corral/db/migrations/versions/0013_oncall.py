"""oncall: users.email, contact_methods, oncall_schedules/_layers/_overrides,
escalation_policies, pages and page_notifications (corral.services.oncall, corral.services.paging)

Revision ID: 0013_oncall
Revises: 0012_catalog
Create Date: 2026-11-25 18:34:53.351397
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_oncall"
down_revision = "0012_catalog"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "escalation_policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.Column("repeat", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_escalation_policies")),
        sa.UniqueConstraint("name", name=op.f("uq_escalation_policies_name")),
    )
    op.create_table(
        "pages",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("policy_name", sa.String(length=64), nullable=False),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.Column("repeat", sa.Integer(), nullable=False),
        sa.Column("subject", sa.String(length=300), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("acked_at", sa.Float(), nullable=True),
        sa.Column("acked_by", sa.String(length=64), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("log", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pages")),
        sa.UniqueConstraint("key", name=op.f("uq_pages_key")),
    )
    with op.batch_alter_table("pages", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_pages_next_at"), ["next_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_pages_state"), ["state"], unique=False)

    op.create_table(
        "contact_methods",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("address", sa.String(length=1024), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_contact_methods_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_contact_methods")),
        sa.UniqueConstraint("user_id", "kind", "address", name=op.f("uq_contact_methods_user_id")),
    )
    with op.batch_alter_table("contact_methods", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_contact_methods_user_id"), ["user_id"], unique=False)

    op.create_table(
        "oncall_schedules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("time_zone", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("fallback_user_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["fallback_user_id"],
            ["users.id"],
            name=op.f("fk_oncall_schedules_fallback_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_oncall_schedules")),
        sa.UniqueConstraint("name", name=op.f("uq_oncall_schedules_name")),
    )
    op.create_table(
        "page_notifications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("page_id", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("address", sa.String(length=1024), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("sent_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["page_id"], ["pages.id"], name=op.f("fk_page_notifications_page_id_pages"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_page_notifications_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_page_notifications")),
        sa.UniqueConstraint(
            "page_id",
            "round",
            "step",
            "user_id",
            "kind",
            "address",
            name=op.f("uq_page_notifications_page_id"),
        ),
    )
    with op.batch_alter_table("page_notifications", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_page_notifications_page_id"), ["page_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_page_notifications_state"), ["state"], unique=False)

    op.create_table(
        "oncall_layers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("rotation", sa.String(length=8), nullable=False),
        sa.Column("start_date", sa.String(length=10), nullable=False),
        sa.Column("handoff", sa.String(length=5), nullable=False),
        sa.Column("members", sa.JSON(), nullable=False),
        sa.Column("restrict_from", sa.String(length=5), nullable=True),
        sa.Column("restrict_to", sa.String(length=5), nullable=True),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["oncall_schedules.id"],
            name=op.f("fk_oncall_layers_schedule_id_oncall_schedules"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_oncall_layers")),
        sa.UniqueConstraint("schedule_id", "position", name=op.f("uq_oncall_layers_schedule_id")),
    )
    op.create_table(
        "oncall_overrides",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("start", sa.Float(), nullable=False),
        sa.Column("end", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["oncall_schedules.id"],
            name=op.f("fk_oncall_overrides_schedule_id_oncall_schedules"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_oncall_overrides_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_oncall_overrides")),
    )
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("email", sa.String(length=254), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("email")

    op.drop_table("oncall_overrides")
    op.drop_table("oncall_layers")
    with op.batch_alter_table("page_notifications", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_page_notifications_state"))
        batch_op.drop_index(batch_op.f("ix_page_notifications_page_id"))

    op.drop_table("page_notifications")
    op.drop_table("oncall_schedules")
    with op.batch_alter_table("contact_methods", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_contact_methods_user_id"))

    op.drop_table("contact_methods")
    with op.batch_alter_table("pages", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pages_state"))
        batch_op.drop_index(batch_op.f("ix_pages_next_at"))

    op.drop_table("pages")
    op.drop_table("escalation_policies")
