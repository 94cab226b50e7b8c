"""incidents.flapping_since: when the incident began flapping (its `reopens`-th reopen within the
rules file's `incidents.flapping.within`), NULL when it is not flapping. Written, and cleared after
its quiet period (or when the incident closes), by corral.services.incidents by compare-and-set;
incident_paging pages once when it begins and not at the reopens while it lasts
(docs/operations.md, "Flapping").

Incidents open at the upgrade are not flapping until they next reopen. That reopen counts every
reopen on the incident's timeline within `within`, those from before the upgrade included (the
timeline's `reopened` lines predate this revision): an incident that reopened twice in the hour
before the upgrade begins flapping at its first reopen after it, and pages once, saying so.

ix_incidents_flapping: the flapping incidents by grouping key (partial: only those flapping), which
the incidents loop reads every 5 s.

Revision ID: 0031_incident_flapping
Revises: 0030_group_memory_bigint
Create Date: 2026-11-30 03:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031_incident_flapping"
down_revision = "0030_group_memory_bigint"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.add_column(sa.Column("flapping_since", sa.Float(), nullable=True))
    # Partial: the incidents loop reads the flapping incidents every 5 s, by key; few ever are.
    flapping = sa.text("flapping_since IS NOT NULL")
    op.create_index(
        "ix_incidents_flapping",
        "incidents",
        ["fingerprint"],
        postgresql_where=flapping,
        sqlite_where=flapping,
    )


def downgrade() -> None:
    op.drop_index("ix_incidents_flapping", table_name="incidents")
    with op.batch_alter_table("incidents") as batch:
        batch.drop_column("flapping_since")
