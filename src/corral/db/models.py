"""Core tables. Monitoring adds its own tables in corral.monitor.models on the same Base.

Conventions: integer surrogate keys, timezone-naive UTC datetimes stored as floats (unix seconds)
so that SQLite and PostgreSQL compare them identically and the scheduler can use them directly.
Column changes go through an Alembic migration (src/corral/db/migrations).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from corral.db.base import Base
from corral.db.jsontypes import DiagnosisColumn, JobSpecColumn, PlacementColumn
from corral.domain import JobDiagnosis, Placement
from corral.spec import JobSpecV1

# A 64-bit integer column: BIGINT on PostgreSQL; on SQLite, whose INTEGER is 64-bit already, the
# INTEGER the migrations made (so that models and migrations compare equal there).
INT64 = BigInteger().with_variant(Integer(), "sqlite")


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str | None] = mapped_column(String(255))  # argon2; None = token-only user
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    default_group_id: Mapped[int | None] = mapped_column(ForeignKey("groups.id", use_alter=True))
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[float] = mapped_column(Float)
    email: Mapped[str | None] = mapped_column(String(254))  # where pages reach them (services/oncall.py)

    memberships: Mapped[list[Membership]] = relationship(back_populates="user", cascade="all, delete-orphan")


class Group(Base):
    __tablename__ = "groups"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    user_max_gpus: Mapped[int | None] = mapped_column(Integer)  # per-user cap inside the group
    weight: Mapped[float] = mapped_column(Float, default=1.0)  # fair-share weight
    borrowing: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[float] = mapped_column(Float)
    # CPU and memory quotas (group-wide): the max is a hard limit the scheduler enforces (None = no
    # limit); the guarantee is a promise, checked against the cluster and shown with the usage.
    cpus_guaranteed: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    cpus_max: Mapped[float | None] = mapped_column(Float)
    # 64-bit: the API takes up to 2**40 MiB, past PostgreSQL's 32-bit integer (0030).
    memory_guaranteed_mib: Mapped[int] = mapped_column(INT64, default=0, server_default="0")
    memory_max_mib: Mapped[int | None] = mapped_column(INT64)

    quotas: Mapped[list[GroupQuota]] = relationship(back_populates="group", cascade="all, delete-orphan")
    memberships: Mapped[list[Membership]] = relationship(back_populates="group", cascade="all, delete-orphan")


class GroupQuota(Base):
    """GPUs per GPU model; gpu_model "*" covers models not listed separately."""

    __tablename__ = "group_quotas"
    __table_args__ = (UniqueConstraint("group_id", "gpu_model"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"))
    gpu_model: Mapped[str] = mapped_column(String(64), default="*")
    guaranteed: Mapped[int] = mapped_column(Integer, default=0)
    max: Mapped[int | None] = mapped_column(Integer)  # None = may borrow up to the cluster

    group: Mapped[Group] = relationship(back_populates="quotas")


class Membership(Base):
    __tablename__ = "memberships"

    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), primary_key=True)
    role: Mapped[str] = mapped_column(String(16), default="member")  # "admin" (group admin) | "member"

    user: Mapped[User] = relationship(back_populates="memberships")
    group: Mapped[Group] = relationship(back_populates="memberships")


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the secret
    prefix: Mapped[str] = mapped_column(String(12))  # first characters, to recognise a token in lists
    created_at: Mapped[float] = mapped_column(Float)
    last_used_at: Mapped[float | None] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float)


class WebSession(Base):
    """Portal login sessions (cookie holds the random id; only its hash is stored)."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


class LoginFailure(Base):
    """Consecutive failed logins per account and per source address, and the lockout they earned
    (corral.services.login_guard). In the database so that a restart forgets nothing and two
    servers count together."""

    __tablename__ = "login_failures"
    __table_args__ = (UniqueConstraint("scope", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    scope: Mapped[str] = mapped_column(String(8))  # "account" | "address"
    key: Mapped[str] = mapped_column(String(255))  # the user name tried, or the source address
    failures: Mapped[int] = mapped_column(Integer)
    first_failed_at: Mapped[float] = mapped_column(Float)
    last_failed_at: Mapped[float] = mapped_column(Float)
    locked_until: Mapped[float | None] = mapped_column(Float)


class SshKey(Base):
    __tablename__ = "ssh_keys"
    __table_args__ = (
        UniqueConstraint("user_id", "fingerprint"),
        # SQLite: AUTOINCREMENT, so a removed key's id is never given again: keys are removed by
        # id (`corral key rm ID`), and a retried removal must not find another key under it.
        # Migration 0025_row_ids. PostgreSQL's sequence never reuses ids.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    public_key: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_submitted", "state", "submitted_at"),
        Index("ix_jobs_user_submitted", "user_id", "submitted_at"),
        Index("ix_jobs_group_submitted", "group_id", "submitted_at"),
        Index("ix_jobs_submitted", "submitted_at"),  # admins' unfiltered, newest-first pages
        # the same pages sorted by updated_at (`corral ls --sort updated_at`); migration 0027
        Index("ix_jobs_updated", "updated_at"),
        # a submission's runtime estimate reads the user's earlier runs of the same name: without
        # it, every submit scanned all of its user's jobs (services.jobs.runtime_estimate)
        Index("ix_jobs_user_name", "user_id", "name"),
        # SQLite: AUTOINCREMENT, so a deleted job's id is never given again (without it SQLite
        # hands out max(rowid)+1: deleting the newest jobs gave their ids to the next submits,
        # and lineage, build jobs, audit, engine attempt dirs "<id>.<n>" and users' notes then
        # named another job). Migration 0024_job_ids. PostgreSQL's sequence never reuses ids.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id"))
    state: Mapped[str] = mapped_column(String(16), index=True)  # JobState value
    priority: Mapped[int] = mapped_column(Integer, default=1)  # scheduler Priority
    preemptible: Mapped[bool] = mapped_column(Boolean, default=True)
    spec: Mapped[JobSpecV1] = mapped_column(JobSpecColumn)  # the validated spec v1, as submitted
    max_retries: Mapped[int] = mapped_column(Integer, default=0)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)  # attempts created so far
    # Budgets (services/lifecycle.py): failures of the job's own (count against max_retries),
    # platform losses (attempt/node/engine lost: the lost-requeue budget) and preemptions (free).
    own_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    platform_losses: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    runtime_estimate_s: Mapped[float | None] = mapped_column(Float)
    # The estimate's spread (25th/75th percentile of the runs it came from) and which history level
    # it came from (corral.scheduler.runtimes); NULL: no spread known
    runtime_estimate_low_s: Mapped[float | None] = mapped_column(Float)
    runtime_estimate_high_s: Mapped[float | None] = mapped_column(Float)
    runtime_estimate_basis: Mapped[str | None] = mapped_column(String(16))
    gpus: Mapped[int | None] = mapped_column(Integer)  # GPUs over all tasks (NULL: before 0017)
    # The first estimated wait the scheduler showed (its roll's, before the calibration) and when:
    # with the first attempt's start, one outcome of the ETA calibration (server/eta_record.py)
    eta_shown_at: Mapped[float | None] = mapped_column(Float)
    eta_shown_wait_s: Mapped[float | None] = mapped_column(Float)
    submitted_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str] = mapped_column(Text, default="")  # last requeue/terminal reason, human text
    attained_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    # Written by the scheduling loop each cycle for waiting jobs ("why pending"):
    diagnosis: Mapped[JobDiagnosis | None] = mapped_column(DiagnosisColumn)
    # Lease for background work on this row (dispatch/stop), so two servers never act twice.
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[float | None] = mapped_column(Float)
    # A hold (`corral hold`, `submit --hold`): who held the QUEUED job back, when, and whether as
    # an admin (then only an admin releases it). The schedule loop never reads a held job;
    # written only by services/lifecycle.py (hold_job/release_job). Migration 0028.
    # No foreign key: adding one rebuilds the jobs table on SQLite (see migration 0024)
    held_by: Mapped[int | None] = mapped_column(Integer)
    held_at: Mapped[float | None] = mapped_column(Float)
    held_as_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="job", cascade="all, delete-orphan", order_by="Attempt.number"
    )
    user: Mapped[User] = relationship()
    holder: Mapped[User | None] = relationship(
        primaryjoin="foreign(Job.held_by) == User.id", viewonly=True, lazy="select"
    )
    group: Mapped[Group] = relationship()


class JobLabel(Base):
    """One of a job's labels (its spec's `labels`), for the filters: GET /jobs?label=k=v, cancel
    and wait by label (services/jobs.py). Written at submit, with the job, and by label edits
    (services/job_labels.py), with the spec, which keeps them too. (key, value, job_id) is the
    filter's index; deleted with the job (ON DELETE CASCADE). Migration 0036."""

    __tablename__ = "job_labels"
    __table_args__ = (Index("ix_job_labels_key_value", "key", "value", "job_id"),)

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(128))


class Attempt(Base):
    """One try of a job. Every attempt is kept: node(s), GPUs, start, end, exit code, reason."""

    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "number"),
        # first attempts by start time: the ETA calibration's outcomes (server/eta_record.py)
        Index("ix_attempts_number_started", "number", "started_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)  # 1-based
    state: Mapped[str] = mapped_column(String(16))  # AttemptState value
    # As placed by the scheduler, in rank order (stored as a JSON list of objects)
    placement: Mapped[Placement] = mapped_column(PlacementColumn, default=tuple)
    borrowed: Mapped[bool] = mapped_column(Boolean, default=False)
    engine: Mapped[str] = mapped_column(String(16), default="local")
    engine_ref: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(String(32))  # engine FailureReason code
    message: Mapped[str] = mapped_column(Text, default="")
    stop_requested_at: Mapped[float | None] = mapped_column(Float)
    stop_grace_s: Mapped[float | None] = mapped_column(Float)

    job: Mapped[Job] = relationship(back_populates="attempts")

    @property
    def attempt_id(self) -> str:
        """The engine's key for this attempt: stable and unique."""
        return f"{self.job_id}.{self.number}"


class GpuClaim(Base):
    """A GPU held by a live attempt. The primary key makes double allocation impossible even with
    two server processes; rows are deleted the moment the attempt ends (history is in Attempt)."""

    __tablename__ = "gpu_claims"

    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_pk: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int] = mapped_column(Integer, index=True)


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))  # "transition", "diagnosis", "log", ...
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str | None] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text, default="")


class Node(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    cpus: Mapped[float] = mapped_column(Float)
    memory_mib: Mapped[int] = mapped_column(Integer)
    # Effective state the scheduler sees: ready | cordoned | draining | down | unknown.
    state: Mapped[str] = mapped_column(String(16), default="ready")
    # What an operator asked for (none | cordoned | draining); survives the engine's reports.
    admin_state: Mapped[str] = mapped_column(String(16), default="none")
    address: Mapped[str] = mapped_column(String(255), default="127.0.0.1")
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    engine: Mapped[str] = mapped_column(String(16), default="local")
    last_heartbeat: Mapped[float | None] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text, default="")

    gpus: Mapped[list[Gpu]] = relationship(
        back_populates="node", cascade="all, delete-orphan", order_by="Gpu.index"
    )


class Gpu(Base):
    __tablename__ = "gpus"

    node_name: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(64))
    memory_mib: Mapped[int] = mapped_column(Integer, default=0)
    topology_group: Mapped[int | None] = mapped_column(Integer)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)  # as the engine reports it
    # Corral's own verdict (services.lifecycle.GpuHealth): healthy | quarantined | lost. Only
    # "healthy" GPUs (that the engine also reports healthy) are offered to the scheduler.
    health: Mapped[str] = mapped_column(String(16), default="healthy", server_default="healthy")

    node: Mapped[Node] = relationship(back_populates="gpus")


class RemovedNode(Base):
    """A node name an admin removed (`corral node remove`): should the engine report it again (it
    was not taken out of the engine first), it comes back cordoned, and this row goes
    (server.nodes.upsert_node; docs/architecture.md)."""

    __tablename__ = "removed_nodes"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    removed_at: Mapped[float] = mapped_column(Float)
    removed_by: Mapped[str] = mapped_column(String(128))


class UsageLedger(Base):
    """Decayed GPU-seconds per (group, user) for fair share; decayed to `updated_at`."""

    __tablename__ = "usage_ledger"

    group_name: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_name: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[float] = mapped_column(Float)


class Lease(Base):
    """Singleton work leases for background loops (e.g. "scheduler"): whoever holds an unexpired
    lease does that work; others wait. Safe with two server processes on one database."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    until: Mapped[float] = mapped_column(Float)


# Tables of other areas on the same metadata, so create_all (tests) and autogenerate see them.
from corral.db import environment_models as _environment_models  # noqa: E402, F401
from corral.db import storage_models as _storage_models  # noqa: E402, F401
from corral.db import workspace_models as _workspace_models  # noqa: E402, F401
