"""Plain-dict views of rows, the JSON shapes the API returns (docs/architecture.md)."""

from __future__ import annotations

from typing import Any

from corral.db.models import Attempt, Group, Job, JobEvent, Node, User
from corral.scheduler.types import Priority


def attempt_view(attempt: Attempt) -> dict[str, Any]:
    placement = list(attempt.placement or [])
    nodes = list(dict.fromkeys(str(p.get("node")) for p in placement if p.get("node")))
    gpus = [
        {"node": p.get("node"), "index": idx, "rank": p.get("rank", i)}
        for i, p in enumerate(placement)
        for idx in p.get("gpu_indices") or []
    ]
    return {
        "number": attempt.number,
        "state": attempt.state,
        "nodes": nodes,
        "gpus": gpus,
        "placement": placement,
        "borrowed": attempt.borrowed,
        "created_at": attempt.created_at,
        "started_at": attempt.started_at,
        "ended_at": attempt.ended_at,
        "exit_code": attempt.exit_code,
        "reason": attempt.reason,
        "message": attempt.message,
    }


def event_view(event: JobEvent) -> dict[str, Any]:
    return {
        "at": event.at,
        "kind": event.kind,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "message": event.message,
    }


def job_view(
    job: Job,
    events: list[JobEvent] | None = None,
    *,
    group_name: str | None = None,
    user_name: str | None = None,
    lost_budget: int | None = None,
) -> dict[str, Any]:
    """`group_name`/`user_name`: given by a caller that already knows them (a just-submitted job
    is a transient object without its group and user loaded). `lost_budget`: the server's
    platform-loss requeue budget (Settings.lost_requeue_budget), shown next to the losses."""
    out: dict[str, Any] = {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "group": group_name if group_name is not None else job.group.name,
        "user": user_name if user_name is not None else job.user.name,
        "priority": Priority(job.priority).name.lower(),
        "preemptible": job.preemptible,
        "spec": job.spec,
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
        "diagnosis": job.diagnosis,
    }
    if events is not None:
        out["events"] = [event_view(e) for e in events]
    return out


def node_view(node: Node, claims: dict[tuple[str, int], int]) -> dict[str, Any]:
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
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memory_mib": g.memory_mib,
                "topology_group": g.topology_group,
                "healthy": g.healthy,
                "health": g.health,
                "job_id": claims.get((node.name, g.index)),
            }
            for g in node.gpus
        ],
    }


def group_view(group: Group, members: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": group.name,
        "weight": group.weight,
        "borrowing": group.borrowing,
        "user_max_gpus": group.user_max_gpus,
        "quotas": [
            {"gpu_model": q.gpu_model, "guaranteed": q.guaranteed, "max": q.max}
            for q in sorted(group.quotas, key=lambda q: q.gpu_model)
        ],
        "created_at": group.created_at,
    }
    if members is not None:
        out["members"] = [{"user": name, "role": role} for name, role in members]
    return out


def user_view(user: User, groups: list[tuple[str, str]], default_group: str | None) -> dict[str, Any]:
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
