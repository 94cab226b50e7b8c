"""Jobs: submit, list, show, cancel and events (why a job waits and its logs: services.job_logs).

Cancel contract (shared with the reconciler in corral.server):
- QUEUED: the job goes to CANCELLED at once, here, through `transition()` (compare-and-set: if
  the schedule loop placed it meanwhile, the cancel becomes a request as below).
- SCHEDULED / STARTING / RUNNING / PREEMPTED: this service only sets `Job.cancel_requested = True`
  and records a "cancel_requested" event. The control loops own the running processes: the
  dispatcher must not launch a job with `cancel_requested` (it cancels it instead), and the
  reconciler stops the live attempt through the engine (SIGTERM, grace, SIGKILL) and then moves
  the job to CANCELLED (services.lifecycle.settle_attempt_end). A job with `cancel_requested` is
  never retried, so a failure during the stop ends as CANCELLED, never as a retry; only an exit 0
  from before the stop was sent wins over the cancel (SUCCEEDED: its work was done).
- Terminal states: 409 (nothing to cancel). A repeated cancel of an active job is a no-op.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypedDict, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    bindparam,
    false,
    func,
    insert,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy.orm import InstrumentedAttribute, Session, joinedload, selectinload

from corral.catalog.model_mounts import record_model_uses
from corral.datasets.mounts import record_lineage
from corral.db.base import table_of
from corral.db.models import Attempt, Gpu, Group, GroupQuota, Job, JobEvent, JobLabel, Node, User
from corral.environments.tools import BUILD_TOOLS_ENV
from corral.scheduler import Profile, check_fits_anywhere
from corral.scheduler import types as st
from corral.scheduler.runtimes import KEEP_RUNS, LEVELS, MIN_RUNS, RuntimeEstimate, estimate_from
from corral.services import audit, notify
from corral.services.audit_state import job_state
from corral.services.auth import Principal
from corral.services.errors import Conflict, Invalid, NotFound, ServiceError
from corral.services.lifecycle import AttemptState, JobState, record_event, request_cancel, transition
from corral.services.lifecycle import hold as hold_queued
from corral.services.nodes import scheduler_node
from corral.services.quota import check_quota
from corral.services.secrets import check_job_secrets
from corral.services.submit_guard import hold_access
from corral.services.views import JobHistory, JobView, hold_event_text, job_view
from corral.spec import JobSpecV1

SortColumn = InstrumentedAttribute[float] | InstrumentedAttribute[int] | InstrumentedAttribute[str]
SORT_COLUMNS: dict[str, SortColumn] = {
    "created_at": Job.submitted_at,
    "submitted_at": Job.submitted_at,
    "updated_at": Job.updated_at,
    "id": Job.id,
    "priority": Job.priority,
    "state": Job.state,
    "name": Job.name,
}
MAX_PAGE = 1000


class EngineMissing(ServiceError):
    """Logs need the execution engine and this server runs none (or it cannot be reached)."""

    status_code = 503


# GET /jobs?id=...: the most ids one list names (a tool waiting on its trials, SDK wait_all).
MAX_IDS = 1000


@dataclass(frozen=True)
class JobFilter:
    state: Sequence[str] = ()
    user: str | None = None
    group: str | None = None
    # (key, value) pairs every job listed carries (AND); value None: the label with any value
    labels: Sequence[tuple[str, str | None]] = ()
    ids: Sequence[int] | None = None  # only these jobs (at most MAX_IDS); (): none
    sort: str = "created_at"
    order: str = "desc"
    limit: int = 50
    offset: int = 0


def scheduler_nodes(session: Session) -> list[st.Node]:
    nodes = session.scalars(select(Node).options(selectinload(Node.gpus)).order_by(Node.name)).all()
    return [scheduler_node(n) for n in nodes]


@dataclass
class _NodeShapes:
    built_at: float
    verified_at: float
    fingerprint: tuple[int | float | None, ...]  # counts and capacity sums (NULL: no rows)
    nodes: list[st.Node]


# Per database engine (weak: a new engine never inherits a dead one's nodes).
_nodes_cache: weakref.WeakKeyDictionary[Engine | Connection, _NodeShapes] = weakref.WeakKeyDictionary()
NODES_CACHE_S = 30.0
NODES_TRUSTED_S = 1.0


def cached_scheduler_nodes(session: Session, now: float, *, verify: bool = False) -> list[st.Node]:
    """Node shapes for the fit check, without loading every node and GPU on each submit. Shapes
    verified less than NODES_TRUSTED_S ago are used as they are; otherwise (or with `verify`) one
    cheap aggregate over nodes and GPUs is compared (a node or GPU added or removed, capacity
    changed) and the shapes are rebuilt when it changed, and at the latest every NODES_CACHE_S."""
    key = session.get_bind()
    hit = _nodes_cache.get(key)
    if hit is not None and not verify and now - hit.verified_at < NODES_TRUSTED_S:
        return hit.nodes
    fingerprint = tuple(
        session.execute(
            select(
                select(func.count()).select_from(Node).scalar_subquery(),
                select(func.sum(Node.cpus)).scalar_subquery(),
                select(func.sum(Node.memory_mib)).scalar_subquery(),
                select(func.count()).select_from(Gpu).scalar_subquery(),
                select(func.count(func.distinct(Gpu.model))).scalar_subquery(),
            )
        ).one()
    )
    if hit is not None and hit.fingerprint == fingerprint and now - hit.built_at < NODES_CACHE_S:
        hit.verified_at = now
        return hit.nodes
    nodes = scheduler_nodes(session)
    _nodes_cache[key] = _NodeShapes(now, now, fingerprint, nodes)
    return nodes


def check_fits(
    session: Session,
    spec: JobSpecV1,
    group: GroupRef,
    user: str,
    profile: Profile,
    *,
    now: float | None = None,
) -> None:
    """Reject a job that could never run on this cluster even if it were empty, under the profile
    the live loop uses (it decides whether CPU-only work may use GPU nodes), or that its group's
    quotas could never admit (per-user cap, GPU max, CPU/memory max: `quota.check_quota`). With no
    nodes registered yet (a server that is still starting) the cluster check is skipped. A refusal
    is never based on unverified cached shapes: a node registered a moment ago counts."""
    now = time.monotonic() if now is None else now
    job = st.Job(
        id="new",
        group=group.name,
        user=user,
        tasks=spec.task_specs(),
        priority=spec.priority_value,
        preemptible=spec.preemptible,
    )
    reasons: tuple[st.Reason, ...] = ()
    nodes: list[st.Node] = []
    for verify in (False, True):
        nodes = cached_scheduler_nodes(session, now, verify=verify)
        if nodes:
            reasons = check_fits_anywhere(job, nodes, cpu_jobs_on_gpu_nodes=profile.cpu_jobs_on_gpu_nodes)
            if not reasons:
                break
        elif verify:
            break
    if reasons:
        text = "; ".join(r.message for r in reasons)
        raise Invalid(f"this job can never run on this cluster: {text}", ("body", "tasks"))
    check_quota(session, job, group.id, nodes, profile, loaded=group.quotas)


@dataclass(frozen=True, slots=True)
class QuotaRow:
    """One GPU-model quota of a submitting job's group (a `quota.QuotaSource`)."""

    gpu_model: str
    guaranteed: int
    max: int | None


@dataclass(frozen=True, slots=True)
class GroupQuotas:
    """A submitting job's group as its quota check reads it (a `quota.GroupSource`): plain columns
    from one joined SELECT, not ORM rows (loading those cost more than the query)."""

    name: str
    weight: float
    borrowing: bool
    user_max_gpus: int | None
    cpus_max: float | None
    memory_max_mib: int | None
    quotas: tuple[QuotaRow, ...]


@dataclass(frozen=True)
class GroupRef:
    id: int
    name: str
    # The group's quota settings, read by resolve_group in the same transaction: the submit's
    # quota check uses them instead of loading the group a second time (one query per submit).
    quotas: GroupQuotas | None = None


# What a group's scheduling record is built from (GroupQuotas here, the schedule loop's GroupRecord):
# the loop's cache of the cluster's shape digests these same columns (server/snapshot.py), so a
# new group limit added here is seen there too.
GROUP_POLICY_COLUMNS = (
    Group.id,
    Group.name,
    Group.weight,
    Group.borrowing,
    Group.user_max_gpus,
    Group.cpus_max,
    Group.memory_max_mib,
)

# Built once (see RECENT_RUNS): every submission resolves its group, with its GPU quotas.
_GROUP_WITH_QUOTAS = select(
    *GROUP_POLICY_COLUMNS,
    GroupQuota.gpu_model,
    GroupQuota.guaranteed,
    GroupQuota.max,
).outerjoin(GroupQuota, GroupQuota.group_id == Group.id)
GROUP_BY_ID = _GROUP_WITH_QUOTAS.where(Group.id == bindparam("group_id"))
GROUP_BY_NAME = _GROUP_WITH_QUOTAS.where(Group.name == bindparam("name"))


class _GroupRow(NamedTuple):
    """A row of _GROUP_WITH_QUOTAS (the quota columns NULL for a group without quotas)."""

    id: int
    name: str
    weight: float
    borrowing: bool
    user_max_gpus: int | None
    cpus_max: float | None
    memory_max_mib: int | None
    gpu_model: str | None
    guaranteed: int | None
    max: int | None


def _group_ref(result: Sequence[object]) -> GroupRef:
    """The rows of one group joined with its quotas (one row, with NULL quota columns, when it
    has none) -> its GroupRef."""
    rows = cast("Sequence[_GroupRow]", result)
    first = rows[0]
    quotas = tuple(QuotaRow(r.gpu_model, r.guaranteed or 0, r.max) for r in rows if r.gpu_model is not None)
    group = GroupQuotas(
        name=first.name,
        weight=first.weight,
        borrowing=first.borrowing,
        user_max_gpus=first.user_max_gpus,
        cpus_max=first.cpus_max,
        memory_max_mib=first.memory_max_mib,
        quotas=quotas,
    )
    return GroupRef(first.id, first.name, group)


def resolve_group(session: Session, principal: Principal, name: str | None) -> GroupRef:
    """The group a job is charged to: the named one (the submitter must be a member, or an admin)
    or the submitter's default group. One query, the group's columns joined with its quotas
    (what the submit's quota check reads next), as plain rows."""
    if name is None:
        if principal.default_group_id is None:
            raise Invalid(
                "you have no default group; name one in the spec's 'group' field", ("body", "group")
            )
        # FK: the default group exists
        return _group_ref(session.execute(GROUP_BY_ID, {"group_id": principal.default_group_id}).all())
    rows = session.execute(GROUP_BY_NAME, {"name": name}).all()
    group = _group_ref(rows) if rows else None
    if group is None or not (principal.is_member(group.id) or principal.is_admin):
        # A non-member gets a missing group's answer (accounts.visible_group_id's rule).
        raise NotFound(f"no group named {name!r}")
    return group


# One statement per level of the estimate chain, built once like INSERT_JOB below (building a
# select cost about as much as running it, ~0.5 ms of each submission). The name level rides
# ix_jobs_user_name (the user's jobs of that name only).
_LEVEL_WHERE: dict[str, tuple[ColumnElement[bool], ...]] = {
    "name": (Job.user_id == bindparam("user_id"), Job.name == bindparam("name")),
    "user_size": (Job.user_id == bindparam("user_id"), Job.gpus == bindparam("gpus")),
    "group": (Job.group_id == bindparam("group_id"),),
    "cluster": (),
}
RECENT_RUNS = {
    level: select(Attempt.started_at, Attempt.ended_at)
    .join(Job, Job.id == Attempt.job_id)
    .where(
        *where,
        Attempt.state == AttemptState.SUCCEEDED.value,
        Attempt.started_at.is_not(None),
        Attempt.ended_at.is_not(None),
    )
    .order_by(Attempt.id.desc())
    .limit(KEEP_RUNS[level])
    for level, where in _LEVEL_WHERE.items()
}


def _durations(rows: Iterable[tuple[float | None, float | None]]) -> list[float]:
    """Run times of (started_at, ended_at) rows, the incomplete or inverted ones left out."""
    return [end - start for start, end in rows if start is not None and end is not None and end >= start]


# The first two levels (the user's runs of this name, of this size) in one statement: with a
# new job name the name level is empty, and two round trips per submission were two.
FIRST_LEVELS = LEVELS[:2]
_first_runs = [RECENT_RUNS[level].subquery() for level in FIRST_LEVELS]
RECENT_RUNS_FIRST = union_all(
    *(
        select(literal(level).label("level"), runs.c.started_at, runs.c.ended_at)
        for level, runs in zip(FIRST_LEVELS, _first_runs, strict=True)
    )
)


def runtime_estimate(
    session: Session, user_id: int, group_id: int, spec: JobSpecV1
) -> RuntimeEstimate | None:
    """How long this job will likely run, and how sure that is, for the scheduler's estimated
    starts and backfill: the chain of corral.scheduler.runtimes (the user's runs of the same job
    name, else the user's jobs of the same size, else the group's, else the cluster's; the
    median with its 25th-75th percentiles, capped by `max_runtime`); else `max_runtime`; else
    unknown. One query for the first two levels, then one per level, stopping at the first
    with enough runs."""
    params = {"user_id": user_id, "name": spec.name, "gpus": spec.total_gpus, "group_id": group_id}
    first = session.execute(RECENT_RUNS_FIRST, params).all()
    found = {level: _durations((s, e) for lv, s, e in first if lv == level) for level in FIRST_LEVELS}
    for level in LEVELS:
        runs = found[level] if level in found else _durations(session.execute(RECENT_RUNS[level], params))
        if len(runs) >= MIN_RUNS[level]:
            return estimate_from([(level, runs)], spec.max_runtime_s)
    return estimate_from([], spec.max_runtime_s)


# Built once: with the values passed as parameters the compiled statement is reused from
# SQLAlchemy's cache instead of being keyed and looked up again on every submission.
JOB_TABLE = table_of(Job)
INSERT_JOB = insert(JOB_TABLE).returning(JOB_TABLE.c.id)
INSERT_LABELS = insert(table_of(JobLabel))


class JobInsert(TypedDict):
    """The columns INSERT_JOB writes (all of them: the ORM's defaults do not apply to Core)."""

    name: str
    user_id: int
    group_id: int
    state: str
    priority: int
    preemptible: bool
    spec: JobSpecV1
    max_retries: int
    attempt_count: int
    runtime_estimate_s: float | None
    runtime_estimate_low_s: float | None
    runtime_estimate_high_s: float | None
    runtime_estimate_basis: str | None
    gpus: int
    submitted_at: float
    updated_at: float
    cancel_requested: bool
    reason: str
    attained_gpu_seconds: float
    held_by: int | None  # not held (a held submit is held after its INSERT, by lifecycle.hold)
    held_at: float | None
    held_as_admin: bool


def check_no_nul(spec: JobSpecV1) -> None:
    """No command line or environment variable a process gets can hold a NUL: such a job (a NUL
    typed in a spec, or a template's string parameter) was stored and then every attempt failed
    to start, diagnosed `command_not_found`. Checked at submit, not in the spec model, which also
    reads the specs already stored."""
    envs: list[tuple[tuple[str | int, ...], dict[str, str]]] = [(("body", "env"), spec.env)]
    for role, task in spec.tasks.items():
        if "\x00" in task.command:
            raise Invalid(
                f"task {role!r}: its command holds a NUL character (\\x00), which no command line can",
                ("body", "tasks", role, "command"),
            )
        envs.append((("body", "tasks", role, "env"), task.env))
    for loc, env in envs:
        for key, value in env.items():
            if "\x00" in value:
                raise Invalid(
                    f"env {key!r} holds a NUL character (\\x00), which no variable can", (*loc, key)
                )


def is_build_job(spec: JobSpecV1) -> bool:
    """Whether `spec` is an environment's build job: it names the build tools (BUILD_TOOLS_ENV),
    which only corral.environments.service may submit (check_caller_may_submit)."""
    return any(BUILD_TOOLS_ENV in env for env in (spec.env, *(t.env for t in spec.tasks.values())))


def check_caller_may_submit(spec: JobSpecV1, *, workspace: bool, build: bool) -> None:
    """A workspace's job is submitted by corral.services.workspaces alone (`workspace`), an
    environment's build job by corral.environments.service alone (`build`): a spec of either
    from anyone else (a copy through `submit --from-job`, say) is refused, saying where it runs."""
    if spec.kind == "workspace" and not workspace:
        raise Invalid(
            "a job of kind 'workspace' is started by `corral ws start`, not submitted", ("body", "kind")
        )
    if not build and is_build_job(spec):
        raise Invalid(
            "this is a copy of an environment build job: its build step runs only in the build "
            "`corral env create` starts (a new version of the environment), not as a job of its own",
            ("body", "env", BUILD_TOOLS_ENV),
        )


def submit_job(
    session: Session,
    principal: Principal,
    spec: JobSpecV1,
    profile: Profile,
    *,
    now: float | None = None,
    commit: bool = True,
    workspace: bool = False,
    build: bool = False,
    hold: bool = False,
) -> JobView:
    """Validate access and fit, then store the job as QUEUED with a "submitted" event. Commits and
    returns the job's view (the API's JSON shape). `commit=False`: the caller commits (a workspace
    and its job in one transaction); `workspace`: the caller is corral.services.workspaces, the
    only one that may submit a job of kind `workspace`; `build`: the caller is
    corral.environments.service, the only one that may submit an environment's build job;
    `hold`: the job is held at once (`corral submit --hold`), in the same transaction, so the
    schedule loop never sees it until it is released.

    The job and its event are written with two INSERT statements, not through the ORM's unit of
    work: submitting is the hottest write path (bench/api_load.py) and the ORM flush was the
    largest share of its CPU time."""
    now = time.time() if now is None else now
    check_caller_may_submit(spec, workspace=workspace, build=build)
    check_no_nul(spec)
    group = resolve_group(session, principal, spec.group)
    check_fits(session, spec, group, principal.name, profile)
    if spec.secrets:  # names only: the values are read at dispatch
        check_job_secrets(session, principal.user_id, group.id, group.name, spec.secrets)
    stored = spec.model_copy(update={"group": group.name})  # the column stores its JSON
    estimate = runtime_estimate(session, principal.user_id, group.id, spec)
    columns: JobInsert = {
        "name": spec.name,
        "user_id": principal.user_id,
        "group_id": group.id,
        "state": JobState.QUEUED.value,
        "priority": int(spec.priority_value),
        "preemptible": spec.preemptible,
        "spec": stored,
        "max_retries": spec.retries,
        "attempt_count": 0,
        "runtime_estimate_s": None if estimate is None else estimate.seconds,
        "runtime_estimate_low_s": None if estimate is None or estimate.basis == "limit" else estimate.low_s,
        "runtime_estimate_high_s": None if estimate is None or estimate.basis == "limit" else estimate.high_s,
        "runtime_estimate_basis": None if estimate is None else estimate.basis,
        "gpus": spec.total_gpus,
        "submitted_at": now,
        "updated_at": now,
        "cancel_requested": False,
        "reason": "",
        "attained_gpu_seconds": 0.0,
        "held_by": None,
        "held_at": None,
        "held_as_admin": False,
    }
    message = f"submitted by {principal.name} to group {group.name}"
    job_id = session.connection().execute(INSERT_JOB, columns).scalar_one()
    hold_access(session, principal, group.id, group.name)  # after the INSERT: see submit_guard
    record_event(session, job_id, now, message, to_state=JobState.QUEUED.value, immediate=True)
    if spec.labels:  # the filters' rows (GET /jobs?label=k=v); the spec keeps them too
        session.connection().execute(
            INSERT_LABELS, [{"job_id": job_id, "key": k, "value": v} for k, v in spec.labels.items()]
        )
    record_lineage(session, job_id, spec.mounts)  # dataset versions it mounts (pinned at submit)
    record_model_uses(session, job_id, spec.mounts)  # model versions likewise (corral.catalog)
    job = Job(id=job_id, attempts=[], **columns)  # transient: only read by the view (and the hold)
    if hold:  # a row this transaction just wrote: no other can have placed or held it
        message = hold_event_text(principal.name, principal.is_admin)
        hold_queued(
            session, job, user_id=principal.user_id, as_admin=principal.is_admin, now=now, message=message
        )
    notify.changed(session, notify.Topic.JOBS)
    if commit:
        session.commit()
    return job_view(job, group_name=group.name, user_name=principal.name)


def visibility(principal: Principal) -> ColumnElement[bool] | None:
    """SQL condition for the jobs `principal` may see; None = all (admin)."""
    if principal.is_admin:
        return None
    admin_groups = principal.admin_group_ids
    own = Job.user_id == principal.user_id
    return or_(own, Job.group_id.in_(admin_groups)) if admin_groups else own


def visibility_branches(principal: Principal) -> list[ColumnElement[bool]] | None:
    """The jobs `principal` may see as DISJOINT conditions that each ride one index: own jobs
    outside administered groups, then one branch per administered group. None = all (admin).
    An OR of them would make the database scan and sort every visible job for each page."""
    if principal.is_admin:
        return None
    admin_groups = sorted(principal.admin_group_ids)
    own = Job.user_id == principal.user_id
    if not admin_groups:
        return [own]
    return [and_(own, Job.group_id.not_in(admin_groups)), *(Job.group_id == g for g in admin_groups)]


def _filters(session: Session, flt: JobFilter, principal: Principal) -> list[ColumnElement[bool]]:
    """The filters' conditions. A user or group name that does not exist matches nothing; for an
    admin, who may see every name, it is refused naming it (`corral ls --user alcie` listed "0 of
    0 jobs", as if the name were right). Others get no job, as for a name they may not see: an
    error would tell them which names exist (docs/security.md, groups hidden from non-members)."""
    conds: list[ColumnElement[bool]] = []
    if flt.state:
        conds.append(Job.state.in_(list(flt.state)))
    unknown: list[tuple[str, str]] = []  # every unknown name at once: one round trip to fix them
    if flt.user:
        uid = session.scalar(select(User.id).where(User.name == flt.user))
        if uid is None:
            unknown.append(("user", flt.user))
        conds.append(Job.user_id == uid if uid is not None else false())
    if flt.group:
        gid = session.scalar(select(Group.id).where(Group.name == flt.group))
        if gid is None:
            unknown.append(("group", flt.group))
        conds.append(Job.group_id == gid if gid is not None else false())
    for key, value in flt.labels:  # one indexed lookup per label, ANDed
        has = select(JobLabel.job_id).where(JobLabel.key == key)
        conds.append(Job.id.in_(has if value is None else has.where(JobLabel.value == value)))
    if flt.ids is not None:
        conds.append(Job.id.in_(list(flt.ids)) if flt.ids else false())
    if unknown and principal.is_admin:
        raise Invalid.each([(("query", kind), f"no {kind} named {name!r}") for kind, name in unknown])
    return conds


def check_filter(flt: JobFilter) -> None:
    valid_states = {s.value for s in JobState}
    for state in flt.state:
        if state not in valid_states:
            raise Invalid(
                f"unknown state {state!r}; use one of {', '.join(sorted(valid_states))}", ("query", "state")
            )
    if flt.sort not in SORT_COLUMNS:
        raise Invalid(f"cannot sort by {flt.sort!r}; use one of {', '.join(SORT_COLUMNS)}", ("query", "sort"))
    if flt.order not in ("asc", "desc"):
        raise Invalid("order must be 'asc' or 'desc'", ("query", "order"))
    if flt.ids is not None and len(flt.ids) > MAX_IDS:
        raise Invalid(f"{len(flt.ids)} job ids given; at most {MAX_IDS} at once", ("query", "id"))


SortExpression = ColumnElement[float] | ColumnElement[int] | ColumnElement[str]


def _ordering(
    column: SortColumn, order: str, merged: tuple[SortExpression, ColumnElement[int]] | None = None
) -> list[SortExpression]:
    """ORDER BY `column` (or, over the merged branches, their (sort_key, id) columns), ties broken
    by job id."""
    key, job_id = (column, Job.id) if merged is None else merged
    if column is Job.id:
        return [job_id.desc() if order == "desc" else job_id.asc()]
    if order == "desc":
        return [key.desc(), job_id.desc()]
    return [key.asc(), job_id.asc()]


def list_jobs(session: Session, principal: Principal, flt: JobFilter) -> tuple[list[Job], int]:
    """One page of visible jobs and the total count under the same filters.

    Each visibility branch is paged on its own index ((user|group|state, submitted_at)), limited
    to offset+limit rows, and the branches are merged; counts are summed per branch. So a page
    and its total stay fast at 100,000 jobs for admins, members and group admins alike."""
    check_filter(flt)
    column = SORT_COLUMNS[flt.sort]
    filters = _filters(session, flt, principal)
    branches = visibility_branches(principal)
    if branches is None or len(branches) == 1:
        conds = filters + (branches or [])
        ids_stmt = select(Job.id).where(*conds).order_by(*_ordering(column, flt.order))
        ids = list(session.scalars(ids_stmt.limit(flt.limit).offset(flt.offset)))
        total = int(session.scalar(select(func.count(Job.id)).where(*conds)) or 0)
    else:
        reach = flt.offset + flt.limit
        parts = [
            select(Job.id.label("id"), column.label("sort_key"))
            .where(branch, *filters)
            .order_by(*_ordering(column, flt.order))
            .limit(reach)
            .subquery()
            for branch in branches
        ]
        merged = union_all(*(select(p.c.id, p.c.sort_key) for p in parts)).subquery()
        page = select(merged.c.id).order_by(*_ordering(column, flt.order, (merged.c.sort_key, merged.c.id)))
        ids = list(session.scalars(page.limit(flt.limit).offset(flt.offset)))
        total = sum(int(session.scalar(select(func.count(Job.id)).where(b, *filters)) or 0) for b in branches)
    if not ids:
        return [], total
    rows = session.scalars(
        select(Job)
        .where(Job.id.in_(ids))
        .options(
            joinedload(Job.user),
            joinedload(Job.group),
            selectinload(Job.attempts),
            selectinload(Job.holder),  # the page's holders in one query, not one per held job
        )
    ).unique()
    by_id = {job.id: job for job in rows}
    return [by_id[i] for i in ids if i in by_id], total


def matching_ids(
    session: Session,
    principal: Principal,
    flt: JobFilter,
    *,
    scope: ColumnElement[bool] | None = None,
    limit: int | None = None,
    first: ColumnElement[bool] | None = None,
) -> list[int]:
    """The ids of the visible jobs under `flt`'s filters (its paging and sort ignored) and
    `scope` (services.job_sets.scope_condition: whose jobs), oldest first (those `first` holds
    for before the others), at most `limit`: the set a bulk action acts on (services.job_sets)."""
    check_filter(flt)
    seen = visibility(principal)
    conds = _filters(session, flt, principal) + [c for c in (seen, scope) if c is not None]
    order = (Job.id,) if first is None else (first.desc(), Job.id)
    stmt = select(Job.id).where(*conds).order_by(*order)
    return list(session.scalars(stmt if limit is None else stmt.limit(limit)))


def get_job(session: Session, principal: Principal, job_id: int, *, for_update: bool = False) -> Job:
    """The job if the caller may see it, else 404 `no job with id N`: a job the caller may not
    see (another user's, outside the groups they administer) answers exactly as a missing one, so
    ids cannot be probed for which are live (as groups, datasets and workspaces). Callers who may
    see a job but not act on it (a group admin deleting or entering a member's job) get 403 from
    the action naming why."""
    stmt = (
        select(Job)
        .where(Job.id == job_id)
        .options(joinedload(Job.user), joinedload(Job.group), selectinload(Job.attempts))
    )
    seen = visibility(principal)
    if seen is not None:  # an unseen job is not read (nor locked) at all: no timing tell
        stmt = stmt.where(seen)
    if for_update:
        stmt = stmt.with_for_update(of=Job)
    job = session.scalars(stmt).unique().first()
    if job is None:
        raise NotFound(f"no job with id {job_id}")
    return job


EVENTS_SHOWN = 500  # a job's history views show its newest events, this many at most


def job_events(
    session: Session, job_id: int, limit: int = EVENTS_SHOWN, skip: int = 0, before: int | None = None
) -> JobHistory:
    """The job's newest `limit` events after its newest `skip` (to page back), of those before the
    event with id `before` if given (a page that stays put while events are added), oldest
    first, and how many come before them. A job's events have no bound (each label edit, each
    requeue adds one); the views used to read the oldest 500, so a job's latest history, its
    end included, dropped out of them without notice (review112 #3). The count is read beside the
    rows, in one statement: counted apart, an event added in between (PostgreSQL reads each
    statement at its own snapshot) made it one short (review113 #6)."""
    conds = [JobEvent.job_id == job_id] + ([JobEvent.id < before] if before is not None else [])
    # All that match, before the offset and limit: an uncorrelated subquery, run once in the
    # statement (an index count); a window count(*) over () read every event row of the job
    # before the first came out (review114 #3).
    total = select(func.count()).select_from(JobEvent).where(*conds).scalar_subquery().label("total")
    newest = select(JobEvent, total).where(*conds).order_by(JobEvent.id.desc()).offset(skip).limit(limit)
    rows = session.execute(newest).all()
    events = [event for event, _ in reversed(rows)]
    matching = rows[0].total if rows else 0  # none: skipped past them all, none earlier either
    return JobHistory(events, max(0, matching - skip - len(events)))


def cancel_job(
    session: Session,
    principal: Principal,
    job_id: int,
    *,
    now: float | None = None,
    reason: str | None = None,
) -> Job:
    """Cancel per the contract in this module's docstring. Commits. `reason`: the caller's words
    after who cancelled it ("cancelled by alice: stopped early, loss 0.9 > median 0.4"), in the
    event and the job's reason, which `corral show` prints."""
    now = time.time() if now is None else now
    job = get_job(session, principal, job_id, for_update=True)
    before = job_state(job)
    state = JobState(job.state)
    said = f": {reason}" if reason else ""
    if state is JobState.QUEUED:
        message = f"cancelled by {principal.name}{said}"
        if transition(
            session, job, JobState.CANCELLED, now=now, message=message, values={"cancel_requested": True}
        ):
            notify.changed(session, notify.Topic.CANCEL)
            _audit_cancel(session, principal, job, before)
            session.commit()
            return job
        state = JobState(job.state)  # placed meanwhile (re-read): ask the loops to stop it instead
    if state.terminal:
        raise Conflict(f"job {job_id} has already ended ({state.value}); there is nothing to cancel")
    if not job.cancel_requested and not request_cancel(
        session, job, now=now, why=f"cancel requested by {principal.name}{said}"
    ):  # ended since it was read (its row is locked on PostgreSQL: only SQLite gets here)
        raise Conflict(f"job {job_id} has already ended ({job.state}); there is nothing to cancel")
    notify.changed(session, notify.Topic.CANCEL)
    _audit_cancel(session, principal, job, before)
    session.commit()
    return job


def _audit_cancel(session: Session, principal: Principal, job: Job, before: dict[str, object]) -> None:
    audit.record(
        session,
        actor=principal,
        action="job.cancel",
        target_kind="job",
        target_id=job.id,
        before=before,
        after=job_state(job),
    )
