"""Nodes as the API shows them, operator actions on them, and the cluster summary.

Cordon/uncordon/drain set `Node.admin_state` (what the operator asked, kept across engine
reports) and `Node.state` (what the scheduler sees). The server's node sync (corral.server)
keeps admin_state over the engine's ready/down and mirrors it into the engine."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload
from typing_extensions import TypedDict  # the API's response model: pydantic takes only these on 3.11

from corral.db.models import Attempt, Gpu, GpuClaim, Job, Node, RemovedNode
from corral.scheduler import types as st
from corral.services import notify
from corral.services.auth import Principal
from corral.services.errors import Conflict, NotFound
from corral.services.lifecycle import AttemptState, GpuHealth, move_gpu, move_node

ADMIN_ACTIONS = {"cordon": "cordoned", "drain": "draining", "uncordon": "none"}
LIVE_NODE_STATES = ("ready", "cordoned", "draining")


def gpu_claims(session: Session) -> dict[tuple[str, int], int]:
    return {(c.node, c.gpu_index): c.job_id for c in session.scalars(select(GpuClaim))}


def visible_gpu_claims(session: Session, principal: Principal) -> dict[tuple[str, int], int | None]:
    """Every claimed GPU with its job's id where `principal` may see that job, else None (the GPU
    is still shown held): another user's job id is not named, as `GET /jobs/{id}` answers 404 for
    it (services.jobs.visibility's rule; GET /api/v1/gpus cuts the same way)."""
    rows = session.execute(
        select(GpuClaim.node, GpuClaim.gpu_index, GpuClaim.job_id, Job.user_id, Job.group_id).join(
            Job, Job.id == GpuClaim.job_id
        )
    )
    return {
        (node, index): job_id if principal.sees_job(user_id, group_id) else None
        for node, index, job_id, user_id, group_id in rows
    }


def list_nodes(session: Session) -> list[Node]:
    return list(session.scalars(select(Node).options(selectinload(Node.gpus)).order_by(Node.name)))


def set_admin_state(session: Session, name: str, action: str) -> Node:
    """Apply cordon | drain | uncordon. A down node stays down until its heartbeat returns."""
    node = session.scalar(select(Node).where(Node.name == name).options(selectinload(Node.gpus)))
    if node is None:
        raise NotFound(f"no node named {name!r}")
    admin_state = ADMIN_ACTIONS[action]
    node.admin_state = admin_state
    if node.state in LIVE_NODE_STATES:
        target = st.NodeState.READY if admin_state == "none" else st.NodeState(admin_state)
        # A lost race means the node loop just marked it down or unknown: that state stands, and
        # admin_state (written below) applies when the node reports ready again.
        move_node(session, node, target)
    notify.changed(session, notify.Topic.NODES)
    session.flush()
    return node


def ready_node_outside(session: Session, nodes: Collection[str]) -> bool:
    """Whether a ready node is left outside `nodes`: where work told to avoid them can still run
    (a retry avoiding every node would wait forever, neither run nor failed)."""
    other = select(Node.name).where(Node.state == "ready", Node.name.not_in(list(nodes))).limit(1)
    return session.scalar(other) is not None


def attempt_gpus(attempt: Attempt) -> int:
    return sum(len(p.gpu_indices) for p in attempt.placement or ())


def release_claims(session: Session, attempts: Sequence[Attempt]) -> None:
    """Free the GPUs the attempts hold, in the caller's transaction (as each ends: server.finish,
    or a drain's requeue, services.remediation). ORM deletes, written at commit with the rest of
    the batch (one executemany, not one each). The claims are exactly the placement's GPUs
    (scheduling.write_batch): an attempt placed without GPUs has none, and skips the query."""
    with_gpus = [attempt.id for attempt in attempts if attempt_gpus(attempt) > 0]
    if with_gpus:
        for claim in session.scalars(select(GpuClaim).where(GpuClaim.attempt_pk.in_(with_gpus))):
            session.delete(claim)


def live_on(session: Session, nodes: Collection[str]) -> list[tuple[Job, Attempt]]:
    """The jobs with a scheduled, starting or running attempt placed (in part, GPU or not) on one
    of `nodes`, with that attempt, by job id: what a node's removal waits for, a drain requeues or
    preempts (services.remediation) and a lost node loses (server.nodes.fail_jobs_on)."""
    live = [s.value for s in AttemptState if not s.finished]
    rows = session.execute(
        select(Job, Attempt)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(Attempt.state.in_(live))
        .order_by(Job.id)
    ).all()
    wanted = set(nodes)
    return [(job, attempt) for job, attempt in rows if any(p.node in wanted for p in attempt.placement or ())]


def remove_node(session: Session, name: str, by: str = "", now: float | None = None) -> Node:
    """Delete a decommissioned node and its GPUs (not committed; returns the deleted row). Like
    Slurm's `scontrol delete nodename=`: only a node out of service (cordoned, draining or down)
    with nothing on it (no GPU claimed, no scheduled, starting or running attempt placed there);
    Conflict naming what stands in the way otherwise. History keeps the name: attempts, events
    and incidents record nodes by name, not by reference. The name is kept (`RemovedNode`): a
    node the engine still reports comes back at its next report cordoned, not ready for work,
    until an admin uncordons it; so it is removed from the engine first (docs/architecture.md)."""
    node = session.get(Node, name)
    if node is None:
        raise NotFound(f"no node named {name!r}")
    if node.state != "down" and node.admin_state not in ("cordoned", "draining"):
        raise Conflict(
            f"node {name!r} is {node.state}: only a cordoned, drained or down node can be removed "
            f"(cordon or drain it first)"
        )
    jobs = {job.id for job, _ in live_on(session, (name,))}
    jobs |= set(session.scalars(select(GpuClaim.job_id).where(GpuClaim.node == name)))
    if jobs:
        listed = ("job " if len(jobs) == 1 else "jobs ") + ", ".join(str(j) for j in sorted(jobs))
        raise Conflict(
            f"node {name!r} still has {listed} placed on it: wait for them to end (drain "
            f"preempts nothing by itself) or cancel them, then remove the node"
        )
    session.delete(node)
    session.merge(RemovedNode(name=name, removed_at=time.time() if now is None else now, removed_by=by))
    notify.changed(session, notify.Topic.NODES)
    session.flush()
    return node


class GpuCounts(TypedDict):
    total: int
    allocated: int
    free: int
    unavailable: int


class GpuSummary(TypedDict):
    total: int
    allocated: int
    free: int
    by_model: dict[str, GpuCounts]


class ClusterSummary(TypedDict):
    """`GET /api/v1/cluster`: GPUs by state and model, nodes and jobs by state."""

    gpus: GpuSummary
    nodes: dict[str, int]
    jobs: dict[str, int]


def gpu_or_not_found(session: Session, name: str, index: int) -> Gpu:
    """GPU `index` of node `name`, or NotFound naming what is missing: the node, or the GPU with
    the indexes the node has."""
    gpu = session.get(Gpu, (name, index))
    if gpu is None:
        if session.get(Node, name) is None:
            raise NotFound(f"no node named {name!r}")
        indexes = session.scalars(select(Gpu.index).where(Gpu.node_name == name).order_by(Gpu.index)).all()
        has = "GPUs " + ", ".join(map(str, indexes)) if indexes else "no GPUs"
        raise NotFound(f"node {name!r} has no GPU {index} (it has {has})")
    return gpu


def set_gpu_health(session: Session, name: str, index: int, action: str) -> tuple[Gpu, str]:
    """An operator's verdict on one GPU: `quarantine` keeps it out of placement (the node's other
    GPUs stay in use); `return` puts a quarantined or lost GPU back in service once examined (the
    diagnosis watch quarantines on ECC/Xid faults and never returns one by itself). Returns the
    GPU and its health before. Not committed: the caller records it with the change."""
    gpu = gpu_or_not_found(session, name, index)
    before = gpu.health
    target = GpuHealth.QUARANTINED if action == "quarantine" else GpuHealth.HEALTHY
    if before != target.value and not move_gpu(session, gpu, target):
        raise Conflict(f"GPU {index} of {name} is {before}; it cannot be moved to {target.value}")
    notify.changed(session, notify.Topic.NODES)
    return gpu, before


def cluster_summary(session: Session) -> ClusterSummary:
    nodes = list_nodes(session)
    claims = gpu_claims(session)
    by_model: dict[str, GpuCounts] = {}
    for node in nodes:
        usable = node.state == "ready"
        for gpu in node.gpus:
            entry = by_model.setdefault(gpu.model, {"total": 0, "allocated": 0, "free": 0, "unavailable": 0})
            entry["total"] += 1
            if (node.name, gpu.index) in claims:
                entry["allocated"] += 1
            elif usable and gpu.healthy and gpu.health == GpuHealth.HEALTHY.value:
                entry["free"] += 1
            else:
                entry["unavailable"] += 1
    rows = session.execute(select(Job.state, func.count(Job.id)).group_by(Job.state))
    jobs = {str(state): int(count) for state, count in rows}
    return {
        "gpus": {
            "total": sum(m["total"] for m in by_model.values()),
            "allocated": sum(m["allocated"] for m in by_model.values()),
            "free": sum(m["free"] for m in by_model.values()),
            "by_model": by_model,
        },
        "nodes": dict(Counter(n.state for n in nodes)),
        "jobs": jobs,
    }


def scheduler_node(row: Node) -> st.Node:
    """A node row (with its GPUs loaded) as the scheduler sees it; an unknown state string from an
    older row reads as UNKNOWN, which the scheduler never places on."""
    return st.Node(
        name=row.name,
        cpus=row.cpus,
        memory_mib=row.memory_mib,
        gpus=tuple(
            st.GPU(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_mib=g.memory_mib,
                topology_group=g.topology_group,
                healthy=g.healthy,
            )
            for g in row.gpus
        ),
        labels=dict(row.labels or {}),
        state=st.NodeState(row.state)
        if row.state in st.NodeState._value2member_map_
        else st.NodeState.UNKNOWN,
    )
