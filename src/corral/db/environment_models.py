"""Tables of the environments catalogue (corral.environments; migrations 0011_environments and
0016_env_interpreter). Times are unix seconds as floats, like the core tables."""

from __future__ import annotations

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base


class Environment(Base):
    """A named Python environment. Names are unique across the installation, so
    `environment: <name>` means one thing. visibility: private (the owner), group (members of
    `group_id`), public (everyone); `official`: curated by an admin, listed first."""

    __tablename__ = "environments"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    group_id: Mapped[int | None] = mapped_column(ForeignKey("groups.id", ondelete="SET NULL"))
    visibility: Mapped[str] = mapped_column(String(16))  # private | group | public
    official: Mapped[bool] = mapped_column(Boolean, default=False)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    # The highest version number ever given (migration 0022): a deleted version's number, the
    # latest's included, is never given again, so `environment: name@2` means one build for good.
    last_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class EnvironmentVersion(Base):
    """One build request and its outcome. state: building (its build job has not ended), ready
    (`cache_key` names its read-only copy `<storage root>/env/store/<cache_key>`), failed
    (`error` says why; the build job's log is kept with the job). Versions never change once
    built; a new requirements text is a new version."""

    __tablename__ = "environment_versions"
    __table_args__ = (UniqueConstraint("environment_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    source_kind: Mapped[str] = mapped_column(String(16))  # requirements | pyproject
    source: Mapped[str] = mapped_column(Text)
    python: Mapped[str] = mapped_column(String(32))  # the interpreter's version, e.g. "3.11.7"
    # The interpreter it is built for (CORRAL_ENV_PYTHON; corral.environments.interpreter), e.g.
    # /usr/bin/python3; "" for versions from before migration 0016 (the server's base interpreter).
    interpreter: Mapped[str] = mapped_column(String(255), default="", server_default="")
    lock: Mapped[str | None] = mapped_column(Text)  # `uv pip compile` output, once resolved
    cache_key: Mapped[str | None] = mapped_column(String(64), index=True)
    cache_hit: Mapped[bool] = mapped_column(Boolean, default=False)  # an identical lock was there
    build_job_id: Mapped[int | None] = mapped_column(Integer, index=True)  # no FK: the job may go
    error: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    built_at: Mapped[float | None] = mapped_column(Float)
