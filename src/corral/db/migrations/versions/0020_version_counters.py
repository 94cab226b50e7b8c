"""datasets.last_version, registered_models.last_version: the highest version number each has
ever given, so a number is never given twice (`name@3` means one content for good, even after v3,
the latest, was deleted). Filled from the versions there and the numbers jobs recorded (lineage
outlives a deleted version)

Revision ID: 0020_version_counters
Revises: 0019_workspace_last_used
Create Date: 2026-11-29 09:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_version_counters"
down_revision = "0019_workspace_last_used"
branch_labels = None
depends_on = None

# (table, column the used numbers are matched on, table of used numbers, its matching column)
USED = (
    ("datasets", "id", "dataset_versions", "dataset_id"),
    ("datasets", "id", "job_datasets", "dataset_id"),
    ("registered_models", "id", "model_versions", "model_id"),
    ("registered_models", "name", "job_models", "model_name"),
)


def upgrade() -> None:
    for table in ("datasets", "registered_models"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("last_version", sa.Integer(), nullable=False, server_default="0"))
    for table, key, used, match in USED:
        highest = f"(SELECT MAX(u.version) FROM {used} u WHERE u.{match} = {table}.{key})"
        op.execute(f"UPDATE {table} SET last_version = {highest} WHERE {highest} > last_version")


def downgrade() -> None:
    for table in ("registered_models", "datasets"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("last_version")
