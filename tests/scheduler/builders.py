"""Fixture builders for scheduler tests: small, explicit clusters, jobs and groups."""

from __future__ import annotations

import random

from corral.scheduler import (
    GPU,
    Allocation,
    Group,
    InstancePlacement,
    Job,
    Node,
    NodeState,
    Plan,
    Priority,
    Profile,
    Resources,
    RunningJob,
    Snapshot,
    TaskSpec,
    Usage,
    schedule,
)


def gpu_node(
    name: str,
    gpus: int = 8,
    model: str = "A100",
    cpus: float = 64,
    memory_mib: int = 512 * 1024,
    state: NodeState = NodeState.READY,
    topology: int | None = None,
    unhealthy: tuple[int, ...] = (),
) -> Node:
    """A GPU node; `topology=4` puts GPUs 0-3 in group 0, 4-7 in group 1."""
    return Node(
        name=name,
        cpus=cpus,
        memory_mib=memory_mib,
        gpus=tuple(
            GPU(
                index=i,
                uuid=f"{name}-gpu{i}",
                model=model,
                topology_group=None if topology is None else i // topology,
                healthy=i not in unhealthy,
            )
            for i in range(gpus)
        ),
        state=state,
    )


def cpu_node(
    name: str, cpus: float = 32, memory_mib: int = 128 * 1024, state: NodeState = NodeState.READY
) -> Node:
    return Node(name=name, cpus=cpus, memory_mib=memory_mib, state=state)


def job(
    job_id: str,
    gpus: int = 1,
    instances: int = 1,
    group: str = "g",
    user: str = "u",
    model: str | None = None,
    cpus: float = 1,
    memory_mib: int = 1024,
    priority: Priority = Priority.NORMAL,
    submit: float = 0.0,
    runtime: float | None = 100.0,
    preemptible: bool = True,
    attained: float = 0.0,
) -> Job:
    return Job(
        id=job_id,
        group=group,
        user=user,
        tasks=(
            TaskSpec(
                "main", instances, Resources(gpus=gpus, gpu_model=model, cpus=cpus, memory_mib=memory_mib)
            ),
        ),
        priority=priority,
        preemptible=preemptible,
        submit_time=submit,
        runtime_estimate=runtime,
        attained_gpu_seconds=attained,
    )


def group(
    name: str,
    guaranteed: dict[str, int] | None = None,
    max: dict[str, int] | None = None,
    user_max_gpus: int | None = None,
    weight: float = 1.0,
    borrowing: bool = True,
    cpus_max: float | None = None,
    memory_max_mib: int | None = None,
) -> Group:
    return Group(
        name=name,
        guaranteed=guaranteed or {},
        max=max,
        user_max_gpus=user_max_gpus,
        weight=weight,
        borrowing=borrowing,
        cpus_max=cpus_max,
        memory_max_mib=memory_max_mib,
    )


def running(
    j: Job, node: str, gpu_indices: tuple[int, ...], start: float = 0.0, borrowed: bool = False
) -> RunningJob:
    """A running single-instance job on `node` holding `gpu_indices`."""
    res = j.tasks[0].resources
    inst = InstancePlacement("main", 0, node, gpu_indices, res.cpus, res.memory_mib)
    return RunningJob(job=j, allocation=Allocation(j.id, (inst,)), start_time=start, borrowed=borrowed)


def snap(
    nodes: list[Node] | tuple[Node, ...],
    queued: list[Job] | tuple[Job, ...] = (),
    groups: list[Group] | tuple[Group, ...] = (),
    run: list[RunningJob] | tuple[RunningJob, ...] = (),
    usage: Usage | None = None,
) -> Snapshot:
    return Snapshot(
        nodes=tuple(nodes),
        groups=tuple(groups),
        queued=tuple(queued),
        running=tuple(run),
        usage=usage or Usage(),
    )


def plan_for(s: Snapshot, profile: Profile | None = None, now: float = 1000.0, seed: int = 0) -> Plan:
    return schedule(s, now, random.Random(seed), profile)


def apply_plan(s: Snapshot, plan: Plan, now: float) -> Snapshot:
    """The next snapshot: assigned jobs run, preempted jobs are gone (their grace is over)."""
    by_id = {j.id: j for j in s.queued}
    stopped = {p.job_id for p in plan.preemptions}
    still = [rj for rj in s.running if rj.job.id not in stopped]
    started = [RunningJob(by_id[a.job_id], a.allocation, now, a.borrowed) for a in plan.assignments]
    assigned = {a.job_id for a in plan.assignments}
    requeued = [rj.job for rj in s.running if rj.job.id in stopped]
    queued = [j for j in s.queued if j.id not in assigned] + requeued
    return Snapshot(s.nodes, s.groups, tuple(queued), tuple(still + started), s.usage)


def assigned_nodes(plan: Plan) -> dict[str, list[str]]:
    return {a.job_id: [p.node for p in a.allocation.instances] for a in plan.assignments}
