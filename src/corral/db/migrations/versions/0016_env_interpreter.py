"""environment_versions.interpreter: the interpreter each version is built for, recorded
(CORRAL_ENV_PYTHON; the Slurm engine's default is /usr/bin/python3, not the server's own)

Revision ID: 0016_env_interpreter
Revises: 0015_incidents
Create Date: 2026-11-27 22:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_env_interpreter"
down_revision = "0015_incidents"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # "" on existing rows: built for the server's base interpreter, as every version was before
    with op.batch_alter_table("environment_versions") as batch:
        batch.add_column(sa.Column("interpreter", sa.String(length=255), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("environment_versions") as batch:
        batch.drop_column("interpreter")
