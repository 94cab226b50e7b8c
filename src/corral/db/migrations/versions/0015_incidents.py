"""incidents and remediation rules: incidents, incident_events, incident_postmortems,
remediation_rule_versions, remediation_runs

Revision ID: 0015_incidents
Revises: 0014_workspaces
Create Date: 2026-11-25 18:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_incidents"
down_revision = "0014_workspaces"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=255), nullable=False),
        sa.Column("title", sa.String(length=512), nullable=False),
        sa.Column("severity", sa.String(length=8), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("links", sa.JSON(), nullable=False),
        sa.Column("firing", sa.JSON(), nullable=False),
        sa.Column("fire_count", sa.Integer(), nullable=False),
        sa.Column("opened_at", sa.Float(), nullable=False),
        sa.Column("last_fired_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("acknowledged_at", sa.Float(), nullable=True),
        sa.Column("acknowledged_by", sa.String(length=64), nullable=False),
        sa.Column("mitigated_at", sa.Float(), nullable=True),
        sa.Column("resolved_at", sa.Float(), nullable=True),
        sa.Column("closed_at", sa.Float(), nullable=True),
        sa.Column("ack_breached", sa.Boolean(), nullable=False),
        sa.Column("mitigate_breached", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incidents")),
    )
    op.create_index(op.f("ix_incidents_fingerprint"), "incidents", ["fingerprint"], unique=False)
    op.create_index(op.f("ix_incidents_opened_at"), "incidents", ["opened_at"], unique=False)
    op.create_index(op.f("ix_incidents_state"), "incidents", ["state"], unique=False)
    op.create_table(
        "remediation_rule_versions",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_remediation_rule_versions")),
    )
    op.create_table(
        "remediation_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(length=64), nullable=False),
        sa.Column("rules_version", sa.Integer(), nullable=False),
        sa.Column("signal", sa.String(length=128), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("actions", sa.JSON(), nullable=False),
        sa.Column("removed_nodes", sa.Integer(), nullable=False),
        sa.Column("removed_gpus", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_remediation_runs")),
    )
    op.create_index(op.f("ix_remediation_runs_at"), "remediation_runs", ["at"], unique=False)
    op.create_index(op.f("ix_remediation_runs_rule"), "remediation_runs", ["rule"], unique=False)
    op.create_table(
        "incident_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incidents.id"],
            name=op.f("fk_incident_events_incident_id_incidents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incident_events")),
    )
    op.create_index(op.f("ix_incident_events_incident_id"), "incident_events", ["incident_id"], unique=False)
    op.create_table(
        "incident_postmortems",
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("impact", sa.Text(), nullable=False),
        sa.Column("root_cause", sa.Text(), nullable=False),
        sa.Column("action_items", sa.JSON(), nullable=False),
        sa.Column("author", sa.String(length=64), nullable=False),
        sa.Column("written_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incidents.id"],
            name=op.f("fk_incident_postmortems_incident_id_incidents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("incident_id", name=op.f("pk_incident_postmortems")),
    )


def downgrade() -> None:
    op.drop_table("incident_postmortems")
    op.drop_index(op.f("ix_incident_events_incident_id"), table_name="incident_events")
    op.drop_table("incident_events")
    op.drop_index(op.f("ix_remediation_runs_rule"), table_name="remediation_runs")
    op.drop_index(op.f("ix_remediation_runs_at"), table_name="remediation_runs")
    op.drop_table("remediation_runs")
    op.drop_table("remediation_rule_versions")
    op.drop_index(op.f("ix_incidents_state"), table_name="incidents")
    op.drop_index(op.f("ix_incidents_opened_at"), table_name="incidents")
    op.drop_index(op.f("ix_incidents_fingerprint"), table_name="incidents")
    op.drop_table("incidents")
