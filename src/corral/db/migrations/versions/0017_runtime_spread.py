"""jobs: the spread and basis of the runtime estimate (the 25th/75th percentile of the runs it
came from, which history level: corral.scheduler.runtimes) and the job's GPUs (the user+size
level of that history).

Revision ID: 0017_runtime_spread
Revises: 0016_env_interpreter
Create Date: 2026-11-28 01:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_runtime_spread"
down_revision = "0016_env_interpreter"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL on existing rows: no spread known, and their size is not counted in the user+size level
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("gpus", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("runtime_estimate_low_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("runtime_estimate_high_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("runtime_estimate_basis", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("runtime_estimate_basis")
        batch.drop_column("runtime_estimate_high_s")
        batch.drop_column("runtime_estimate_low_s")
        batch.drop_column("gpus")
