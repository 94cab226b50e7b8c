"""attempts: ix_attempts_number_started (number, started_at) replaces ix_attempts_number_created
(number, created_at, 0032). An outcome of the estimated-start calibration is now the job's first
attempt's start (when the engine started it, what the user sees), not its placement: the schedule
loop reads the first attempts started since it last looked, and a rebuilt calibration the last
ones started, both as an index range instead of scanning and sorting every attempt. Nothing else
read the placement-time index.

Revision ID: 0034_eta_outcome_start
Revises: 0033_workspace_ids
Create Date: 2026-11-30 06:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0034_eta_outcome_start"
down_revision = "0033_workspace_ids"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_attempts_number_created", table_name="attempts")
    op.create_index("ix_attempts_number_started", "attempts", ["number", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_attempts_number_started", table_name="attempts")
    op.create_index("ix_attempts_number_created", "attempts", ["number", "created_at"])
