"""The platform's own job history as a simulator trace: what `corral sim --from-cluster` replays.

`export_history(session, since=..., now=...)` reads the jobs submitted in [since, now) and returns
one JSON-ready mapping: `jobs` (rows of the simulator's generic trace format, docs/simulator.md,
plus what was observed live: every wait, the attempts), `cluster` (the CLUSTER.yaml mapping of the
current nodes as pools and the groups' quotas), the policy the server runs, and `notes` on what was
left out or approximated. Nothing here imports the simulator: the CLI feeds the rows to
`corral.sim.trace.trace_from_rows`, the same checks a CSV file gets.

Times are honest: `submit_time` is seconds after the first exported submission; `duration` is the
time the job actually ran, summed over its attempts (a job preempted and restarted from scratch ran
longer than its work: the replay then charges it all); `wait_s` counts every wait in the queue
(submit -> first start, and each gap between one attempt's end and the next one's start), like the
simulator's queueing figure. With `anonymise`, users, groups and job names become pseudonyms
(`user-1`, `group-1`, `name-1`, numbered in order of first appearance) that are stable within the
export and never contain the real names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from corral.db.models import Group, Job, Node, User
from corral.scheduler import Profile
from corral.scheduler.types import ANY_MODEL, Priority
from corral.services.errors import Invalid
from corral.services.lifecycle import JobState
from corral.services.quota import gpu_limits
from corral.words import plural

CPU_POOL_MODEL = "CPU"  # the gpu_model of a pool of GPU-less nodes (the simulator ignores it there)


@dataclass
class Pseudonyms:
    """Stable stand-ins for names within one export (identity when not anonymising)."""

    prefix: str
    enabled: bool
    given: dict[str, str] = field(default_factory=dict)

    def __call__(self, real: str) -> str:
        if not self.enabled:
            return real
        if real not in self.given:
            self.given[real] = f"{self.prefix}-{len(self.given) + 1}"
        return self.given[real]


@dataclass
class _Names:
    users: Pseudonyms
    groups: Pseudonyms
    jobs: Pseudonyms


@dataclass
class _Counts:
    censored: int = 0
    never_ran: int = 0
    no_duration: int = 0
    mixed_tasks: int = 0


def _waits_and_run(job: Job, now: float) -> tuple[float | None, float, float]:
    """(first wait, every wait, run time): the first start - submit; plus each gap between one
    attempt's end and the next attempt's start (and, for a job waiting now, until now); the run
    time summed over the attempts that started (one still running: until now)."""
    started = sorted((a for a in job.attempts if a.started_at is not None), key=lambda a: a.number)
    if not started:
        return None, max(0.0, now - job.submitted_at), 0.0
    first_wait = max(0.0, started[0].started_at - job.submitted_at)  # type: ignore[operator]
    wait, run, free_since = 0.0, 0.0, job.submitted_at
    for attempt in started:
        begin = attempt.started_at
        assert begin is not None
        wait += max(0.0, begin - free_since)
        end = attempt.ended_at if attempt.ended_at is not None else now
        run += max(0.0, end - begin)
        free_since = end
    if not JobState(job.state).terminal and not JobState(job.state).active:
        wait += max(0.0, now - free_since)  # queued (or preempted) again right now
    return first_wait, wait, run


def _shape(job: Job) -> tuple[int, int, str | None, float, int, bool]:
    """(GPUs in all, instances, GPU model, CPUs and MiB per instance, mixed). The trace has one
    instance shape: a job whose tasks ask for different GPUs per instance is given the largest
    (`mixed`, counted in the notes)."""
    view = job.spec.view
    per_instance = {t.resources.gpus for t in view.tasks}
    gpus = max(per_instance)
    instances = view.num_instances
    models = [t.resources.gpu_model for t in view.tasks if t.resources.gpus and t.resources.gpu_model]
    cpus = max(t.resources.cpus for t in view.tasks)
    memory = max(t.resources.memory_mib for t in view.tasks)
    return gpus * instances, instances, (models[0] if models else None), cpus, memory, len(per_instance) > 1


def _job_row(job: Job, user: str, group: str, now: float, names: _Names) -> dict[str, Any] | None:
    first_wait, wait, run = _waits_and_run(job, now)
    state = JobState(job.state)
    censored = not state.terminal
    duration = run
    if first_wait is None:  # never started
        if state.terminal:
            return None  # cancelled or refused while queued: it never held anything
        expected = job.runtime_estimate_s or job.spec.max_runtime_s  # waiting now: what we expect
        if expected is None:
            return {}  # a waiting job nobody can size: left out, counted
        duration = expected
    total, instances, model, cpus, memory, mixed = _shape(job)
    grace = job.spec.view.stop_grace_s if job.spec.stop_grace else None
    return {
        "job_id": f"job-{job.id}",
        "submit_time": job.submitted_at,  # made relative to the first submission by the caller
        "duration": round(duration, 3),
        "num_gpus": total,
        "group": names.groups(group),
        "user": names.users(user),
        "gpu_model": model or "",
        "instances": instances,
        "cpus": cpus,
        "memory_mib": memory,
        "priority": Priority(job.priority).name.lower(),
        "stop_grace_s": grace,
        "name": names.jobs(job.name),
        "max_runtime_s": job.spec.max_runtime_s,
        # observed live (not read by the replay): to compare the replay with what happened
        "state": state.value,
        "censored": censored,
        "first_wait_s": None if first_wait is None else round(first_wait, 3),
        "wait_s": round(wait, 3),
        "attempts": sum(1 for a in job.attempts if a.started_at is not None),
        "mixed_tasks": mixed,
    }


def _jobs(session: Session, since: float, now: float, unfinished: bool) -> Sequence[tuple[Job, str, str]]:
    stmt = (
        select(Job, User.name, Group.name)
        .join(User, User.id == Job.user_id)
        .join(Group, Group.id == Job.group_id)
        .where(Job.submitted_at >= since, Job.submitted_at < now)
        .options(selectinload(Job.attempts))
        .order_by(Job.submitted_at, Job.id)
    )
    if not unfinished:
        stmt = stmt.where(Job.state.in_([s.value for s in JobState if s.terminal]))
    return [(job, user, group) for job, user, group in session.execute(stmt).all()]


def _pools(nodes: Iterable[Node]) -> tuple[list[dict[str, Any]], list[str]]:
    """Nodes of one shape (GPU model and count, CPUs, memory) become one pool."""
    shapes: Counter[tuple[str, int, float, int]] = Counter()
    mixed, states = 0, Counter[str]()
    for node in nodes:
        models = Counter(g.model for g in node.gpus)
        if len(models) > 1:
            mixed += 1
        model = models.most_common(1)[0][0] if models else CPU_POOL_MODEL
        shapes[(model, len(node.gpus), node.cpus, node.memory_mib)] += 1
        if node.state != "ready" or node.admin_state != "none":
            states[f"{node.state}/{node.admin_state}"] += 1
    pools, used = [], Counter[str]()
    for (model, gpus, cpus, memory), count in sorted(shapes.items()):
        base = f"{model.lower()}x{gpus}" if gpus else "cpu"
        used[base] += 1
        name = base if used[base] == 1 else f"{base}-{used[base]}"
        pools.append(
            {"name": name, "count": count, "gpus_per_node": gpus, "gpu_model": model, "cpus": cpus}
            | {"memory_mib": memory}
        )
    notes = []
    if mixed:
        notes.append(f"{mixed} nodes with GPUs of several models are pooled under their most common model")
    if states:
        listed = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        notes.append(f"every registered node is in the cluster, also those not ready now ({listed})")
    return pools, notes


def _quota_value(quotas: dict[str, int]) -> int | dict[str, int]:
    return quotas[ANY_MODEL] if set(quotas) == {ANY_MODEL} else quotas


def _groups(groups: Iterable[Group], names: _Names) -> list[dict[str, Any]]:
    out = []
    for group in groups:
        guaranteed = {q.gpu_model: q.guaranteed for q in group.quotas}
        limits = gpu_limits(group.quotas)  # as the live scheduler reads them
        entry: dict[str, Any] = {
            "name": names.groups(group.name),
            "guaranteed": _quota_value(guaranteed) if guaranteed else 0,
            "weight": group.weight,
            "borrowing": group.borrowing,
        }
        if limits:
            entry["max"] = _quota_value(limits)
        if group.user_max_gpus is not None:
            entry["user_max_gpus"] = group.user_max_gpus
        out.append(entry)
    return out


def _notes(counts: _Counts, unfinished: bool) -> list[str]:
    notes = ["duration = the time each job actually ran, summed over its attempts"]
    if counts.never_ran:
        notes.append(
            f"{plural(counts.never_ran, 'job')} that ended without ever starting (cancelled, refused) "
            "left out"
        )
    if counts.censored:
        notes.append(
            f"{plural(counts.censored, 'job')} still running or waiting: running ones with their run "
            "time so far, waiting ones with their runtime estimate or limit (censored)"
        )
    if counts.no_duration:
        notes.append(
            f"{plural(counts.no_duration, 'waiting job')} without a runtime estimate or limit left out"
        )
    if counts.mixed_tasks:
        notes.append(
            f"{plural(counts.mixed_tasks, 'job')} whose tasks ask for different GPUs per instance: "
            "every instance given the largest"
        )
    if not unfinished:
        notes.append("only finished jobs (succeeded, failed, cancelled after starting)")
    return notes


def parse_since(value: str, now: float) -> float:
    """`since` as the API takes it (an age such as 30d, unix seconds or an ISO time): a 422 naming
    the parameter when it is not a time, out of range or in the future."""
    from corral.services.audit import parse_time

    since = parse_time(value, now, "since")  # refuses nan, inf and times outside 1970..5138 itself
    if since >= now:
        raise Invalid(f"since {value!r} is not in the past", ("query", "since"))
    return since


def export_history(
    session: Session,
    *,
    since: float,
    now: float,
    profile: Profile,
    anonymise: bool = False,
    unfinished: bool = False,
) -> dict[str, Any]:
    """The jobs submitted in [since, now) as trace rows, the cluster as a CLUSTER.yaml mapping,
    the profile the server schedules with (`policy`, and in `policy_knobs` what this server sets
    apart from the named profile: whether CPU-only jobs may use GPU nodes, as on the local engine)."""
    names = _Names(
        Pseudonyms("user", anonymise), Pseudonyms("group", anonymise), Pseudonyms("name", anonymise)
    )
    counts, rows = _Counts(), []
    for job, user, group in _jobs(session, since, now, unfinished):
        row = _job_row(job, user, group, now, names)
        if row is None:
            counts.never_ran += 1
        elif not row:
            counts.no_duration += 1
        else:
            rows.append(row)
            counts.censored += row["censored"]
            counts.mixed_tasks += row["mixed_tasks"]
    origin = rows[0]["submit_time"] if rows else since
    for row in rows:
        row["submit_time"] = round(row["submit_time"] - origin, 3)
    nodes = session.scalars(select(Node).options(selectinload(Node.gpus)).order_by(Node.name)).all()
    pools, node_notes = _pools(nodes)
    groups = session.scalars(select(Group).options(selectinload(Group.quotas)).order_by(Group.id)).all()
    cluster = {
        "name": "live",
        "pools": pools,
        "groups": _groups(groups, names),
        "default_group": {"guaranteed": 0},
    }
    return {
        "since": since,
        "until": now,
        "origin": origin,
        "policy": profile.name,
        "policy_knobs": {"cpu_jobs_on_gpu_nodes": profile.cpu_jobs_on_gpu_nodes},
        "anonymised": anonymise,
        "jobs": rows,
        "cluster": cluster,
        "notes": [*_notes(counts, unfinished), *node_notes],
        "counts": {
            "jobs": len(rows),
            "censored": counts.censored,
            "never_ran": counts.never_ran,
            "no_duration": counts.no_duration,
        },
    }
