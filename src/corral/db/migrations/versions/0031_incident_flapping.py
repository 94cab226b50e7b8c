"""incidents.flapping_since: when the incident began flapping (its `reopens`-th reopen within the
rules file's `incidents.flapping.within`), NULL when it is not flapping. Written, and cleared after
its quiet period, by corral.services.incidents by compare-and-set; incident_paging pages once when
it begins and not at the reopens while it lasts (docs/operations.md, "Flapping").

Incidents open at the upgrade are not flapping: their reopens before it counted for nothing, and
the first reopens after it are paged as before until the threshold is reached.

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


def downgrade() -> None:
    with op.batch_alter_table("incidents") as batch:
        batch.drop_column("flapping_since")
