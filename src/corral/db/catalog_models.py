"""Tables of the catalogues (migration 0012_catalog): job templates with their versions, and the
model registry with its versions and the jobs that mount them. Times are unix seconds as floats,
like the core tables.

Sharing is one column, `visibility`: "private" (the owner), "group" (members of `group_id`) or
"public" (every user). Lineage outlives what it points to: a model version keeps its source job's
id, name and spec as values, not as foreign keys, so deleting the job keeps the record."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base


class JobTemplate(Base):
    """A named job template; its spec lives in versions (`template_versions`)."""

    __tablename__ = "job_templates"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    owner_user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    group_id: Mapped[int | None] = mapped_column(ForeignKey("groups.id", ondelete="SET NULL"), index=True)
    visibility: Mapped[str] = mapped_column(String(8), default="private")
    description: Mapped[str] = mapped_column(Text, default="")
    uses: Mapped[int] = mapped_column(Integer, default=0)  # jobs submitted from it
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))


class TemplateVersion(Base):
    """One immutable version: the spec mapping with its `parameters:` and `${name}` references."""

    __tablename__ = "template_versions"
    __table_args__ = (UniqueConstraint("template_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    template_id: Mapped[int] = mapped_column(ForeignKey("job_templates.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    source_job_id: Mapped[int | None] = mapped_column(Integer)  # "save as template" (no FK: lineage)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))


class RegisteredModel(Base):
    """A named model of the registry; its files and metadata live in versions."""

    __tablename__ = "registered_models"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    owner_user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    group_id: Mapped[int | None] = mapped_column(ForeignKey("groups.id", ondelete="SET NULL"), index=True)
    visibility: Mapped[str] = mapped_column(String(8), default="private")
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    # The highest version number ever given (migration 0020): never given again after a delete.
    last_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class ModelVersion(Base):
    """An immutable version: its files are a copy under `<storage root>/model/<model id>/v<N>/`
    (read-only), made before the row is committed; `stage` is the only thing that changes."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("registered_models.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    stage: Mapped[str] = mapped_column(String(16), default="none")
    framework: Mapped[str] = mapped_column(String(64), default="")
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    card: Mapped[str] = mapped_column(Text, default="")  # markdown
    source_path: Mapped[str] = mapped_column(String(1024), default="")  # under the job's /outputs
    bytes: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[int] = mapped_column(BigInteger)
    digest: Mapped[str] = mapped_column(String(64))  # sha256 of the manifest (path, size, sha256)
    source_job_id: Mapped[int] = mapped_column(Integer, index=True)  # no FK: the job may go
    lineage: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))


class JobModel(Base):
    """The model versions a job mounts (pinned at submit): what refuses deleting one in use."""

    __tablename__ = "job_models"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    model_version_id: Mapped[int] = mapped_column(Integer, primary_key=True, index=True)
    model_name: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)


class RetiredName(Base):
    """The highest version number a deleted dataset, model, environment or template (`kind`) had given, kept
    under its name (migration 0022): one created again with that name goes on from there, so a
    version number is never given twice for a name (corral.catalog.retired)."""

    __tablename__ = "retired_names"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)  # dataset|model|environment|template
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_version: Mapped[int] = mapped_column(Integer)
