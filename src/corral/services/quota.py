"""Quotas seen from the platform: what a group holds now (usage), guarantees that add up to more
than the cluster (warnings), and the submit-time refusal of a job its group's quotas can never
admit (the scheduler's own rule, `corral.scheduler.admission.quota_refusals`).

Overcommitted guarantees are accepted, with a warning wherever quotas are listed: nodes come and
go, so a guarantee the cluster cannot honour today may be right tomorrow. Functions flush nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session, joinedload, selectinload

from corral.db.models import Attempt, Gpu, Group, Job, Node
from corral.scheduler import ANY_MODEL, Profile
from corral.scheduler import types as st
from corral.scheduler.admission import QuotaLedger, quota_refusals
from corral.services.errors import Invalid
from corral.services.lifecycle import AttemptState

LIVE_ATTEMPT_STATES = (AttemptState.SCHEDULED, AttemptState.STARTING, AttemptState.RUNNING)


class QuotaSource(Protocol):
    """One GPU-model quota: a `GroupQuota` row or the schedule loop's `QuotaRecord`."""

    @property
    def gpu_model(self) -> str: ...
    @property
    def guaranteed(self) -> int: ...
    @property
    def max(self) -> int | None: ...


class GroupSource(Protocol):
    """A group's quota settings: a `Group` row or the schedule loop's `GroupRecord`."""

    @property
    def name(self) -> str: ...
    @property
    def weight(self) -> float: ...
    @property
    def borrowing(self) -> bool: ...
    @property
    def user_max_gpus(self) -> int | None: ...
    @property
    def quotas(self) -> Sequence[QuotaSource]: ...
    @property
    def cpus_max(self) -> float | None: ...
    @property
    def memory_max_mib(self) -> int | None: ...


# The max given to a GPU model whose quota sets none while the group's "*" quota sets one (more
# GPUs than any cluster or quota has: the API takes at most 100,000).
NO_GPU_MAX = 1_000_000_000


def gpu_limits(quotas: Iterable[QuotaSource]) -> dict[str, int]:
    """The groups' `max` per quota key as the scheduler reads it. A row without a max means no
    limit for its model ("*" covers only the models the group lists no quota for), but in the
    scheduler's Group a key missing from `max` falls back to `max["*"]`: such a model gets
    NO_GPU_MAX when "*" has a max."""
    quotas = list(quotas)
    limits = {q.gpu_model: q.max for q in quotas if q.max is not None}
    if ANY_MODEL in limits:
        limits.update({q.gpu_model: NO_GPU_MAX for q in quotas if q.max is None})
    return limits


def scheduler_group(group: GroupSource) -> st.Group:
    """The scheduler's view of a group (its `quotas` loaded): the one conversion the submit check,
    group usage and the schedule loop's snapshot share."""
    limits = gpu_limits(group.quotas)
    return st.Group(
        name=group.name,
        guaranteed={q.gpu_model: q.guaranteed for q in group.quotas},
        max=limits or None,
        user_max_gpus=group.user_max_gpus,
        weight=group.weight,
        borrowing=group.borrowing,
        cpus_max=group.cpus_max,
        memory_max_mib=group.memory_max_mib,
    )


# Built once: constructing it cost about as much as running it, on every submission.
GROUP_WITH_QUOTAS = select(Group).where(Group.id == bindparam("group_id")).options(joinedload(Group.quotas))


def check_quota(
    session: Session,
    job: st.Job,
    group_id: int,
    nodes: Sequence[st.Node],
    profile: Profile,
    *,
    loaded: GroupSource | None = None,
) -> None:
    """Refuse (422) a job its group's quotas could never admit: over the per-user cap, more GPUs
    than the group may hold of every model it could use, more CPUs or memory than the group's max.
    Without quotas in the profile (fifo, sjf, las) nothing is refused here. One query (the group
    joined with its GPU quotas), none when the caller read them in this transaction (`loaded`:
    the group `group_id` names, services.jobs.resolve_group): submitting is the hottest write path."""
    if not profile.quotas:
        return
    group: GroupSource
    if loaded is not None:
        group = loaded
    else:  # resolved a moment ago in the same transaction
        group = session.scalars(GROUP_WITH_QUOTAS, {"group_id": group_id}).unique().one()
    reasons = quota_refusals(job, scheduler_group(group), _job_models(job, group, nodes))
    if reasons:
        text = "; ".join(r.message for r in reasons)
        raise Invalid(f"this job can never run under group {group.name}'s quota: {text}", ("body", "tasks"))


def _job_models(job: st.Job, group: GroupSource, nodes: Sequence[st.Node]) -> list[str]:
    """GPU models the job's GPU tasks may use: the cluster's; with no GPU node registered yet, the
    models it names, else every model the group's quotas name plus ANY_MODEL (it could run on a
    model they do not name)."""
    known = {g.model for n in nodes for g in n.gpus}
    registered = bool(known)
    if not registered:
        known = {q.gpu_model for q in group.quotas} | {ANY_MODEL}  # "*": any model they do not name
    out: set[str] = set()
    for t in job.tasks:
        if t.resources.gpus > 0:
            allowed = t.resources.gpu_models
            out.update(known if allowed is None else (allowed & known if registered else allowed))
    return sorted(out)


# --- usage and warnings -----------------------------------------------------------------------


@dataclass
class GpuUsage:
    """One quota key of a group: GPUs its live attempts hold under it, and of those how many are
    borrowed (attempts the scheduler placed beyond the guarantee: the lender may reclaim them)."""

    used: int = 0
    borrowed: int = 0
    models: dict[str, int] = field(default_factory=dict)


@dataclass
class GroupUsage:
    gpus: dict[str, GpuUsage] = field(default_factory=dict)  # quota key -> usage
    cpus: float = 0.0
    memory_mib: int = 0


@dataclass(frozen=True)
class Cluster:
    gpus_by_model: dict[str, int]
    gpu_model_at: dict[tuple[str, int], str]  # (node, GPU index) -> model
    cpus: float
    memory_mib: int
    nodes: int


def read_cluster(session: Session) -> Cluster:
    at = {(n, i): m for n, i, m in session.execute(select(Gpu.node_name, Gpu.index, Gpu.model))}
    by_model: dict[str, int] = defaultdict(int)
    for model in at.values():
        by_model[model] += 1
    count, cpus, memory = session.execute(
        select(func.count(Node.name), func.sum(Node.cpus), func.sum(Node.memory_mib))
    ).one()
    return Cluster(dict(by_model), at, float(cpus or 0.0), int(memory or 0), int(count or 0))


def group_usage(session: Session, groups: Iterable[Group], cluster: Cluster) -> dict[int, GroupUsage]:
    """What each group's live attempts hold now, from their placements (one query)."""
    by_id = {g.id: g for g in groups}
    out = {gid: GroupUsage() for gid in by_id}
    if not by_id:
        return out
    rows = session.execute(
        select(Job.group_id, Attempt.placement, Attempt.borrowed)
        .join(Job, Job.id == Attempt.job_id)
        .where(Job.group_id.in_(list(by_id)), Attempt.state.in_([s.value for s in LIVE_ATTEMPT_STATES]))
    )
    keyed = {gid: scheduler_group(g) for gid, g in by_id.items()}  # reads the quota keys
    for group_id, placement, borrowed in rows:
        usage, group = out[group_id], keyed[group_id]
        for p in placement or ():
            usage.cpus += p.cpus
            usage.memory_mib += p.memory_mib
            for index in p.gpu_indices:
                model = cluster.gpu_model_at.get((p.node, index), "unknown")
                row = usage.gpus.setdefault(QuotaLedger.key(group, model), GpuUsage())
                row.used += 1
                row.borrowed += bool(borrowed)
                row.models[model] = row.models.get(model, 0) + 1
    return out


def usage_view(group: Group, usage: GroupUsage) -> dict[str, object]:
    """The `usage` object of a group's JSON: per quota key (GPU model, or "*" for models the group
    lists no quota for) used, borrowed, guaranteed and max; CPUs and memory used against quota."""
    quotas = {q.gpu_model: q for q in group.quotas}
    gpus = []
    for key in sorted(set(quotas) | set(usage.gpus)):
        q, u = quotas.get(key), usage.gpus.get(key, GpuUsage())
        gpus.append(
            {
                "gpu_model": key,
                "used": u.used,
                "borrowed": u.borrowed,
                "guaranteed": q.guaranteed if q is not None else 0,
                "max": q.max if q is not None else None,
                "models": dict(sorted(u.models.items())),
            }
        )
    return {
        "gpus": gpus,
        "cpus": {"used": usage.cpus, "guaranteed": group.cpus_guaranteed, "max": group.cpus_max},
        "memory_mib": {
            "used": usage.memory_mib,
            "guaranteed": group.memory_guaranteed_mib,
            "max": group.memory_max_mib,
        },
    }


def any_model_max_warnings(group: GroupSource) -> list[str]:
    """A `*` max caps only the models the group lists no quota for (docs/scheduler.md, "Quota
    keys"): beside a `*` row with a max, a model with a row of its own is capped by that row alone
    (no max: no limit). Say so, naming those models, where the group's quotas are shown."""
    star = next((q for q in group.quotas if q.gpu_model == ANY_MODEL), None)
    own = sorted((q for q in group.quotas if q.gpu_model != ANY_MODEL), key=lambda q: q.gpu_model)
    if star is None or star.max is None or not own:
        return []
    caps = ", ".join(
        f"{q.gpu_model} ({'no max' if q.max is None else f'max {q.max}'} of its own)" for q in own
    )
    return [
        f"group {group.name}: the '*' max of {star.max} GPUs does not cap {caps}: '*' covers only the "
        "models without a quota of their own (give such a model its own max, or remove its quota to "
        "put it under '*')"
    ]


def overcommit_warnings(session: Session, cluster: Cluster) -> dict[str, list[str]]:
    """Group name -> warnings about guarantees (its own among them) that add up to more than the
    cluster has: per GPU model, all GPUs together, CPUs, memory. Reads every group (the sums are
    over all of them) but names none but the one it is shown on. Empty while no node is known."""
    if cluster.nodes == 0:
        return {}
    groups = session.scalars(select(Group).options(selectinload(Group.quotas))).all()
    per_model: dict[str, int] = defaultdict(int)
    total = 0
    for g in groups:
        for q in g.quotas:
            per_model[q.gpu_model] += q.guaranteed
            total += q.guaranteed
    cluster_gpus = sum(cluster.gpus_by_model.values())
    cpus = sum(g.cpus_guaranteed for g in groups)
    memory = sum(g.memory_guaranteed_mib for g in groups)
    out: dict[str, list[str]] = {}
    for g in groups:
        mine = []
        for q in sorted(g.quotas, key=lambda q: q.gpu_model):
            have = cluster.gpus_by_model.get(q.gpu_model, 0)
            if q.gpu_model != ANY_MODEL and q.guaranteed > 0 and per_model[q.gpu_model] > have:
                mine.append(
                    f"guaranteed {q.gpu_model} GPUs of all groups add up to {per_model[q.gpu_model]}; "
                    f"the cluster has {have}"
                )
        if any(q.guaranteed > 0 for q in g.quotas) and total > cluster_gpus:
            mine.append(f"guaranteed GPUs of all groups add up to {total}; the cluster has {cluster_gpus}")
        if g.cpus_guaranteed > 0 and cpus > cluster.cpus:
            mine.append(f"guaranteed CPUs of all groups add up to {cpus:g}; the cluster has {cluster.cpus:g}")
        if g.memory_guaranteed_mib > 0 and memory > cluster.memory_mib:
            mine.append(
                f"guaranteed memory of all groups adds up to {memory} MiB; "
                f"the cluster has {cluster.memory_mib} MiB"
            )
        if mine:
            out[g.name] = mine
    return out
