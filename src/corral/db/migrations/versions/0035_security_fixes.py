"""oncall_schedules.feed_nonce: a random value per schedule in the HMAC of its calendar
subscription URL (corral.services.oncall_feed), new when the schedule is created and when an
admin rotates its feed, so deleting a schedule or `corral oncall feed rotate NAME` revokes every
URL handed out before (review104 finding 12). Each existing schedule gets a nonce of its own here;
the URLs signed before (name only) stop working at the upgrade, and admins and members read the
new one from `corral oncall schedule show NAME`.

Revision ID: 0035_security_fixes
Revises: 0034_eta_outcome_start
Create Date: 2026-11-30 10:00:00.000000
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0035_security_fixes"
down_revision = "0034_eta_outcome_start"
branch_labels = None
depends_on = None

SCHEDULES = sa.table(
    "oncall_schedules", sa.column("id", sa.Integer()), sa.column("feed_nonce", sa.String(32))
)


def upgrade() -> None:
    with op.batch_alter_table("oncall_schedules", schema=None) as batch_op:
        batch_op.add_column(sa.Column("feed_nonce", sa.String(length=32), nullable=True))
    bind = op.get_bind()
    for (schedule_id,) in bind.execute(sa.select(SCHEDULES.c.id)).all():
        bind.execute(
            SCHEDULES.update().where(SCHEDULES.c.id == schedule_id).values(feed_nonce=secrets.token_hex(16))
        )
    with op.batch_alter_table("oncall_schedules", schema=None) as batch_op:
        batch_op.alter_column("feed_nonce", existing_type=sa.String(length=32), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("oncall_schedules", schema=None) as batch_op:
        batch_op.drop_column("feed_nonce")
