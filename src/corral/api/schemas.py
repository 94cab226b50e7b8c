"""Request and response bodies of the REST API (kept apart from the DB models)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic.json_schema import JsonSchemaValue

from corral.api.pattern_words import worded
from corral.spec import LABEL_KEY_RE, LABEL_SELECTOR, LABEL_VALUE_RE, MAX_LABELS, NotifyV1


def nul_at(value: Any) -> tuple[str | int, ...] | None:
    """Where a string in this (parsed JSON) value holds a NUL (keys too): () for the value
    itself, ("env", "A") for one inside; None when none does."""
    if isinstance(value, str):
        return () if "\x00" in value else None
    items: Any = ()
    if isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif isinstance(value, dict):
        items = value.items()
    for key, item in items:
        if isinstance(key, str) and "\x00" in key:
            return (key,)
        inner = nul_at(item)
        if inner is not None:
            return (key, *inner)
    return None  # numbers, booleans, None; a nested model checked its own fields


def holds_nul(value: Any) -> bool:
    return nul_at(value) is not None


NO_NUL_PATTERN = r"^[^\x00]*$"


def no_nul_in_schema(schema: Any) -> None:
    """Give every string in this JSON schema (through anyOf/oneOf, items, map values) that has no
    pattern NO_NUL_PATTERN. Nested models ($ref) say it in their own schema."""
    if not isinstance(schema, dict):
        return
    if (
        schema.get("type") == "string"
        and "pattern" not in schema
        and "enum" not in schema
        and "const" not in schema
    ):
        schema["pattern"] = NO_NUL_PATTERN
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for sub in schema.get(key, ()):
            no_nul_in_schema(sub)
    for key in ("items", "additionalProperties"):
        no_nul_in_schema(schema.get(key))


def no_nul_in_properties(schema: dict[str, Any], allowed: frozenset[str] = frozenset()) -> None:
    """no_nul_in_schema for each property of this object schema but those named in `allowed`."""
    for name, prop in schema.get("properties", {}).items():
        if name not in allowed:
            no_nul_in_schema(prop)


class RequestBody(BaseModel):
    """The base of every request body: no string in it holds a NUL (a 422 naming the field).
    PostgreSQL stores no NUL in text and SQLite does, so without this one database answered 422
    (corral.api.app's DataError handler, now only a backstop) and the other stored it. A field
    whose value never reaches the database as text (a secret's value, encrypted) is named in
    `NUL_ALLOWED`."""

    NUL_ALLOWED: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        # The schema says it too (clients and fuzzers generate no NUL): every string without a
        # pattern of its own gets NO_NUL_PATTERN (name patterns already leave NUL out).
        schema = handler(core_schema)
        no_nul_in_properties(handler.resolve_ref_schema(schema), cls.NUL_ALLOWED)
        return schema

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name not in cls.NUL_ALLOWED and holds_nul(value):
            raise ValueError(
                f"{info.field_name!r} holds a NUL character (\\x00), which the database cannot store"
            )
        return value


class BooleansApart(RequestBody):
    """`true` is no number and `0` no boolean, as the schema says (pydantic's lax mode mixes
    them; its strict mode would also refuse 1.0 for an integer, which JSON Schema allows)."""

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_apart(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None or value is None:
            return value
        wants_bool = bool in (get_args(field.annotation) or (field.annotation,))
        if wants_bool and not isinstance(value, bool):
            raise ValueError("must be true or false")
        if not wants_bool and isinstance(value, bool):
            raise ValueError("must not be true or false")
        return value


class _In(BooleansApart):
    model_config = ConfigDict(extra="forbid")


# What corral.services.accounts accepts, said in the schema too (so clients and fuzzers know).
ACCOUNT_NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"
PASSWORD_MIN = 8
_BASE64 = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)"
SSH_PUBLIC_KEY = (
    r"^\s*(?:ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521)"
    rf"\s+{_BASE64}(?:\s[^\x00]*)?$"  # a comment, no NUL
)


SSH_KEY_WORDS = (
    "is not an SSH public key: give the line of a .pub file, its type (ssh-ed25519, ssh-rsa, "
    "ecdsa-sha2-nistp256, -nistp384 or -nistp521), its base64 and an optional comment"
)


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


class AttemptGpuOut(BaseModel):
    node: str
    index: int
    rank: int


class PlacementOut(BaseModel):
    """One instance as placed (corral.domain.InstancePlacement)."""

    role: str
    index: int
    rank: int
    node: str
    gpu_indices: list[int]
    gpu_uuids: list[str]
    cpus: float
    memory_mib: int


class PendingReasonOut(BaseModel):
    code: str
    source: str
    message: str


# `held` as Slurm's and Kueue's users read it: no time by design. The reasons say which kind.
HELD_DESCRIPTION = (
    "no estimated start by design: on hold (`corral hold`; reason `on_hold`, until it is released) "
    "or held back by its group's quota or its user's cap (reason `quota_exhausted`, `quota_max`, "
    "`storage_quota` or `user_cap`, until the group's or user's own jobs free enough)"
)


class DiagnosisOut(BaseModel):
    """Why a queued job waits (corral.domain.JobDiagnosis)."""

    reasons: list[PendingReasonOut]
    queue_position: int | None  # in the order the scheduler takes waiting jobs (fair share included)
    estimated_start: float | None  # None: cannot tell, or held (see `held`)
    unschedulable: bool
    start_range: list[float] | None = None  # [early, late]: runtimes at their 25th/75th percentile
    held: bool = Field(False, description=HELD_DESCRIPTION)


class RuntimeEstimateOut(BaseModel):
    """The runtime the scheduler assumes (corral.scheduler.runtimes): the median of the runs of
    the first history level with enough of them, with their 25th/75th percentiles."""

    seconds: float
    low_s: float | None
    high_s: float | None
    basis: str | None  # name | user_size | group | cluster | limit


class AttemptOut(BaseModel):
    number: int
    state: str
    nodes: list[str]
    gpus: list[AttemptGpuOut]
    placement: list[PlacementOut]
    borrowed: bool
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    reason: str | None  # the exit-spec's reason code (cuda_oom, user_error, gpu_error, ...)
    message: str
    failure: FailureOut | None = None  # GET /jobs/{id}: the exit-spec's verdict


class FailureOut(BaseModel):
    """Why an attempt failed (docs/diagnosis.md)."""

    reason: str
    category: str  # user | platform | hardware | transient | preempted
    message: str
    fix: str
    evidence: str  # the log line that decided, if any
    node: str


class WatchOut(BaseModel):
    """Hang and straggler watch of the running attempt (docs/diagnosis.md)."""

    attempt: int
    suspected_hang: str
    suspected_at: float | None
    stragglers: str
    action: str


class HoldOut(BaseModel):
    """A queued job's hold (`corral hold`): it is never scheduled until it is released."""

    by: str  # who held it
    at: float
    admin: bool  # an admin's hold: only an admin can release it


class EventOut(BaseModel):
    id: int  # the cursor of a page back: GET /jobs/{id}/events?before=ID
    at: float
    kind: str
    from_state: str | None
    to_state: str | None
    message: str


class NotifyDeliveryOut(BaseModel):
    kind: str  # email | webhook | slack
    address: str | None  # the owner's and admins' view only; a webhook's as scheme://host:port/...
    state: str  # pending | sending | failing | sent | given_up
    attempts: int
    sent_at: float | None
    last_error: str
    events: int  # how many job events the message told of (more than 1: a digest)
    subject: str


class NotifyDefaultIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    notify: NotifyV1 | None  # null: none (jobs without their own `notify` tell nothing)


class NotifyDefaultOut(BaseModel):
    user: str
    notify: dict[str, list[str]] | None


class JobNotificationOut(BaseModel):
    event: str  # started | succeeded | failed | cancelled | requeued
    at: float
    attempt: int
    state: str  # pending | grouped | no_contact | failed
    message: str
    deliveries: list[NotifyDeliveryOut]


class JobOut(BaseModel):
    id: int
    name: str
    state: str
    group: str
    user: str
    priority: str
    preemptible: bool
    spec: dict[str, object]  # the spec as stored (corral.spec.JobSpecV1, no null fields)
    environment_version: str | None = None  # catalogue environment, pinned at submit: "name@3"
    labels: dict[str, str] = {}  # the spec's labels (GET /jobs?label=k=v lists by them)
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
    # GET /jobs/{id}: what the next platform loss like the latest is counted against: the budget,
    # or the lower cap of the latest failure's exit-spec rule (launch_failed: 2)
    platform_loss_cap: int | None = None
    preemptions: int = 0  # requeues by preemption (free)
    attempts: list[AttemptOut]
    diagnosis: DiagnosisOut | None
    runtime_estimate: RuntimeEstimateOut | None = None  # what the scheduler assumes it runs
    hold: HoldOut | None = None  # set while it is queued and held (POST /jobs/{id}/hold)
    events: list[EventOut] | None = None  # its newest 500 at most, oldest first
    earlier_events: int | None = None  # with `events`: how many of its events come before them
    watch: WatchOut | None = None  # GET /jobs/{id}


class HoldOutcomeOut(BaseModel):
    """POST /jobs/{id}/hold and /release: what was done (`changed` false: it already was held, or
    was not held) and the job as it is now."""

    changed: bool
    message: str
    job: JobOut


LABEL_WORDS = (
    "is not a label selector: NAME=VALUE or NAME, the name letters, digits, '.', '_', '-' or '/', "
    "the value letters, digits or '.', '_', '-', '/', ':', '@', '+'"
)


LabelSelectorText = Annotated[
    str, Field(min_length=1, max_length=200, pattern=worded(LABEL_SELECTOR, LABEL_WORDS))
]


class LabelsPatchIn(RequestBody):
    """PATCH /jobs/{id}/labels: a JSON merge patch of the job's labels (RFC 7386), as Kubernetes
    edits labels: NAME: VALUE sets a label (a number is taken as its text, as at submit), NAME:
    null removes it, labels not named stay. Checked as at submit (services/job_labels.py), and the
    job may end with at most MAX_LABELS of them."""

    labels: Annotated[
        dict[str, Any],
        Field(min_length=1, max_length=2 * MAX_LABELS),
        WithJsonSchema(
            {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 2 * MAX_LABELS,  # as many set as a job may have, and as many removed
                "propertyNames": {"pattern": LABEL_KEY_RE.pattern},
                "additionalProperties": {
                    "anyOf": [
                        {"type": "string", "pattern": LABEL_VALUE_RE.pattern},
                        {"type": "number"},
                        {"type": "null"},
                    ]
                },
            }
        ),
    ]


# Why a job was cancelled, in the caller's words: one line (it ends "cancelled by alice: ...")
CANCEL_REASON = worded(
    r"^[^\x00-\x1f\x7f]*$", "must be one line of text (no line break or control character)"
)
CancelReason = Annotated[str | None, Field(min_length=1, max_length=200, pattern=CANCEL_REASON)]


class CancelIn(RequestBody):
    """POST /jobs/{id}/cancel (optional body): why, in the caller's words."""

    reason: CancelReason = None


class CancelByLabelsIn(BooleansApart):
    """POST /jobs/cancel: the labels (NAME=VALUE, or NAME for any value) every job cancelled
    carries (at least one), and why. Whose jobs: the caller's own, unless `user` (that user's:
    admins, group admins within their groups) or `all_users` (every job the caller may act on)."""

    labels: list[LabelSelectorText] = Field(min_length=1, max_length=MAX_LABELS)
    reason: CancelReason = None
    user: str | None = Field(None, min_length=1, max_length=64, description="only this user's jobs")
    all_users: bool = Field(False, description="every user's jobs you may act on, not only yours")


class CancelledJobOut(BaseModel):
    id: int
    outcome: Literal["cancelled", "stopping", "ended", "gone"]
    state: str | None
    message: str


class CancelByLabelsOut(BaseModel):
    """What POST /jobs/cancel did, per job it matched (live, in its scope, carrying every
    label; at most 1000, `more`: run it again for the rest)."""

    matched: int
    more: bool
    items: list[CancelledJobOut]


class HoldByLabelsIn(BooleansApart):
    """POST /jobs/hold and /jobs/release: the labels (NAME=VALUE, or NAME for any value) every
    queued job held or released carries (at least one). Whose jobs: as for POST /jobs/cancel."""

    labels: list[LabelSelectorText] = Field(min_length=1, max_length=MAX_LABELS)
    user: str | None = Field(None, min_length=1, max_length=64, description="only this user's jobs")
    all_users: bool = Field(False, description="every user's jobs you may act on, not only yours")


class HeldJobOut(BaseModel):
    id: int
    # held / released | unchanged (already held; not held) | refused (placed meanwhile; an admin's
    # hold, for a non-admin) | gone (deleted meanwhile)
    outcome: Literal["held", "released", "unchanged", "refused", "gone"]
    state: str | None
    held: bool | None
    message: str


class HoldByLabelsOut(BaseModel):
    """What POST /jobs/hold or /jobs/release did, per job it matched (queued, in its scope,
    carrying every label; at most 1000, `more`: run it again for the rest)."""

    matched: int
    more: bool
    items: list[HeldJobOut]


class MetricPointOut(BaseModel):
    step: int | None
    values: dict[str, float]


class JobMetricsOut(BaseModel):
    """GET /jobs/{id}/metrics: what the job appended to $CORRAL_OUTPUTS/metrics.jsonl
    (corral.services.job_metrics)."""

    job_id: int
    file: str
    points: list[MetricPointOut]
    latest: dict[str, float]
    skipped: int
    truncated: bool
    error: str | None = None  # the job's outputs could not be read (no points then)


class JobMetricsItemOut(JobMetricsOut):
    state: str
    labels: dict[str, str]


class ManyMetricsOut(BaseModel):
    """GET /jobs/metrics: a page of jobs' metrics, by id."""

    items: list[JobMetricsItemOut]
    total: int
    limit: int
    offset: int


class JobListOut(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int


class WaitingOut(BaseModel):
    state: str
    message: str
    reasons: list[PendingReasonOut]
    queue_position: int | None
    estimated_start: float | None
    unschedulable: bool
    start_range: list[float] | None = None
    held: bool = Field(False, description=HELD_DESCRIPTION)


class LogsOut(BaseModel):
    data: str
    next_offset: int
    eof: bool
    attempt: int | None
    rank: int
    waiting: WaitingOut | None = Field(
        None, description="set while the job waits to run (queued or being started): why, and when"
    )


class GpuOut(BaseModel):
    index: int
    uuid: str
    model: str
    memory_mib: int
    topology_group: int | None
    healthy: bool
    health: str = "healthy"  # Corral's verdict: healthy | quarantined | lost
    allocated: bool = False  # a job holds it
    job_id: int | None = Field(None, description="the job holding it, where the caller may see that job")


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
    flags: list[str] = []  # diagnosis: e.g. failing_jobs (docs/diagnosis.md)
    gpus: list[GpuOut]


class QuotaIn(_In):
    """Only the fields present in the body change (`null` clears a limit: `max`, `user_max_gpus`,
    `cpus_max`, `memory_max_mib`). The GPU quota of `gpu_model` is written when `gpu_model`,
    `guaranteed` or `max` is given (a new one starts at 0 guaranteed, no max)."""

    gpu_model: str = Field("*", min_length=1, max_length=64)
    guaranteed: int = Field(0, ge=0, le=100_000)
    max: int | None = Field(None, ge=0, le=100_000)
    # Group-wide settings may ride along.
    user_max_gpus: int | None = Field(None, ge=0, le=100_000)
    weight: float | None = Field(None, gt=0, le=1000)
    borrowing: bool | None = None
    cpus_guaranteed: float = Field(0.0, ge=0, le=10_000_000)
    cpus_max: float | None = Field(None, ge=0, le=10_000_000)
    memory_guaranteed_mib: int = Field(0, ge=0, le=2**40)
    memory_max_mib: int | None = Field(None, ge=0, le=2**40)

    @property
    def sets_gpu_quota(self) -> bool:
        return bool({"gpu_model", "guaranteed", "max"} & self.model_fields_set)


class QuotaOut(BaseModel):
    gpu_model: str
    guaranteed: int
    max: int | None


class GroupIn(_In):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"name": "example-team", "user_max_gpus": 2}]}
    )

    name: str = Field(min_length=1, max_length=64, pattern=ACCOUNT_NAME)
    weight: float = Field(1.0, gt=0, le=1000)
    borrowing: bool = True
    user_max_gpus: int | None = Field(None, ge=0, le=100_000)
    quotas: list[QuotaIn] = Field(default_factory=list, max_length=64)
    cpus_guaranteed: float = Field(0.0, ge=0, le=10_000_000)
    cpus_max: float | None = Field(None, ge=0, le=10_000_000)
    memory_guaranteed_mib: int = Field(0, ge=0, le=2**40)
    memory_max_mib: int | None = Field(None, ge=0, le=2**40)


class MemberIn(_In):
    user: str = Field(min_length=1, max_length=64)
    # None: a new member joins as "member", an existing one keeps their role
    role: str | None = Field(None, pattern="^(admin|member)$")


class MemberOut(BaseModel):
    user: str
    role: str


class MemberAddedOut(MemberOut):
    changed: bool  # false: the user was already a member with this role (or kept theirs)


class GpuUsageOut(BaseModel):
    gpu_model: str  # a quota key: a GPU model, or "*" for models the group lists no quota for
    used: int
    borrowed: int  # of `used`: held by work placed beyond the guarantee (reclaimable)
    guaranteed: int
    max: int | None
    models: dict[str, int]  # GPU model -> GPUs used under this key


class ResourceUsageOut(BaseModel):
    used: float
    guaranteed: float
    max: float | None


class GroupUsageOut(BaseModel):
    gpus: list[GpuUsageOut]
    cpus: ResourceUsageOut
    memory_mib: ResourceUsageOut


class GroupOut(BaseModel):
    name: str
    weight: float
    borrowing: bool
    user_max_gpus: int | None
    quotas: list[QuotaOut]
    cpus_guaranteed: float
    cpus_max: float | None
    memory_guaranteed_mib: int
    memory_max_mib: int | None
    created_at: float
    members: list[MemberOut] | None = None
    usage: GroupUsageOut | None = None
    warnings: list[str] = Field(default_factory=list)  # overcommitted guarantees; a `*` max that caps less


class UserIn(_In):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"name": "example-user", "groups": ["default"]}]}
    )

    name: str = Field(min_length=1, max_length=64, pattern=ACCOUNT_NAME)
    password: str | None = Field(None, min_length=PASSWORD_MIN, max_length=1024)
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


class UserActiveOut(UserOut):
    changed: bool  # false: the user was already active (activate) or deactivated (deactivate)


class DefaultGroupIn(_In):
    group: str = Field(min_length=1, max_length=64)


class PasswordIn(_In):
    password: str = Field(min_length=PASSWORD_MIN, max_length=1024)
    current_password: str | None = Field(
        None, max_length=1024, description="required when changing your own existing password (non-admins)"
    )


class TokenIn(_In):
    name: str = Field("cli", min_length=1, max_length=64)
    expires_in_days: float | None = Field(None, gt=0, le=3650)
    user: str | None = Field(
        None, min_length=1, max_length=64, description="admins only: create the token for this user"
    )


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
    note: str | None = Field(
        None, description="at creation: why it expires sooner than asked (made with a shorter-lived token)"
    )


class SshKeyIn(_In):
    name: str = Field(min_length=1, max_length=64)
    public_key: str = Field(min_length=1, max_length=16_384, pattern=worded(SSH_PUBLIC_KEY, SSH_KEY_WORDS))


class SshKeyOut(BaseModel):
    id: int
    name: str
    fingerprint: str
    public_key: str
    created_at: float


class UsageRowOut(BaseModel):
    name: str
    gpu_hours: float
    cpu_hours: float
    jobs: int
    attempts: int


class UsageOut(BaseModel):
    since: float
    until: float
    by: str
    rows: list[UsageRowOut]
    total: UsageRowOut
