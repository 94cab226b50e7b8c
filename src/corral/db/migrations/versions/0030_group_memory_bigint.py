"""groups: memory_guaranteed_mib and memory_max_mib as 64-bit integers. The API takes up to 2**40
MiB for each (corral.api.schemas.QuotaIn, GroupIn), which PostgreSQL's 32-bit integer refused
with a 500 ("integer out of range") past 2**31 - 1 MiB (found by bench/fuzz_api.py --postgres).
SQLite's INTEGER is 64-bit already: nothing to change there (and no table rebuild).

Revision ID: 0030_group_memory_bigint
Revises: 0029_job_holds
Create Date: 2026-11-30 01:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030_group_memory_bigint"
down_revision = "0029_job_holds"
branch_labels = None
depends_on = None

COLUMNS = ("memory_guaranteed_mib", "memory_max_mib")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for column in COLUMNS:
            op.alter_column("groups", column, type_=sa.BigInteger(), existing_type=sa.Integer())


def downgrade() -> None:
    # Values past 2**31 - 1 do not fit back: the downgrade fails on them rather than cut them.
    if op.get_bind().dialect.name == "postgresql":
        for column in COLUMNS:
            op.alter_column("groups", column, type_=sa.Integer(), existing_type=sa.BigInteger())
