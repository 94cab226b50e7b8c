"""Storage tables (corral.storage): the stable Unix ids of users and groups on the local engine.

A row is never deleted or reassigned: a uid/gid once given to a user or group stays theirs, so a
file left on the storage root by a deleted user never becomes readable by whoever comes next. A
subject is named by (kind, its row id, its created_at): a user deleted and created again under the
same name is a new subject with a new id (SQLite may reuse the row id, never the creation time).
"""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base


class StorageIdentity(Base):
    __tablename__ = "storage_identities"
    __table_args__ = (
        UniqueConstraint("kind", "number", name="uq_storage_identities_kind_number"),
        UniqueConstraint("kind", "subject_id", "subject_created_at", name="uq_storage_identities_subject"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))  # "user" (a uid) | "group" (a gid)
    subject_id: Mapped[int] = mapped_column(Integer)  # users.id or groups.id (no FK: rows outlive them)
    subject_created_at: Mapped[float] = mapped_column(Float)
    subject_name: Mapped[str] = mapped_column(String(64))  # for `corral storage ids` and audits
    number: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class CodeClaim(Base):
    """A `--code` blob a user has shown they hold: they uploaded its bytes, which hashed to its
    sha256 (migration 0023). The blob on disk is one for everyone (deduplicated); whether it
    counts as present for a caller (`POST /code/missing`, a manifest) is whether they or a
    member of one of their groups has a claim, so nobody learns whether another user stored a
    file by asking for its hash (corral.services.storage, docs/security.md)."""

    __tablename__ = "code_claims"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[float] = mapped_column(Float)


class CodeSnapshotClaim(Base):
    """A `--code` snapshot a user may run: they posted its manifest with every blob theirs (or
    their groups'), or (migration 0026) a job of theirs named it before snapshots were claimed. A
    job's `code:` counts only when its submitter or a member of one of their groups has a claim,
    so an id told to (or guessed by) anyone else runs nobody's code (docs/security.md)."""

    __tablename__ = "code_snapshot_claims"

    snapshot: Mapped[str] = mapped_column(String(64), primary_key=True)  # the snapshot id
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[float] = mapped_column(Float)
