"""jobs: the first estimated wait the scheduler showed for the job (its roll's own, before the
calibration) and when it showed it. Once the job starts, that pair and its first attempt's start
are one outcome of the estimated-start calibration (corral.scheduler.eta_calibration), which
corrects the next estimates shown. attempts: ix_attempts_number_created (number, created_at), so
that a server rebuilding the calibration reads the last first attempts as an index range instead of
scanning and sorting every attempt.

Revision ID: 0032_eta_shown
Revises: 0031_incident_flapping
Create Date: 2026-11-30 03:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0032_eta_shown"
down_revision = "0031_incident_flapping"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL on existing rows: no estimate recorded, so they are no outcome of the calibration
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("eta_shown_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("eta_shown_wait_s", sa.Float(), nullable=True))
    op.create_index("ix_attempts_number_created", "attempts", ["number", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_attempts_number_created", table_name="attempts")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("eta_shown_wait_s")
        batch.drop_column("eta_shown_at")
