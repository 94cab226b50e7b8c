"""workspace_ids: on SQLite, `workspaces.id` becomes INTEGER PRIMARY KEY AUTOINCREMENT, so a
removed workspace's id is never given to another. The id is in the workspace's JupyterLab URL
(`/ws/<id>/lab`), in its jobs' specs (`CORRAL_WORKSPACE_BASE_URL`, kept after `corral ws rm`)
and in the audit log (`workspace:<id>`); SQLite handed out max(rowid)+1, so after `ws rm` the next
workspace, another user's too, took the same id: two workspaces' jobs and audit entries under
one id, and an old bookmark pointing at another user's workspace.

Same pattern as 0025_row_ids: the table is rebuilt (batch, recreate="always": copy, DROP, rename)
and sqlite_sequence is seeded above every id still recorded (the rows, the audit log's workspace
targets, the workspace jobs' base URLs). No table references `workspaces.id`, so the DROP cascades
to nothing whether foreign keys are on or off. PostgreSQL: nothing to do.

Revision ID: 0033_workspace_ids
Revises: 0032_eta_shown
Create Date: 2026-11-30 03:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0033_workspace_ids"
down_revision = "0032_eta_shown"
branch_labels = None
depends_on = None

BASE_URL = "json_extract(spec, '$.env.CORRAL_WORKSPACE_BASE_URL')"  # "/ws/<id>/"
# Every place a workspace id outlives its workspace, with the rows' own ids: the next id is above all.
IDS_RECORDED = (
    "SELECT MAX(id) FROM workspaces",
    # audit target ids are text; workspace targets are digits (CAST of anything else gives 0)
    "SELECT MAX(CAST(target_id AS INTEGER)) FROM audit_log WHERE target_kind = 'workspace'",
    # "/ws/7/" -> "7/" -> 7 (CAST reads the leading digits)
    f"SELECT MAX(CAST(substr({BASE_URL}, 5) AS INTEGER)) FROM jobs WHERE {BASE_URL} LIKE '/ws/%'",
)


def _rebuild(autoincrement: bool) -> None:
    with op.batch_alter_table(
        "workspaces", recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
    ) as batch:
        del batch  # the table is copied as it is; only its AUTOINCREMENT changes


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    _rebuild(autoincrement=True)
    highest = max((bind.execute(sa.text(q)).scalar() or 0 for q in IDS_RECORDED), default=0)
    # The copy's explicit ids set the sequence to max(id) already (or no row, when empty).
    updated = bind.execute(
        sa.text("UPDATE sqlite_sequence SET seq = MAX(seq, :n) WHERE name = 'workspaces'"), {"n": highest}
    )
    if updated.rowcount == 0 and highest > 0:
        bind.execute(
            sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES ('workspaces', :n)"), {"n": highest}
        )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    _rebuild(autoincrement=False)
    bind.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = 'workspaces'"))
