"""Tables of datasets, uploads, job lineage and storage quotas, on the one shared `Base`
(migration 0010_datasets). Times are unix seconds as floats, like the core tables."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base


class Dataset(Base):
    """A named dataset, owned by one user or one group (exactly one of the two owner columns is
    set). Names are unique across the installation, so `data/<name>` means one thing."""

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    owner_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    owner_group_id: Mapped[int | None] = mapped_column(
        ForeignKey("groups.id", ondelete="CASCADE"), index=True
    )
    public: Mapped[bool] = mapped_column(Boolean, default=False)  # readable by every user
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    # The highest version number ever given (migration 0020): a deleted version's number is
    # never given again, so `name@3` means one content for good.
    last_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class DatasetVersion(Base):
    """A complete, immutable version: its files live in `<storage root>/data/<dataset id>/v<N>/`.
    A row exists only once every byte is there and checked (uploads.complete)."""

    __tablename__ = "dataset_versions"
    __table_args__ = (UniqueConstraint("dataset_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[int] = mapped_column(BigInteger)
    digest: Mapped[str] = mapped_column(String(64))  # sha256 of the manifest (uploads.manifest_digest)
    source: Mapped[str] = mapped_column(String(16))  # "upload" | "import"
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))


class DatasetShare(Base):
    """Members of `group_id` may read every version of the dataset."""

    __tablename__ = "dataset_shares"

    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), primary_key=True)


class DatasetUpload(Base):
    """A resumable upload session: what the client declared (checked against the quota before
    any byte is written), the files registered so far and the bytes received. Staged under
    `<storage root>/data/.uploads/<id>/`; `complete` renames it into place."""

    __tablename__ = "dataset_uploads"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # random hex, the session id
    dataset_name: Mapped[str] = mapped_column(String(64), index=True)
    owner_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    owner_group_id: Mapped[int | None] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"))
    created_by: Mapped[str] = mapped_column(String(64))
    declared_bytes: Mapped[int] = mapped_column(BigInteger)
    declared_files: Mapped[int] = mapped_column(BigInteger)
    manifest_digest: Mapped[str] = mapped_column(String(64))
    registered_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    registered_files: Mapped[int] = mapped_column(BigInteger, default=0)
    received_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    state: Mapped[str] = mapped_column(String(16), default="open")  # open | done
    version: Mapped[int | None] = mapped_column(Integer)  # set when done
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class DatasetUploadFile(Base):
    """One file of an upload: declared size and sha256, bytes received (chunks are appended at
    exactly this offset, so a resumed client knows where to go on)."""

    __tablename__ = "dataset_upload_files"

    upload_id: Mapped[str] = mapped_column(
        ForeignKey("dataset_uploads.id", ondelete="CASCADE"), primary_key=True
    )
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    received: Mapped[int] = mapped_column(BigInteger, default=0)


class JobDataset(Base):
    """Lineage: the exact dataset versions a job used. No foreign key to the dataset: the record
    outlives a deleted dataset (the name is kept for that)."""

    __tablename__ = "job_datasets"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    dataset_id: Mapped[int] = mapped_column(Integer, primary_key=True, index=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_name: Mapped[str] = mapped_column(String(64))


class StorageAccount(Base):
    """Storage quota and usage of one user or group (`scope` "user" | "group"). Dataset usage is
    counted as versions complete or are deleted; `scanned_*` is what the background scan found in
    the home or group directory. None quota = no limit."""

    __tablename__ = "storage_accounts"

    scope: Mapped[str] = mapped_column(String(8), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    max_bytes: Mapped[int | None] = mapped_column(BigInteger)
    max_files: Mapped[int | None] = mapped_column(BigInteger)
    dataset_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    dataset_files: Mapped[int] = mapped_column(BigInteger, default=0)
    scanned_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    scanned_files: Mapped[int] = mapped_column(BigInteger, default=0)
    scanned_at: Mapped[float | None] = mapped_column(Float)

    @property
    def used_bytes(self) -> int:
        return self.dataset_bytes + self.scanned_bytes

    @property
    def used_files(self) -> int:
        return self.dataset_files + self.scanned_files
