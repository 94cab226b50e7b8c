"""retired_names: the highest version number a deleted dataset, model or environment had given,
kept under its name, so that one created again with that name goes on from there (`d@1` of the
deleted dataset never names other data); environments.last_version, as datasets and models have
had since 0020 (a deleted latest environment version's number is not given again). Filled from
the versions there and, for names no dataset or model has any more, from the numbers jobs
recorded (lineage outlives the deletion).

Revision ID: 0022_retired_names
Revises: 0021_removed_nodes
Create Date: 2026-11-29 15:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022_retired_names"
down_revision = "0021_removed_nodes"
branch_labels = None
depends_on = None

# (kind, lineage table, its name column, the live table)
LINEAGE = (
    ("dataset", "job_datasets", "dataset_name", "datasets"),
    ("model", "job_models", "model_name", "registered_models"),
)


def upgrade() -> None:
    op.create_table(
        "retired_names",
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("last_version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("kind", "name", name=op.f("pk_retired_names")),
    )
    with op.batch_alter_table("environments") as batch:
        batch.add_column(sa.Column("last_version", sa.Integer(), nullable=False, server_default="0"))
    highest = "(SELECT MAX(v.version) FROM environment_versions v WHERE v.environment_id = environments.id)"
    op.execute(f"UPDATE environments SET last_version = {highest} WHERE {highest} > last_version")
    for kind, lineage, column, live in LINEAGE:
        op.execute(
            f"INSERT INTO retired_names (kind, name, last_version) SELECT '{kind}', {column}, MAX(version) "
            f"FROM {lineage} WHERE {column} NOT IN (SELECT name FROM {live}) GROUP BY {column}"
        )


def downgrade() -> None:
    with op.batch_alter_table("environments") as batch:
        batch.drop_column("last_version")
    op.drop_table("retired_names")
