"""The admin audit log's tables (migration 0008_audit), on the one shared `Base`.

`audit_log` is append-only, enforced by the database, not only by the code: triggers refuse every
UPDATE, and every DELETE of a row not older than the cutoff held in `audit_purge_gate`. The gate's
cutoff is NULL (nothing may be deleted) except inside the retention transaction
(corral.services.audit.purge_before), which sets it, deletes and clears it before committing, so no
other connection ever sees it open. The statements are here (not only in the migration) so that a
schema made with `Base.metadata.create_all` (some tests) gets the same guard.

Times are unix seconds as floats, like the core tables.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import DDL, JSON, Float, Index, Integer, String, Text, event
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base

AUDIT_TABLE = "audit_log"
GATE_TABLE = "audit_purge_gate"
REFUSAL = "audit_log is append-only: rows are never updated, and deleted only by retention"


class AuditRecord(Base):
    """One state-changing action: who (`actor`, the credential it used, the source address), what
    (`action`, e.g. "group.quota.set", on `target_kind`/`target_id`), when, and the target's state
    before and after (secrets redacted before they get here)."""

    __tablename__ = AUDIT_TABLE
    __table_args__ = (
        Index("ix_audit_log_at", "at"),
        Index("ix_audit_log_actor_at", "actor", "at"),
        Index("ix_audit_log_target", "target_kind", "target_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(128))  # a user name, or "system:<loop>"
    actor_user_id: Mapped[int | None] = mapped_column(Integer)  # no FK: the record outlives the user
    credential: Mapped[str | None] = mapped_column(String(64))  # "token:<id>" | "session:<id>"
    source: Mapped[str | None] = mapped_column(String(128))  # the request's client address
    action: Mapped[str] = mapped_column(String(64))
    target_kind: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str] = mapped_column(String(255))
    before: Mapped[Any | None] = mapped_column(JSON)
    after: Mapped[Any | None] = mapped_column(JSON)
    detail: Mapped[str | None] = mapped_column(Text)


class AuditPurgeGate(Base):
    """One row (id 1): the cutoff below which retention may delete audit rows; NULL = closed."""

    __tablename__ = GATE_TABLE

    id: Mapped[int] = mapped_column(primary_key=True)
    cutoff: Mapped[float | None] = mapped_column(Float)


# The statements the migration runs too (it keeps its own copy: migrations do not change after
# release). SQLite: RAISE(ABORT) in a BEFORE trigger; PostgreSQL: one plpgsql function for both.
SQLITE_GUARD = (
    f"CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON {AUDIT_TABLE} "
    f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END",
    f"CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON {AUDIT_TABLE} "
    f"WHEN (SELECT cutoff FROM {GATE_TABLE} WHERE id = 1) IS NULL "
    f"OR OLD.at >= (SELECT cutoff FROM {GATE_TABLE} WHERE id = 1) "
    f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END",
)
POSTGRES_GUARD = (
    f"""CREATE OR REPLACE FUNCTION audit_log_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.at < (SELECT cutoff FROM {GATE_TABLE} WHERE id = 1) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '{REFUSAL}' USING ERRCODE = 'insufficient_privilege';
END $$""",
    f"CREATE TRIGGER audit_log_guard BEFORE UPDATE OR DELETE ON {AUDIT_TABLE} "
    "FOR EACH ROW EXECUTE FUNCTION audit_log_guard()",
)
GATE_ROW = f"INSERT INTO {GATE_TABLE} (id, cutoff) VALUES (1, NULL)"

for _statement in SQLITE_GUARD:
    event.listen(AuditRecord.__table__, "after_create", DDL(_statement).execute_if(dialect="sqlite"))
for _statement in POSTGRES_GUARD:
    event.listen(AuditRecord.__table__, "after_create", DDL(_statement).execute_if(dialect="postgresql"))
event.listen(AuditPurgeGate.__table__, "after_create", DDL(GATE_ROW))
