"""Each GPU's holder and latest reading for a signed-in caller (`GET /api/v1/gpus`), cut to what
that caller may see: the portal's dashboard, job page and groups page draw from it.

The portal read these figures from `/metrics` before, which is anonymous only while no scrape
token is set; with one (always on the Slurm engine: docs/security.md) every page went without
utilization. This answer needs a login instead, and names less than the exposition: a job id only
for a job the caller may see (`services.jobs.visibility`'s rule: own jobs, a group admin's
groups' jobs, everything for an admin) and a group only to its members and admins (groups are
hidden from non-members); never a user. Utilization is given for every GPU, so the cluster's mean
is the same figure for everyone.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from typing_extensions import TypedDict  # the API's response model: pydantic takes only these on 3.11

from corral.db.models import Gpu, GpuClaim, Group, Job
from corral.db.workspace_models import Workspace
from corral.monitor.models import GpuReading
from corral.services.auth import Principal


class GpuUse(TypedDict):
    node: str
    gpu: int
    model: str
    allocated: bool
    job_id: int | None  # None: free, or held by a job the caller may not see
    group: str | None  # None: free, or held by a group the caller is not in
    present: bool | None  # None: never sampled
    utilization_percent: float | None  # None: never sampled, or the GPU fell off the bus
    memory_used_mib: float | None
    sampled_at: float | None


class GpuUsage(TypedDict):
    gpus: list[GpuUse]
    workspace_gpu_hours_reclaimed: float  # by idle stops, all groups (corral.monitor.idle)


def gpu_usage(session: Session, principal: Principal) -> GpuUsage:
    """One read of every GPU with its claim and reading, in node and index order."""
    rows = session.execute(
        select(
            Gpu.node_name,
            Gpu.index,
            Gpu.model,
            GpuClaim.job_id,
            Job.user_id,
            Job.group_id,
            Group.name,
            GpuReading.present,
            GpuReading.utilization_percent,
            GpuReading.memory_used_mib,
            GpuReading.sampled_at,
        )
        .outerjoin(GpuClaim, (GpuClaim.node == Gpu.node_name) & (GpuClaim.gpu_index == Gpu.index))
        .outerjoin(Job, Job.id == GpuClaim.job_id)
        .outerjoin(Group, Group.id == Job.group_id)
        .outerjoin(GpuReading, (GpuReading.node == Gpu.node_name) & (GpuReading.gpu_index == Gpu.index))
        .order_by(Gpu.node_name, Gpu.index)
    )
    gpus: list[GpuUse] = []
    for node, index, model, job_id, user_id, group_id, group, present, util, used, sampled_at in rows:
        held = job_id is not None
        sampled = sampled_at is not None
        gpus.append(
            {
                "node": node,
                "gpu": index,
                "model": model,
                "allocated": held,
                "job_id": job_id if held and principal.sees_job(user_id, group_id) else None,
                "group": group if held and (principal.is_admin or principal.is_member(group_id)) else None,
                "present": bool(present) if sampled else None,
                "utilization_percent": float(util) if sampled and present else None,
                "memory_used_mib": float(used) if sampled and present else None,
                "sampled_at": sampled_at,
            }
        )
    reclaimed = session.scalar(select(func.coalesce(func.sum(Workspace.reclaimed_gpu_hours), 0.0)))
    return {"gpus": gpus, "workspace_gpu_hours_reclaimed": float(reclaimed or 0.0)}
