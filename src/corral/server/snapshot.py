"""The scheduler's view of the cluster, built from the database.

Two steps so that the live loop and tests (and the simulator comparison) can share the second:
`read_cluster_state(session)` copies the rows into plain records (I/O), and
`build_snapshot(state, now, half_life_s)` turns records into a scheduler `Snapshot` (pure: same
inputs, same snapshot).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import Any, NamedTuple, cast

from sqlalchemy import Select, String, and_, bindparam, func, or_, select
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import InstrumentedAttribute, Session, joinedload, selectinload
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.selectable import ScalarSelect

from corral.datasets.quotas import groups_over_quota
from corral.db.diag_models import JobAvoid
from corral.db.models import Attempt, Gpu, Group, GroupQuota, Job, Node, UsageLedger, User
from corral.domain import Placement
from corral.scheduler import check_fits_anywhere
from corral.scheduler import types as st
from corral.scheduler.cluster import ShapeKey, shape_key
from corral.server.specview import read_spec
from corral.services.jobs import GROUP_POLICY_COLUMNS
from corral.services.lifecycle import AttemptState, GpuHealth, JobState
from corral.services.nodes import scheduler_node
from corral.services.quota import scheduler_group
from corral.spec import JobSpecV1

USAGE_HALF_LIFE_S = 7 * 24 * 3600.0  # fair share forgets half of past usage every week
MAX_STOP_GRACE_S = 300.0  # default of Settings.max_stop_grace_s
LIVE_JOB_STATES = (JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING, JobState.PREEMPTED)
LIVE_ATTEMPT_STATES = (AttemptState.SCHEDULED, AttemptState.STARTING, AttemptState.RUNNING)


@dataclass(frozen=True, slots=True)
class QuotaRecord:
    gpu_model: str
    guaranteed: int
    max: int | None


@dataclass(frozen=True, slots=True)
class GroupRecord:
    name: str
    weight: float = 1.0
    borrowing: bool = True
    user_max_gpus: int | None = None
    quotas: tuple[QuotaRecord, ...] = ()
    cpus_max: float | None = None  # None: no limit
    memory_max_mib: int | None = None
    storage_over: str | None = None  # why it is over its storage quota (corral.datasets.quotas)


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: int
    group: str
    user: str
    priority: int
    preemptible: bool
    spec: JobSpecV1
    submitted_at: float
    runtime_estimate_s: float | None = None
    runtime_spread: tuple[float, float] | None = None  # its 25th/75th percentile (runtimes.py)
    runtime_is_limit: bool = False  # the estimate is the job's max_runtime (basis "limit")
    attained_gpu_seconds: float = 0.0
    preemptions: int = 0  # times the job was preempted (the default policy bounds it)
    # For live jobs: the current attempt's placement and when it started.
    placement: Placement = ()
    started_at: float | None = None
    borrowed: bool = False
    # A preempted job still holds its GPUs until its stop ends: when that will be at the latest.
    stops_by: float | None = None
    # Retry after a failure (corral.diagnosis): where not to run, and not before when (backoff).
    avoid: tuple[tuple[str, int | None], ...] = ()
    not_before: float | None = None
    state: str = ""  # the job's state (JobState value); server/ahead.py tells RUNNING ones apart


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    group: str
    user: str
    gpu_seconds: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class ClusterState:
    nodes: tuple[st.Node, ...]
    groups: tuple[GroupRecord, ...]
    queued: tuple[JobRecord, ...]
    running: tuple[JobRecord, ...]
    ledger: tuple[LedgerRecord, ...] = field(default_factory=tuple)


def decayed(gpu_seconds: float, since: float, now: float, half_life_s: float) -> float:
    if half_life_s <= 0 or now <= since:
        return gpu_seconds
    return gpu_seconds * 0.5 ** ((now - since) / half_life_s)


def scheduler_job(record: JobRecord, max_stop_grace_s: float = MAX_STOP_GRACE_S) -> st.Job:
    """The scheduler's Job. Its stop grace is the spec's `stop_grace` bounded by the admin maximum;
    a spec without one leaves the scheduler profile's grace (None)."""
    view = read_spec(record.spec)
    grace = min(view.stop_grace_s, max_stop_grace_s) if record.spec.stop_grace else None
    return st.Job(
        id=str(record.id),
        group=record.group,
        user=record.user,
        tasks=tuple(
            st.TaskSpec(role=t.role, instances=t.instances, resources=t.resources) for t in view.tasks
        ),
        priority=st.Priority(record.priority),
        preemptible=record.preemptible,
        submit_time=record.submitted_at,
        runtime_estimate=record.runtime_estimate_s,
        runtime_spread=record.runtime_spread,
        runtime_is_limit=record.runtime_is_limit,
        attained_gpu_seconds=record.attained_gpu_seconds,
        preemptions=record.preemptions,
        stop_grace_s=grace,
        avoid=record.avoid,
    )


def _allocation(record: JobRecord) -> st.Allocation:
    return st.Allocation(
        job_id=str(record.id),
        instances=tuple(
            st.InstancePlacement(
                role=p.role,
                index=p.index,
                node=p.node,
                gpu_indices=p.gpu_indices,
                cpus=p.cpus,
                memory_mib=p.memory_mib,
            )
            for p in record.placement
        ),
    )


def _submission(record: JobRecord) -> tuple[float, int]:
    return (record.submitted_at, record.id)


class AvoidLapse:
    """A job as the scheduler should see it: its retry's avoid (diagnosis.record: the GPU or
    node of a hardware failure) lapses while the job could not fit outside it even on an empty
    cluster of the nodes and GPUs usable now (ready, healthy). Kept, such a job would wait for
    as long as nothing else can hold it: forever on a cluster with nowhere else to go (one node,
    a job that needs every GPU of the only nodes of its model, the other nodes gone). Lapsed, it
    is retried where it failed, which is safe: a GPU still faulty is quarantined (unhealthy, out
    of placement) apart from the avoid, which is a preference for the first retry. Checked again
    every cycle, so the avoid holds once another place can take the job.

    One per snapshot (build_snapshot, every scheduling cycle): the usable nodes are filtered
    once, and the answer kept per (job shape, avoid), all it depends on."""

    def __init__(self, nodes: Sequence[st.Node], cpu_jobs_on_gpu_nodes: bool) -> None:
        self.usable = [replace(n, gpus=tuple(g for g in n.gpus if g.healthy)) for n in nodes if n.schedulable]
        self.cpu_jobs_on_gpu_nodes = cpu_jobs_on_gpu_nodes
        self._fits: dict[tuple[ShapeKey, tuple[tuple[str, int | None], ...]], bool] = {}

    def __call__(self, record: JobRecord) -> JobRecord:
        if not record.avoid:
            return record
        bare = replace(record, avoid=())
        job = scheduler_job(bare)
        key = (shape_key(job), record.avoid)
        fits = self._fits.get(key)
        if fits is None:
            nodes_out = {n for n, gpu in record.avoid if gpu is None}
            gpus_out = {(n, gpu) for n, gpu in record.avoid if gpu is not None}
            elsewhere = [
                replace(n, gpus=tuple(g for g in n.gpus if (n.name, g.index) not in gpus_out))
                for n in self.usable
                if n.name not in nodes_out
            ]
            fits = not check_fits_anywhere(job, elsewhere, cpu_jobs_on_gpu_nodes=self.cpu_jobs_on_gpu_nodes)
            self._fits[key] = fits
        return record if fits else bare


def build_snapshot(
    state: ClusterState,
    now: float,
    half_life_s: float = USAGE_HALF_LIFE_S,
    max_stop_grace_s: float = MAX_STOP_GRACE_S,
    cpu_jobs_on_gpu_nodes: bool = False,
) -> st.Snapshot:
    """Pure: records -> Snapshot. Queued jobs keep submission order (the scheduler sorts anyway).
    `cpu_jobs_on_gpu_nodes`: the profile's, for whether a retry's avoid can wait
    (`AvoidLapse`)."""
    by_group: dict[str, float] = {}
    by_user: dict[tuple[str, str], float] = {}
    for row in state.ledger:
        value = decayed(row.gpu_seconds, row.updated_at, now, half_life_s)
        by_group[row.group] = by_group.get(row.group, 0.0) + value
        by_user[(row.group, row.user)] = by_user.get((row.group, row.user), 0.0) + value
    lapse = AvoidLapse(state.nodes, cpu_jobs_on_gpu_nodes)
    running = tuple(
        st.RunningJob(
            job=scheduler_job(r, max_stop_grace_s),
            allocation=_allocation(r),
            start_time=r.started_at if r.started_at is not None else r.submitted_at,
            borrowed=r.borrowed,
            stopping=r.stops_by is not None,
            stops_by=r.stops_by,
        )
        for r in state.running
    )
    return st.Snapshot(
        nodes=state.nodes,
        groups=tuple(replace(scheduler_group(g), storage_over=g.storage_over) for g in state.groups),
        queued=tuple(
            scheduler_job(lapse(r), max_stop_grace_s)
            for r in sorted(state.queued, key=_submission)
            if r.not_before is None or r.not_before <= now  # a retry's backoff keeps it out until then
        ),
        running=running,
        usage=st.Usage(by_group=by_group, by_user=by_user),
    )


_JOB_COLUMNS = (
    Job.id,
    Job.user_id,
    Job.group_id,
    Job.priority,
    Job.preemptible,
    Job.spec,
    Job.submitted_at,
    Job.runtime_estimate_s,
    Job.attained_gpu_seconds,
    Job.runtime_estimate_low_s,
    Job.runtime_estimate_high_s,
    Job.state,
    Job.updated_at,
    Job.preemptions,
    Job.runtime_estimate_basis,
)
_ATTEMPT_COLUMNS = (
    Attempt.placement,
    Attempt.started_at,
    Attempt.created_at,
    Attempt.borrowed,
    Attempt.stop_grace_s,
)


class _JobRow(NamedTuple):
    """A row of read_cluster_state's select: _JOB_COLUMNS, _ATTEMPT_COLUMNS (None for a job
    without a live attempt: outer join) and Attempt.id."""

    id: int
    user_id: int
    group_id: int
    priority: int
    preemptible: bool
    spec: JobSpecV1
    submitted_at: float
    runtime_estimate_s: float | None
    attained_gpu_seconds: float
    runtime_estimate_low_s: float | None
    runtime_estimate_high_s: float | None
    state: str
    updated_at: float
    preemptions: int
    runtime_estimate_basis: str | None
    placement: Placement | None
    started_at: float | None
    created_at: float | None
    borrowed: bool | None
    stop_grace_s: float | None
    attempt_id: int | None


def _job_record(row: _JobRow, names: Mapping[int, str], groups: Mapping[int, str], live: bool) -> JobRecord:
    """From a row of _JOB_COLUMNS (+ _ATTEMPT_COLUMNS when `live`): plain columns, no ORM objects,
    because this runs every schedule cycle for every waiting and running job."""
    job_id, user_id, group_id, priority, preemptible, spec, submitted, estimate, attained = row[:9]
    low, high, state, updated, preemptions, basis = row[9:15]
    placement, started, created, borrowed, grace = row[15:20] if live else ((), None, None, False, None)
    # PREEMPTED: the schedule loop entered it at `updated_at` and gave the attempt `stop_grace_s`.
    stopping = live and state == JobState.PREEMPTED.value
    stops_by = updated + (grace or 0.0) if stopping else None
    return JobRecord(
        id=job_id,
        group=groups.get(group_id, "?"),
        user=names.get(user_id, "?"),
        priority=priority,
        preemptible=preemptible,
        spec=spec,
        submitted_at=submitted,
        runtime_estimate_s=estimate,
        runtime_spread=None if low is None or high is None else (low, high),
        runtime_is_limit=basis == "limit",
        attained_gpu_seconds=attained,
        preemptions=preemptions,
        placement=tuple(placement or ()),
        started_at=(started or created) if live else None,
        borrowed=bool(borrowed),
        stops_by=stops_by,
        state=state,
    )


def _with_avoid(record: JobRecord, avoid: Mapping[int, JobAvoid]) -> JobRecord:
    row = avoid.get(record.id)
    if row is None:
        return record
    places = {(str(n), None) for n in row.nodes or ()} | {(str(n), int(g)) for n, g in row.gpus or ()}
    order = sorted(places, key=lambda p: (p[0], -1 if p[1] is None else p[1]))
    return replace(record, avoid=tuple(order), not_before=row.not_before)


# Built once: the dispatch and reconcile loops run it for every batch they record.
JOBS_WITH_OWNERS = (
    select(Job)
    .where(Job.id.in_(bindparam("ids", expanding=True)))
    .options(joinedload(Job.user), joinedload(Job.group))
    .execution_options(populate_existing=True)
)


def jobs_with_live_attempts(
    session: Session, ids: Sequence[int]
) -> tuple[dict[int, Job], dict[int, Attempt]]:
    """Fresh rows (not stale session copies) of these jobs, with owner and group loaded, and their
    current attempts: what the dispatch and reconcile loops read before recording a batch.
    Owner and group are joined into the jobs' query (many-to-one): one statement, not three."""
    jobs = session.scalars(JOBS_WITH_OWNERS, {"ids": list(ids)}).unique().all()
    return {j.id: j for j in jobs}, live_attempts(session, ids)


# Built once with bound parameters (several calls per loop tick): building the select and its
# cache key each call cost ~40 us more than looking the compiled one up.
LIVE_ATTEMPTS = select(Attempt).where(
    Attempt.job_id.in_(bindparam("job_ids", expanding=True)),
    Attempt.state.in_([s.value for s in LIVE_ATTEMPT_STATES]),
)


def live_attempts(session: Session, job_ids: Sequence[int]) -> dict[int, Attempt]:
    """The current (not finished) attempt of each job that has one."""
    if not job_ids:
        return {}
    rows = session.scalars(LIVE_ATTEMPTS, {"job_ids": list(job_ids)})
    return {a.job_id: a for a in rows}


def placeable_node(row: Node) -> st.Node:
    """The node as the scheduler sees it, with a GPU that Corral quarantined or declared lost
    offered as unhealthy (the scheduler never places on an unhealthy GPU)."""
    node = scheduler_node(row)
    withheld = {g.index for g in row.gpus if g.health != GpuHealth.HEALTHY.value}
    if not withheld:
        return node
    gpus = tuple(replace(g, healthy=False) if g.index in withheld else g for g in node.gpus)
    return replace(node, gpus=gpus)


_FIELD, _ROW, _NULL = "\x1f", "\x1e", "\x1d"  # separators no name or label is expected to hold


_Text = str | None
ShapeDigest = Select[_Text, _Text, _Text, _Text, _Text]  # one text per table


def _rows_text(
    key: Sequence[InstrumentedAttribute[Any]], *columns: InstrumentedAttribute[Any], ordered: bool
) -> ScalarSelect[str | None]:
    """Every row's `columns` as one string (NULL: no rows), in the database: SQLite's
    group_concat, PostgreSQL's string_agg. `ordered`: by the table's `key` inside the aggregate
    (PostgreSQL, where an UPDATE moves a row and a scan returns rows in another order: the
    node loop's heartbeat writes would read as a change nearly every cycle). SQLite before 3.44
    has no ORDER BY in an aggregate; its scan follows the rowid, which no UPDATE moves. Rows in
    another order would read as a change, which costs a rebuild and nothing else."""
    parts: list[ColumnElement[str]] = [func.coalesce(sql_cast(c, String), _NULL) for c in columns]
    row = reduce(lambda a, b: a.concat(_FIELD).concat(b), parts)
    text = func.aggregate_strings(row, _ROW)
    return select(text.aggregate_order_by(*key) if ordered else text).scalar_subquery()


def _shape_digest_statement(ordered: bool) -> ShapeDigest:
    """Every column the cluster's shape (ClusterShape) is built from, and nothing else: a cordon
    or drain (Node.state), a GPU the engine reports unhealthy (Gpu.healthy) or Corral
    quarantined or declared lost (Gpu.health), a node or GPU added or removed, a quota, a group's
    limits, a new user all change it, whoever wrote them (an API route, the node loop, another
    server). One statement instead of five SELECTs and their ORM rows."""
    gpu_key = (Gpu.node_name, Gpu.index)
    return select(
        _rows_text(
            (Node.name,), Node.name, Node.cpus, Node.memory_mib, Node.labels, Node.state, ordered=ordered
        ),
        _rows_text(
            gpu_key,
            Gpu.node_name,
            Gpu.index,
            Gpu.uuid,
            Gpu.model,
            Gpu.memory_mib,
            Gpu.topology_group,
            Gpu.healthy,
            Gpu.health,
            ordered=ordered,
        ),
        _rows_text((Group.id,), *GROUP_POLICY_COLUMNS, ordered=ordered),
        _rows_text(
            (GroupQuota.id,),
            GroupQuota.id,
            GroupQuota.group_id,
            GroupQuota.gpu_model,
            GroupQuota.guaranteed,
            GroupQuota.max,
            ordered=ordered,
        ),
        _rows_text((User.id,), User.id, User.name, ordered=ordered),
    )


# Built once each; PostgreSQL's orders its rows (see _rows_text).
SHAPE_DIGEST = _shape_digest_statement(ordered=False)
SHAPE_DIGEST_ORDERED = _shape_digest_statement(ordered=True)
SHAPE_MAX_AGE_S = 10.0  # rebuilt at least this often, whatever the digest says


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """What a cycle reads that only an operator's or the node loop's write changes: the nodes as
    the scheduler sees them, the groups (storage_over left out: read every cycle), names by id."""

    digest: tuple[str | None, ...]
    nodes: tuple[st.Node, ...]
    groups: tuple[GroupRecord, ...]
    group_names: Mapping[int, str]
    user_names: Mapping[int, str]
    built_at: float  # time.monotonic()


@dataclass
class ShapeCache:
    """The schedule loop's ClusterShape between cycles (LoopMemory.shape_cache); never the truth:
    each cycle compares SHAPE_DIGEST, read in its own snapshot's transaction, before using it."""

    shape: ClusterShape | None = None
    hits: int = 0
    builds: int = 0


def _shape_digest(session: Session) -> tuple[str | None, ...]:
    ordered = session.get_bind().dialect.name == "postgresql"
    return tuple(session.execute(SHAPE_DIGEST_ORDERED if ordered else SHAPE_DIGEST).one())


def read_shape(session: Session, digest: tuple[str | None, ...] | None = None) -> ClusterShape:
    """Nodes with their GPUs, groups with their quotas, user names: one SELECT per table."""
    nodes = session.scalars(select(Node).options(selectinload(Node.gpus)).order_by(Node.name)).all()
    groups = session.scalars(select(Group).options(selectinload(Group.quotas)).order_by(Group.name)).all()
    user_names: dict[int, str] = {row[0]: row[1] for row in session.execute(select(User.id, User.name))}
    return ClusterShape(
        digest=digest or (),
        nodes=tuple(placeable_node(n) for n in nodes),
        groups=tuple(
            GroupRecord(
                name=g.name,
                weight=g.weight,
                borrowing=g.borrowing,
                user_max_gpus=g.user_max_gpus,
                quotas=tuple(QuotaRecord(q.gpu_model, q.guaranteed, q.max) for q in g.quotas),
                cpus_max=g.cpus_max,
                memory_max_mib=g.memory_max_mib,
            )
            for g in groups
        ),
        group_names={g.id: g.name for g in groups},
        user_names=user_names,
        built_at=time.monotonic(),
    )


def cached_shape(session: Session, cache: ShapeCache) -> ClusterShape:
    """The cached shape if SHAPE_DIGEST still reads the same (one statement), else read again.
    Kept only if the digest read after the rows equals the one before: a write that landed
    between them (each statement may see a newer commit) would otherwise pair a digest with rows
    it does not describe."""
    digest = _shape_digest(session)
    hit = cache.shape
    if hit is not None and hit.digest == digest and time.monotonic() - hit.built_at < SHAPE_MAX_AGE_S:
        cache.hits += 1
        return hit
    shape = read_shape(session, digest)
    cache.builds += 1
    cache.shape = shape if _shape_digest(session) == digest else None
    return shape


_LIVE_JOB = Job.state.in_([s.value for s in LIVE_JOB_STATES])
# The schedule cycle's reads of the queue and live jobs, the usage ledger and the retry
# exclusions, built once (the jobs' select cost ~0.13 ms to build, every cycle). SQLAlchemy types
# selects of up to 10 columns: the jobs' 20 are named by _JobRow instead.
CLUSTER_JOBS = (
    select(*_JOB_COLUMNS, *_ATTEMPT_COLUMNS, Attempt.id.label("attempt_id"))
    .outerjoin(
        Attempt,
        and_(
            Attempt.job_id == Job.id,
            _LIVE_JOB,
            Attempt.state.in_([s.value for s in LIVE_ATTEMPT_STATES]),
        ),
    )
    # A held job (`corral hold`) is no input at all: never placed, not counted ahead of anyone in
    # queue positions and estimated starts; the scheduler library knows nothing of holds.
    .where(
        or_(
            and_(Job.state == JobState.QUEUED.value, Job.cancel_requested.is_(False), Job.held_by.is_(None)),
            _LIVE_JOB,
        )
    )
)
LEDGER_ROWS = select(UsageLedger)
AVOID_ROWS = select(JobAvoid)


def read_cluster_state(session: Session, cache: ShapeCache | None = None) -> ClusterState:
    """One SELECT per table read: nodes, their GPUs, groups, their quotas, users (or, with `cache`,
    one digest of them when it is unchanged: cached_shape), jobs (waiting and live, with the live
    ones' current attempt joined), usage ledger, retry exclusions, the groups over their storage
    quota (storage_accounts) (tests/server/test_snapshot_queries.py keeps it so)."""
    shape = read_shape(session) if cache is None else cached_shape(session, cache)
    group_names, user_names = shape.group_names, shape.user_names
    jobs = cast("Sequence[_JobRow]", session.execute(CLUSTER_JOBS).all())
    queued = [row for row in jobs if row.state == JobState.QUEUED.value]
    live = [row for row in jobs if row.state != JobState.QUEUED.value and row.attempt_id is not None]
    ledger = session.scalars(LEDGER_ROWS).all()
    avoid = {a.job_id: a for a in session.scalars(AVOID_ROWS)}
    storage_over = groups_over_quota(session)
    return ClusterState(
        nodes=shape.nodes,
        groups=tuple(
            replace(g, storage_over=storage_over[g.name]) if g.name in storage_over else g
            for g in shape.groups
        ),
        queued=tuple(_with_avoid(_job_record(row, user_names, group_names, False), avoid) for row in queued),
        running=tuple(_job_record(row, user_names, group_names, True) for row in live),
        ledger=tuple(LedgerRecord(r.group_name, r.user_name, r.gpu_seconds, r.updated_at) for r in ledger),
    )
