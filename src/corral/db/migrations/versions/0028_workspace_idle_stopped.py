"""workspaces.idle_stopped_at: when the idle policy stopped the workspace's current job, written
by the idle check in the transaction that requests the cancel and cleared by the next start.
`corral ws ls/show` (and the API's `idle_stopped_at`) read it; before, they searched the current
job's events for an `idle_gpu` one whose message ended in ": stopped", one query per cancelled
workspace and a coupling to the wording of the idle check's message.

Workspaces stopped so before the upgrade: filled from those same events (the latest such event
of a current job whose cancel was requested), so an upgraded server shows what it showed before.

Revision ID: 0028_workspace_idle_stopped
Revises: 0027_jobs_updated_index
Create Date: 2026-11-30 00:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028_workspace_idle_stopped"
down_revision = "0027_jobs_updated_index"
branch_labels = None
depends_on = None

# What the idle check's stop event ended with up to this revision ("GPUs still idle (0.0%) 600 s
# after the warning: stopped"); only this backfill reads it.
OLD_STOP_EVENT_END = ": stopped"


def upgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        batch.add_column(sa.Column("idle_stopped_at", sa.Float(), nullable=True))
    workspaces = sa.table("workspaces", sa.column("current_job_id"), sa.column("idle_stopped_at"))
    jobs = sa.table("jobs", sa.column("id"), sa.column("cancel_requested", sa.Boolean()))
    events = sa.table(
        "job_events", sa.column("id"), sa.column("job_id"), sa.column("at"), sa.column("kind"),
        sa.column("message", sa.Text()),
    )  # fmt: skip
    latest_stop = (
        sa.select(events.c.at)
        .where(
            events.c.job_id == workspaces.c.current_job_id,
            events.c.kind == "idle_gpu",
            events.c.message.endswith(OLD_STOP_EVENT_END, autoescape=True),
        )
        .order_by(events.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    cancelled = sa.select(jobs.c.id).where(jobs.c.cancel_requested.is_(sa.true()))
    op.execute(
        sa.update(workspaces)
        .where(workspaces.c.current_job_id.in_(cancelled))
        .values(idle_stopped_at=latest_stop)
    )


def downgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        batch.drop_column("idle_stopped_at")
