"""Idle-GPU policy: jobs that hold GPUs they do not use.

A job's own `idle_gpu: {below_percent, for, grace, action}` in its spec wins; otherwise the admin
rule (`idle_gpu:` in monitor.yml) applies; otherwise nothing. When the mean utilization of a
running job's GPUs stays below `below_percent` for `for`, its owner is warned (a JobEvent of kind
"idle_gpu" and a CorralJobGpuIdle alert with the job and user as labels). If it is still idle
`grace` later, the action runs:
- `stop`: sets `Job.cancel_requested` (with an event), the documented cancel contract that the
  reconcile loop turns into an engine stop and CANCELLED;
- `requeue`: moves the job to PREEMPTED through `transition()`; the reconcile loop stops the
  attempt and puts the job back in the queue (its reason: "GPUs still idle ...: requeued; back in
  the queue");
- `warn`: nothing more.
Utilization recovering clears the watch and resolves the alert; so does the job leaving the watch
for any reason (it ended or was requeued, released its GPUs, or no policy applies any more).

Workspaces (corral.services.workspaces) use the same mechanism: their job carries an `idle_gpu`
policy built from the workspace's idle timeout (action `stop`). A workspace none of whose GPUs
any sampler covers (it holds none, or only a Slurm node's: corral.monitor.gpu.sampled_by_server)
is watched without readings: its utilization counts as 0 and only its own use counts. One
holding a GPU the server samples (virtual, or of the server's node) is judged by fresh readings as
a batch job is: none (NVML failed to start, the sampler stopped) is no evidence, never a stop.
Use is evidence beside GPU readings: `activity` gives each workspace job's last use, JupyterLab
kernel or terminal activity (corral.workspaces.activity) or an SSH/exec/port-forward session
(corral.services.session_use); use after the watch began restarts it, as a GPU busy again does.
A batch job without fresh readings is never acted on (no evidence either way). An idle stop of
a workspace records on the workspace, in the same transaction, when it was stopped
(`idle_stopped_at`, which `corral ws ls/show` read) and the GPU-hours it had held idle
(`corral_workspace_gpu_hours_reclaimed_total`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.db.models import Gpu, GpuClaim, Group, Job, User
from corral.monitor.config import IdleGpuRule
from corral.monitor.gpu import sampled_by_server
from corral.monitor.health import HealthPass, job_event
from corral.monitor.models import GpuReading, IdleGpuWatch
from corral.services import workspaces
from corral.services.lifecycle import InvalidTransition, JobState, request_cancel, transition
from corral.spec import JobSpecV1

log = logging.getLogger(__name__)
STALE_READING_S = 300.0  # readings older than this do not count as evidence of idleness
# A workspace judged by its use alone: said in its warning, so that nobody reads a 0.0% nobody measured
UNMEASURED = "no GPU utilization is measured for it"


def job_policy(spec: JobSpecV1 | None, admin_rule: IdleGpuRule | None) -> IdleGpuRule | None:
    """The job's own policy (missing keys from the admin rule), else the admin rule."""
    if spec is None or spec.idle_gpu is None:
        return admin_rule
    own = spec.idle_gpu.model_dump(by_alias=True, exclude_none=True)
    base = admin_rule.model_dump(by_alias=True) if admin_rule is not None else {}
    try:
        return IdleGpuRule.model_validate({**base, **own})
    except ValidationError as exc:
        log.warning("ignoring an invalid idle_gpu policy: %s", exc.errors()[0]["msg"])
        return admin_rule


def gpu_evidence(session: Session, now: float, local_node: str | None) -> tuple[dict[int, float], set[int]]:
    """From one read of the GPU claims with their GPUs and readings: each job's mean utilization
    (fresh readings of present GPUs), and the jobs holding a GPU a sampler covers. Covered: a
    virtual GPU, one of `local_node` (no reading there is a sampling fault, not no sampler), or
    one some server has read, stale or not (the GPU sampler and the idle check hold separate
    leases, so the sampling server may be on another node, and a stopped sampler's old readings
    still say one covers it). For those, no fresh reading is no evidence, never idleness."""
    values: dict[int, list[float]] = defaultdict(list)
    covered: set[int] = set()
    rows = session.execute(
        select(
            GpuClaim.job_id,
            GpuClaim.node,
            Gpu.uuid,
            GpuReading.utilization_percent,
            GpuReading.sampled_at,
            GpuReading.present,
        )
        .outerjoin(Gpu, (Gpu.node_name == GpuClaim.node) & (Gpu.index == GpuClaim.gpu_index))
        .outerjoin(
            GpuReading, (GpuReading.node == GpuClaim.node) & (GpuReading.gpu_index == GpuClaim.gpu_index)
        )
    )
    for job_id, node, uuid, util, sampled_at, present in rows:
        if sampled_at is not None:
            covered.add(job_id)
            if present and now - sampled_at <= STALE_READING_S:
                values[job_id].append(util)
        elif sampled_by_server(node, uuid or "", local_node or ""):
            covered.add(job_id)
    return {job_id: sum(v) / len(v) for job_id, v in values.items() if v}, covered


Activity = Callable[[Sequence[int]], Mapping[int, float]]


def enforce_idle_policy(
    session: Session,
    now: float,
    admin_rule: IdleGpuRule | None,
    channels: Sequence[str],
    activity: Activity | None = None,
    local_node: str | None = None,
) -> list[tuple[int, str]]:
    """One pass; returns (job_id, what happened) for warnings and actions taken. `activity`:
    {workspace job id: unix time of its last use (JupyterLab, SSH, exec)} for the ids it is
    given; `local_node`: the node whose real GPUs the server's sampler reads (Settings.node_name)."""
    utilization, sampled = gpu_evidence(session, now, local_node)
    watches = {w.job_id: w for w in session.scalars(select(IdleGpuWatch))}
    holders = select(GpuClaim.job_id).distinct()
    workspace_jobs = workspaces.workspace_job_ids(session)
    jobs = session.execute(
        select(Job, User.name, Group.name)
        .join(User, User.id == Job.user_id)
        .join(Group, Group.id == Job.group_id)
        .where(Job.state == JobState.RUNNING.value, Job.id.in_(holders) | Job.id.in_(list(workspace_jobs)))
    ).all()
    running_workspaces = [job.id for job, _, _ in jobs if job.id in workspace_jobs]
    last_active = activity(running_workspaces) if activity is not None and running_workspaces else {}
    check = HealthPass.start(session, now, channels)
    done: list[tuple[int, str]] = []
    watched = set()
    for job, user, group in jobs:
        policy = job_policy(job.spec, admin_rule)
        if policy is None:
            continue  # no policy (any more): its watch and alert are dropped below
        watched.add(job.id)
        util = utilization.get(job.id)
        measured = util is not None
        if util is None and job.id in workspace_jobs and job.id not in sampled:
            # a workspace holding no GPU any sampler covers (none, or a Slurm node's): use alone counts
            util = 0.0
        if util is None:
            continue  # no fresh readings (or a batch job unsampled): no evidence, the watch stays
        watch = watches.get(job.id)
        if watch is None:
            watch = watches[job.id] = IdleGpuWatch(job_id=job.id)
            session.add(watch)
        labels = {"alertname": "CorralJobGpuIdle", "severity": "warning", "job_id": str(job.id)}
        labels |= {"user": user, "group": group}
        active_at = last_active.get(job.id)
        if active_at is not None and watch.idle_since is not None and active_at > watch.idle_since:
            util = max(util, 100.0)  # used since the watch began: as good as a busy GPU
        if util >= policy.below_percent:
            watch.idle_since = watch.warned_at = watch.acted_at = None
            check.set(labels, False)
            continue
        outcome = _advance(session, check, job, watch, policy, util if measured else None, labels, now)
        if outcome:
            done.append((job.id, outcome))
    for job_id, watch in watches.items():
        if job_id not in watched:
            session.delete(watch)  # job ended, no longer holds GPUs, or lost its policy
    _resolve_unwatched(check, watched)
    session.commit()
    return done


def _resolve_unwatched(check: HealthPass, watched: set[int]) -> None:
    """Resolve the idle alerts of jobs no longer watched, whatever the reason (ended, requeued,
    GPUs released, policy removed): like any resolution, with `ends_at` and notifications."""
    still = {str(job_id) for job_id in watched}
    for alert in list(check.firing.values()):
        if alert.name == "CorralJobGpuIdle" and alert.labels.get("job_id") not in still:
            check.set(dict(alert.labels), False)


def _advance(
    session: Session,
    check: HealthPass,
    job: Job,
    watch: IdleGpuWatch,
    policy: IdleGpuRule,
    util: float | None,
    labels: dict[str, str],
    now: float,
) -> str | None:
    """`util` None: a workspace whose GPUs nothing samples (or that holds none), idle by its use
    alone; its words say so rather than a utilization of 0.0% that nobody measured."""
    if watch.idle_since is None:
        watch.idle_since = now
    idle_for = now - watch.idle_since
    if idle_for < policy.for_s:
        return None
    if watch.warned_at is None:
        watch.warned_at = now
        then = (
            "" if policy.action == "warn" else f"; it will be {_verb(policy.action)} in {policy.grace:.0f} s"
        )
        if util is None:
            message = f"unused for {idle_for:.0f} s (no JupyterLab, SSH or exec; {UNMEASURED}){then}"
            summary = f"job {job.id} unused for {idle_for:.0f} s ({UNMEASURED})"
        else:
            message = (
                f"GPUs idle: mean utilization {util:.1f}% < {policy.below_percent:g}% "
                f"for {idle_for:.0f} s{then}"
            )
            summary = f"job {job.id} holds GPUs it does not use ({util:.1f}%)"
        job_event(session, job.id, now, message, kind="idle_gpu")
        check.set(labels, True, summary)
        return "warned"
    if policy.action == "warn" or watch.acted_at is not None or now - watch.warned_at < policy.grace:
        return None
    watch.acted_at = now
    idle = "still unused" if util is None else f"GPUs still idle ({util:.1f}%)"
    message = f"{idle} {policy.grace:.0f} s after the warning: {_verb(policy.action)}"
    if policy.action == "stop":
        if not request_cancel(session, job, now=now, why=message, kind="idle_gpu"):
            return None  # it ended since it was read
        # a workspace's job (the workspace row says so, whatever the spec): its files stay and it
        # says it was stopped for being idle until `corral ws start` brings it back
        workspaces.record_idle_stop(session, job.id, job.spec.total_gpus * idle_for / 3600.0, now)
        return "stopped"
    try:
        moved = transition(session, job, JobState.PREEMPTED, now=now, message=message)
    except InvalidTransition as exc:
        log.info("cannot requeue idle job %s: %s", job.id, exc)
        return None
    return "requeued" if moved else None


def _verb(action: str) -> str:
    return {"stop": "stopped", "requeue": "requeued"}.get(action, "warned")
