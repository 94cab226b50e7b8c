"""row_ids: on SQLite, `ssh_keys.id` and `oncall_overrides.id` become INTEGER PRIMARY KEY
AUTOINCREMENT, so a removed key's or override's id is never given to another. Both are removed by
id (`corral key rm ID`, `corral oncall schedule rm-override NAME ID`); SQLite handed out
max(rowid)+1, so the newest removed id went to the next key or override, and an admin's retried
removal then removed that one instead of answering "no such key".

Same pattern as 0024_job_ids: each table is rebuilt (batch, recreate="always": copy, DROP,
rename) and sqlite_sequence is seeded above every id still recorded (the rows, and the audit log's
entries naming a key or an override). No table references either one, so the DROP cascades to
nothing whether foreign keys are on or off: 0024's guard is not needed. PostgreSQL: nothing to do.

Revision ID: 0025_row_ids
Revises: 0024_job_ids
Create Date: 2026-11-29 19:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025_row_ids"
down_revision = "0024_job_ids"
branch_labels = None
depends_on = None

# Per table, every place its ids are recorded, its own rows first: the next id is above all.
IDS_RECORDED = {
    "ssh_keys": (
        "SELECT MAX(id) FROM ssh_keys",
        # audit target ids are text; key targets are digits (CAST of anything else gives 0)
        "SELECT MAX(CAST(target_id AS INTEGER)) FROM audit_log WHERE target_kind = 'ssh_key'",
    ),
    "oncall_overrides": (
        "SELECT MAX(id) FROM oncall_overrides",
        # an override's audit entry names its schedule; the override's id is in after / before
        "SELECT MAX(CAST(json_extract(COALESCE(after, before), '$.id') AS INTEGER)) FROM audit_log"
        " WHERE action IN ('oncall.override.add', 'oncall.override.remove')",
    ),
}


def _rebuild(table: str, autoincrement: bool) -> None:
    with op.batch_alter_table(
        table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
    ) as batch:
        del batch  # the table is copied as it is; only its AUTOINCREMENT changes


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    for table, queries in IDS_RECORDED.items():
        _rebuild(table, autoincrement=True)
        highest = max((bind.execute(sa.text(q)).scalar() or 0 for q in queries), default=0)
        # The copy's explicit ids set the sequence to max(id) already (or no row, when empty).
        updated = bind.execute(
            sa.text("UPDATE sqlite_sequence SET seq = MAX(seq, :n) WHERE name = :t"),
            {"n": highest, "t": table},
        )
        if updated.rowcount == 0 and highest > 0:
            bind.execute(
                sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES (:t, :n)"), {"t": table, "n": highest}
            )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    for table in IDS_RECORDED:
        _rebuild(table, autoincrement=False)
        bind.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = :t"), {"t": table})
