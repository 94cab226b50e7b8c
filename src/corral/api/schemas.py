"""Request and response bodies of the REST API (kept apart from the DB models)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoginIn(_In):
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)


class GroupRole(BaseModel):
    name: str
    role: str


class MeOut(BaseModel):
    name: str
    role: str  # admin | group_admin | member
    is_admin: bool
    groups: list[GroupRole]
    default_group: str | None


class LoginOut(BaseModel):
    user: MeOut
    csrf_token: str


class AttemptOut(BaseModel):
    number: int
    state: str
    nodes: list[str]
    gpus: list[dict[str, Any]]
    placement: list[dict[str, Any]]
    borrowed: bool
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    reason: str | None
    message: str


class EventOut(BaseModel):
    at: float
    kind: str
    from_state: str | None
    to_state: str | None
    message: str


class JobOut(BaseModel):
    id: int
    name: str
    state: str
    group: str
    user: str
    priority: str
    preemptible: bool
    spec: dict[str, Any]
    created_at: float
    updated_at: float
    finished_at: float | None
    retries: int
    attempt_count: int
    cancel_requested: bool
    reason: str  # why it last ended, failed or was requeued
    own_failures: int = 0  # failures of the job's own, counted against `retries`
    platform_losses: int = 0  # attempts the platform lost, counted against lost_requeue_budget
    lost_requeue_budget: int | None = None  # the server's CORRAL_LOST_REQUEUE_BUDGET
    preemptions: int = 0  # requeues by preemption (free)
    attempts: list[AttemptOut]
    diagnosis: dict[str, Any] | None
    events: list[EventOut] | None = None


class JobListOut(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int


class LogsOut(BaseModel):
    data: str
    next_offset: int
    eof: bool
    attempt: int | None
    rank: int


class GpuOut(BaseModel):
    index: int
    uuid: str
    model: str
    memory_mib: int
    topology_group: int | None
    healthy: bool
    health: str = "healthy"  # Corral's verdict: healthy | quarantined | lost
    job_id: int | None


class NodeOut(BaseModel):
    name: str
    state: str
    admin_state: str
    cpus: float
    memory_mib: int
    address: str
    labels: dict[str, str]
    engine: str
    last_heartbeat: float | None
    message: str
    gpus: list[GpuOut]


class QuotaIn(_In):
    gpu_model: str = Field("*", min_length=1, max_length=64)
    guaranteed: int = Field(0, ge=0, le=100_000)
    max: int | None = Field(None, ge=0, le=100_000)
    # Group-wide settings may ride along; None leaves them as they are.
    user_max_gpus: int | None = Field(None, ge=0)
    weight: float | None = Field(None, gt=0, le=1000)
    borrowing: bool | None = None


class QuotaOut(BaseModel):
    gpu_model: str
    guaranteed: int
    max: int | None


class GroupIn(_In):
    name: str = Field(min_length=1, max_length=64)
    weight: float = Field(1.0, gt=0, le=1000)
    borrowing: bool = True
    user_max_gpus: int | None = Field(None, ge=0)
    quotas: list[QuotaIn] = Field(default_factory=list, max_length=64)


class MemberIn(_In):
    user: str = Field(min_length=1, max_length=64)
    role: str = Field("member", pattern="^(admin|member)$")


class MemberOut(BaseModel):
    user: str
    role: str


class GroupOut(BaseModel):
    name: str
    weight: float
    borrowing: bool
    user_max_gpus: int | None
    quotas: list[QuotaOut]
    created_at: float
    members: list[MemberOut] | None = None


class UserIn(_In):
    name: str = Field(min_length=1, max_length=64)
    password: str | None = Field(None, max_length=1024)
    is_admin: bool = False
    groups: list[str] = Field(default_factory=list, max_length=64)
    default_group: str | None = None


class UserOut(BaseModel):
    name: str
    role: str
    is_admin: bool
    active: bool
    groups: list[GroupRole]
    default_group: str | None
    created_at: float


class DefaultGroupIn(_In):
    group: str = Field(min_length=1, max_length=64)


class TokenIn(_In):
    name: str = Field("cli", min_length=1, max_length=64)
    expires_in_days: float | None = Field(None, gt=0, le=3650)
    user: str | None = Field(None, description="admins only: create the token for this user")


class TokenOut(BaseModel):
    id: int
    name: str
    prefix: str
    user: str
    created_at: float
    last_used_at: float | None
    expires_at: float | None
    revoked_at: float | None
    token: str | None = Field(None, description="the secret; returned once, at creation")


class SshKeyIn(_In):
    name: str = Field(min_length=1, max_length=64)
    public_key: str = Field(min_length=1, max_length=16_384)


class SshKeyOut(BaseModel):
    id: int
    name: str
    fingerprint: str
    public_key: str
    created_at: float
