"""JSON views of rows: the shapes the API returns (docs/architecture.md), typed so that a field
renamed here and not in corral.api.schemas fails the type check. Typed values from the rows
(spec, placement, diagnosis) are turned back into their JSON here, at the API edge."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from sqlalchemy import select
from sqlalchemy.orm import object_session

from corral.db.diag_models import AttemptDiagnosis, HangWatch, NodeFlag
from corral.db.models import Attempt, Group, Job, JobEvent, Node, User
from corral.domain import (
    ON_HOLD_CODE,
    InstancePlacementJSON,
    JobDiagnosis,
    JobDiagnosisJSON,
    PendingReason,
    diagnosis_to_json,
    placement_nodes,
    placement_to_json,
)
from corral.scheduler.types import Priority
from corral.services.lifecycle import JobState


class AttemptGpuView(TypedDict):
    node: str
    index: int
    rank: int


class AttemptView(TypedDict):
    number: int
    state: str
    nodes: list[str]
    gpus: list[AttemptGpuView]
    placement: list[InstancePlacementJSON]
    borrowed: bool
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    reason: str | None
    message: str
    failure: NotRequired[FailureView | None]  # GET /jobs/{id}: the exit-spec's verdict


class FailureView(TypedDict):
    """Why an attempt failed, by the exit-spec (corral.diagnosis)."""

    reason: str
    category: str  # user | platform | hardware | transient | preempted
    message: str
    fix: str
    evidence: str
    node: str


class WatchView(TypedDict):
    """The hang and straggler watch of the job's running attempt (corral.diagnosis.watch)."""

    attempt: int
    suspected_hang: str  # "" or who is suspected and why
    suspected_at: float | None
    stragglers: str
    action: str  # what the on_hang policy did: notify | kill | requeue, or ""


class EventView(TypedDict):
    id: int  # the cursor of a page back: GET /jobs/{id}/events?before=ID
    at: float
    kind: str
    from_state: str | None
    to_state: str | None
    message: str


class JobView(TypedDict):
    id: int
    name: str
    state: str
    group: str
    user: str
    priority: str
    preemptible: bool
    spec: Mapping[str, object]  # shared with the spec's other rows: read-only
    environment_version: str | None  # the catalogue environment it runs in, pinned: "name@3"
    labels: Mapping[str, str]  # the spec's labels (shared with the spec: read-only)
    created_at: float
    updated_at: float
    finished_at: float | None
    retries: int
    attempt_count: int
    cancel_requested: bool
    reason: str
    own_failures: int
    platform_losses: int
    lost_requeue_budget: int | None
    preemptions: int
    attempts: list[AttemptView]
    diagnosis: JobDiagnosisJSON | None
    runtime_estimate: RuntimeEstimateView | None
    hold: HoldView | None
    events: NotRequired[list[EventView]]
    earlier_events: NotRequired[int]  # the job's events before the first in `events`, not in it
    watch: NotRequired[WatchView | None]


class HoldView(TypedDict):
    """A queued job's hold (`corral hold`): who held it back, when, and whether as an admin."""

    by: str
    at: float
    admin: bool  # an admin's hold: only an admin releases it


def is_held(job: Job) -> bool:
    """Held back from the scheduler: a hold stands on a job only while it is queued."""
    return job.held_by is not None and job.state == JobState.QUEUED.value


def holder_name(job: Job, user_name: str | None = None) -> str:
    """Who holds `job` (`user_name`: its owner's, known to a caller whose job is transient)."""
    if job.held_by == job.user_id:
        return user_name if user_name is not None else job.user.name
    holder = job.holder
    return holder.name if holder is not None else f"user #{job.held_by}"


def hold_event_text(principal_name: str, as_admin: bool) -> str:
    """A hold's job event: "held by bob", "held by root (an admin hold)"."""
    return f"held by {principal_name}" + (" (an admin hold)" if as_admin else "")


def utc_text(at: float) -> str:
    """A time as people read it in messages: "2026-11-30 00:20:05 UTC" (`corral usage --since
    2026-12-01` was once told '(1796083200)')."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def hold_text(job: Job, user_name: str | None = None) -> str:
    """ "held by alice since 2026-11-30 00:20:05 UTC: corral release 7": what `corral show`, `why`
    and `logs` print as a held job's "why pending"."""
    return (
        f"held by {holder_name(job, user_name)} since {utc_text(job.held_at or 0.0)}: corral release {job.id}"
    )


def effective_diagnosis(job: Job, user_name: str | None = None) -> JobDiagnosis | None:
    """Why a job waits: its hold while it is held (no queue position, no estimated start: it is
    in no queue the scheduler reads), else the schedule loop's last diagnosis."""
    if not is_held(job):
        return job.diagnosis
    reason = PendingReason(ON_HOLD_CODE, "hold", hold_text(job, user_name))
    return JobDiagnosis(reasons=(reason,), queue_position=None, estimated_start=None)


def hold_view(job: Job, user_name: str | None = None) -> HoldView | None:
    if not is_held(job) or job.held_at is None:
        return None
    return {"by": holder_name(job, user_name), "at": job.held_at, "admin": bool(job.held_as_admin)}


class RuntimeEstimateView(TypedDict):
    """The runtime the scheduler assumes for the job (corral.scheduler.runtimes)."""

    seconds: float
    low_s: float | None  # 25th percentile of the runs it came from (None: no spread known)
    high_s: float | None  # 75th percentile
    basis: str | None  # name | user_size | group | cluster | limit (None: before it was recorded)


def runtime_estimate_view(job: Job) -> RuntimeEstimateView | None:
    if job.runtime_estimate_s is None:
        return None
    return {
        "seconds": job.runtime_estimate_s,
        "low_s": job.runtime_estimate_low_s,
        "high_s": job.runtime_estimate_high_s,
        "basis": job.runtime_estimate_basis,
    }


class GpuView(TypedDict):
    index: int
    uuid: str
    model: str
    memory_mib: int
    topology_group: int | None
    healthy: bool
    health: str  # healthy | quarantined | lost (services/lifecycle.py GpuHealth)
    allocated: bool  # a job holds it
    job_id: int | None  # that job, where the caller may see it


class NodeView(TypedDict):
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
    gpus: list[GpuView]
    flags: list[str]  # diagnosis: e.g. "failing_jobs: failed jobs of 3 users ... within 1 h"


class QuotaView(TypedDict):
    gpu_model: str
    guaranteed: int
    max: int | None


class MemberView(TypedDict):
    user: str
    role: str


class GroupView(TypedDict):
    name: str
    weight: float
    borrowing: bool
    user_max_gpus: int | None
    quotas: list[QuotaView]
    cpus_guaranteed: float | None
    cpus_max: float | None
    memory_guaranteed_mib: int | None
    memory_max_mib: int | None
    created_at: float
    usage: dict[str, object] | None  # corral.services.quota.usage_view
    warnings: list[str]
    members: NotRequired[list[MemberView]]


class GroupRoleView(TypedDict):
    name: str
    role: str


class UserView(TypedDict):
    name: str
    role: str
    is_admin: bool
    active: bool
    groups: list[GroupRoleView]
    default_group: str | None
    created_at: float


def attempt_view(attempt: Attempt) -> AttemptView:
    placement = attempt.placement or ()
    return {
        "number": attempt.number,
        "state": attempt.state,
        "nodes": placement_nodes(placement),
        "gpus": [{"node": p.node, "index": idx, "rank": p.rank} for p in placement for idx in p.gpu_indices],
        "placement": placement_to_json(placement),
        "borrowed": attempt.borrowed,
        "created_at": attempt.created_at,
        "started_at": attempt.started_at,
        "ended_at": attempt.ended_at,
        "exit_code": attempt.exit_code,
        "reason": attempt.reason,
        "message": attempt.message,
    }


@dataclass(frozen=True)
class JobHistory:
    """Part of a job's events (services.jobs.job_events): `events` oldest first, and how many of
    the job's events come before the first of them (`earlier`), which are not in it."""

    events: list[JobEvent]
    earlier: int


def event_view(event: JobEvent) -> EventView:
    return {
        "id": event.id,
        "at": event.at,
        "kind": event.kind,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "message": event.message,
    }


def job_view(
    job: Job,
    history: JobHistory | None = None,
    *,
    group_name: str | None = None,
    user_name: str | None = None,
    lost_budget: int | None = None,
) -> JobView:
    """`group_name`/`user_name`: given by a caller that already knows them (a just-submitted job
    is a transient object without its group and user loaded). `lost_budget`: the server's
    platform-loss requeue budget (Settings.lost_requeue_budget), shown next to the losses."""
    diagnosis = effective_diagnosis(job, user_name)
    out: JobView = {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "group": group_name if group_name is not None else job.group.name,
        "user": user_name if user_name is not None else job.user.name,
        "priority": Priority(job.priority).name.lower(),
        "preemptible": job.preemptible,
        "spec": job.spec.stored(),
        "environment_version": job.spec.environment_version,
        "labels": job.spec.labels,
        "created_at": job.submitted_at,
        "updated_at": job.updated_at,
        "finished_at": job.finished_at,
        "retries": job.max_retries,
        "attempt_count": job.attempt_count,
        "cancel_requested": job.cancel_requested,
        "reason": job.reason,
        # What the retry rules counted (services/lifecycle.py): own failures against `retries`,
        # platform losses against the lost-requeue budget, preemptions (free).
        "own_failures": job.own_failures or 0,
        "platform_losses": job.platform_losses or 0,
        "lost_requeue_budget": lost_budget,
        "preemptions": job.preemptions or 0,
        "attempts": [attempt_view(a) for a in job.attempts],
        "diagnosis": None if diagnosis is None else diagnosis_to_json(diagnosis),
        "runtime_estimate": runtime_estimate_view(job),
        "hold": hold_view(job, user_name),
    }
    if history is not None:
        out["events"] = [event_view(e) for e in history.events]
        out["earlier_events"] = history.earlier
        _add_diagnosis(job, out)
    return out


def _node_flags(node: Node) -> list[str]:
    session = object_session(node)
    if session is None:
        return []
    flags: dict[str, list[str]] | None = session.info.get("active_node_flags")
    if flags is None:  # one query per session, not one per node listed
        flags = {}
        for f in session.scalars(select(NodeFlag).where(NodeFlag.active.is_(True))):
            flags.setdefault(f.node, []).append(f"{f.flag}: {f.detail}")
        session.info["active_node_flags"] = flags
    return flags.get(node.name, [])


def _add_diagnosis(job: Job, out: JobView) -> None:
    """The detail view's failure verdicts and hang watch: two small queries for one job."""
    session = object_session(job)
    if session is None:
        return
    by_pk = {a.id: a.number for a in job.attempts}
    rows = session.scalars(select(AttemptDiagnosis).where(AttemptDiagnosis.job_id == job.id)).all()
    verdicts = {by_pk.get(d.attempt_pk): d for d in rows}
    for view in out["attempts"]:
        d = verdicts.get(view["number"])
        view["failure"] = (
            None
            if d is None
            else {"reason": d.reason, "category": d.category, "message": d.message, "fix": d.fix,
                  "evidence": d.evidence, "node": d.node}
        )  # fmt: skip
    watch = session.scalars(select(HangWatch).where(HangWatch.job_id == job.id)).all()
    live = max(watch, key=lambda w: by_pk.get(w.attempt_pk, 0), default=None)
    out["watch"] = (
        None
        if live is None
        else {"attempt": by_pk.get(live.attempt_pk, 0), "suspected_hang": live.suspect,
              "suspected_at": live.suspected_at, "stragglers": live.stragglers, "action": live.acted}
    )  # fmt: skip


def node_view(node: Node, claims: Mapping[tuple[str, int], int | None]) -> NodeView:
    """`claims`: each held GPU's job id, or None where the caller may not see the job."""
    return {
        "name": node.name,
        "state": node.state,
        "admin_state": node.admin_state,
        "cpus": node.cpus,
        "memory_mib": node.memory_mib,
        "address": node.address,
        "labels": node.labels,
        "engine": node.engine,
        "last_heartbeat": node.last_heartbeat,
        "message": node.message,
        "flags": _node_flags(node),
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memory_mib": g.memory_mib,
                "topology_group": g.topology_group,
                "healthy": g.healthy,
                "health": g.health,
                "allocated": (node.name, g.index) in claims,
                "job_id": claims.get((node.name, g.index)),
            }
            for g in node.gpus
        ],
    }


def group_view(
    group: Group,
    members: list[tuple[str, str]] | None = None,
    *,
    usage: dict[str, object] | None = None,
    warnings: list[str] | None = None,
) -> GroupView:
    """`usage`: `corral.services.quota.usage_view`; `warnings`: overcommitted guarantees and a `*`
    max that does not cap the models with a quota of their own."""
    out: GroupView = {
        "name": group.name,
        "weight": group.weight,
        "borrowing": group.borrowing,
        "user_max_gpus": group.user_max_gpus,
        "quotas": [
            {"gpu_model": q.gpu_model, "guaranteed": q.guaranteed, "max": q.max}
            for q in sorted(group.quotas, key=lambda q: q.gpu_model)
        ],
        "cpus_guaranteed": group.cpus_guaranteed,
        "cpus_max": group.cpus_max,
        "memory_guaranteed_mib": group.memory_guaranteed_mib,
        "memory_max_mib": group.memory_max_mib,
        "created_at": group.created_at,
        "usage": usage,
        "warnings": warnings or [],
    }
    if members is not None:
        out["members"] = [{"user": name, "role": role} for name, role in members]
    return out


def user_view(user: User, groups: list[tuple[str, str]], default_group: str | None) -> UserView:
    return {
        "name": user.name,
        "role": "admin"
        if user.is_admin
        else ("group_admin" if any(r == "admin" for _, r in groups) else "member"),
        "is_admin": user.is_admin,
        "active": user.active,
        "groups": [{"name": name, "role": role} for name, role in groups],
        "default_group": default_group,
        "created_at": user.created_at,
    }
