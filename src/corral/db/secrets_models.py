"""The `job_secrets` table: per-user and per-group secrets for jobs, encrypted at rest
(corral.services.secrets). Exactly one of `user_id` / `group_id` is set: the secret's scope."""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Float, ForeignKey, LargeBinary, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base


class JobSecret(Base):
    __tablename__ = "job_secrets"
    __table_args__ = (
        # NULLs are distinct in a UNIQUE constraint (SQLite and PostgreSQL): each pair constrains
        # only the rows of its own scope.
        UniqueConstraint("user_id", "name"),
        UniqueConstraint("group_id", "name"),
        CheckConstraint("(user_id IS NULL) <> (group_id IS NULL)", name="one_scope"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    group_id: Mapped[int | None] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    # AES-256-GCM: 12-byte nonce + ciphertext + tag; the scope and name are its associated data,
    # so a ciphertext copied onto another row does not decrypt.
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    key_id: Mapped[str] = mapped_column(String(16))  # fingerprint of the key it was sealed with
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str] = mapped_column(String(64))  # user name of who last set it
