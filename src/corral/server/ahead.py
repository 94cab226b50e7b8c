"""Jobs handed to the engine ahead of a freed slot, on engines that keep their own queue (Slurm).

Corral places a job only on resources it sees free, and it sees a job's slot free only once the
engine has told it that the job ended, after which it still has to schedule, dispatch and submit
the next job. An engine with its own queue (`engine.queue_ahead_depth` > 0: Slurm holds a job pinned to its
node until the resources there are free, and starts it the moment the previous one ends) can be
given the next jobs while the current ones still run. This module is that second placement pass.

After the schedule loop's normal cycle, when jobs are still waiting, the same scheduler policy
(a Scheduler object of its own, so the two passes' caches never mix) runs once more on a snapshot
in which the RUNNING jobs that leave their slots are left out of their nodes' occupancy and each
node's turnover part counts `depth` times. Jobs holding GPUs (running, pending or placed ahead)
and jobs being stopped keep their slots: nothing is placed behind them. A node's turnover part is
its CPUs and memory less what those jobs hold; its scaled capacity is held + depth x (capacity -
held). Everything but the left-out running jobs (SCHEDULED and STARTING jobs, i.e. also those
placed ahead before, GPU jobs, jobs being stopped) still counts. So a node holds its running jobs
plus at most `depth` turnover parts of jobs waiting behind them (depth 1: one successor per slot;
more keeps the engine's queue from running dry while Corral's own path from a started job to the
next submission, a few tenths of a second, is longer than a short job). A job placed ahead is an
ordinary SCHEDULED -> STARTING job in Corral (its attempt pending in the engine) and RUNNING once
the engine starts it. The pass also runs when no job runs: jobs without GPUs the engine holds
pending fill their nodes in the normal pass's view just as running ones do. Slurm (22.05) starts
batch jobs only at its scheduler's ticks (about once a second) and when a job's end frees
resources, so a cluster of short jobs is often all pending or all ended between ticks; a pass
that waited for a running job then placed nothing until Corral saw the next tick's jobs run
(docs/slurm.md, fourth round). It does not run where it could place nothing: no job left out of
occupancy and none pending to wait behind (or depth 1, which then adds nothing), e.g. a GPU
cluster with a backlog, where it was an idle second scheduling pass on every tick. A job whose
assignment would not fit its nodes' turnover part (the scaled node could take a bigger job, and
one bigger than the turnover part would wait behind a job keeping its slot) is left waiting, and
the pass planned again without it.

What stays honest:
* Which job goes next is the scheduler's choice (priority, fair share, quotas), as in the normal
  pass; only its assignments are applied here: no preemption, no diagnoses written. Where the
  profile packs (bestfit), this pass spreads instead (ahead_profile): waiting jobs go to the node
  with the shortest queue in the engine.
* Group CPU and memory limits: the running jobs left out of occupancy still count against them
  (the limits of the ahead snapshot are lowered by what those jobs hold), so running + waiting
  never exceeds a group's limit.
* GPUs: jobs holding GPUs keep them (their GpuClaim rows are per index, and the engine picks its
  own GPU indices), so no GPU is ever promised twice; no job is queued behind them, nor on the
  CPUs and memory they hold: a GPU job may run for days while another node frees first.
* Cancel and stop work as for any STARTING job (the engine cancels a pending job at once); a
  successor's runtime and fair-share charge start when the engine starts it (its started_at).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import replace

from sqlalchemy.orm import Session

from corral.scheduler import Profile
from corral.scheduler import types as st
from corral.server.context import ServerContext
from corral.server.snapshot import ClusterState, GroupRecord, JobRecord, build_snapshot, read_cluster_state
from corral.services.lifecycle import JobState
from corral.services.policy import active_profile

log = logging.getLogger("corral.server.ahead")


def queue_depth(ctx: ServerContext) -> int:
    """How many node-fulls of jobs the engine's own queue may hold behind its running jobs (0:
    the engine has no queue Corral may hand jobs to ahead of a free slot)."""
    return ctx.engine.queue_ahead_depth


def queues_ahead(ctx: ServerContext) -> bool:
    return queue_depth(ctx) > 0


def keeps_slot(record: JobRecord) -> bool:
    """A live job no job is placed behind: one holding GPUs (it may run for days; its GpuClaim
    rows are per index), in whatever state (a GPU job the engine holds pending becomes a running
    one), or one being stopped."""
    return record.stops_by is not None or any(p.gpu_indices for p in record.placement)


def leaves_slot(record: JobRecord) -> bool:
    """A running job whose CPUs and memory one successor may be placed on: running (not starting)
    and not keeping its slot."""
    return record.state == JobState.RUNNING.value and not keeps_slot(record)


def turnover_part(state: ClusterState) -> dict[str, st.Node]:
    """Each node less the CPUs and memory of the jobs keeping their slots there: the part whose
    jobs end and are followed, all a job placed ahead may wait for. A job bigger than it would
    wait behind a job that keeps its slot."""
    held_cpus: dict[str, float] = {}
    held_memory: dict[str, int] = {}
    for record in state.running:
        if keeps_slot(record):
            for p in record.placement:
                held_cpus[p.node] = held_cpus.get(p.node, 0.0) + p.cpus
                held_memory[p.node] = held_memory.get(p.node, 0) + p.memory_mib
    return {
        n.name: replace(
            n,
            cpus=max(0.0, n.cpus - held_cpus.get(n.name, 0.0)),
            memory_mib=max(0, n.memory_mib - held_memory.get(n.name, 0)),
        )
        for n in state.nodes
    }


def _lowered_limits(group: GroupRecord, cpus: float, memory_mib: int) -> GroupRecord:
    """The group's CPU and memory limits less what its running jobs left out of occupancy hold."""
    cpus_max = None if group.cpus_max is None else max(0.0, group.cpus_max - cpus)
    memory_max = None if group.memory_max_mib is None else max(0, group.memory_max_mib - memory_mib)
    return replace(group, cpus_max=cpus_max, memory_max_mib=memory_max)


def ahead_state(state: ClusterState, depth: int) -> ClusterState | None:
    """The cluster as the ahead pass sees it, or None when the pass can place nothing: no job
    waits, or no job is there to wait behind. Running jobs are not the only ones: jobs the engine
    holds pending (STARTING, their nodes' slots taken in the normal pass's view until they end)
    are as much a queue to wait behind. Without them, a cluster of short jobs in step with the
    engine's scheduler (see the module's doc) placed nothing between the moments it saw them run.
    Jobs keeping their slots (GPU jobs, jobs being stopped) are not: only the rest of each node,
    its turnover part, counts `depth` times."""
    if not state.queued:
        return None
    behind = [r for r in state.running if not keeps_slot(r)]
    leaving = [r for r in behind if r.state == JobState.RUNNING.value]
    if not leaving and (depth < 2 or not behind):
        # Nothing is left out of occupancy and no node grows by more than what keeps its slot:
        # the normal pass saw the same free room and placed what fitted it. On a full GPU
        # cluster with a backlog that was a second, idle scheduling pass on every tick.
        return None
    held: dict[str, tuple[float, int]] = {}
    for record in leaving:
        cpus, memory = held.get(record.group, (0.0, 0))
        for p in record.placement:
            cpus, memory = cpus + p.cpus, memory + p.memory_mib
        held[record.group] = (cpus, memory)
    groups = tuple(_lowered_limits(g, *held[g.name]) if g.name in held else g for g in state.groups)
    left = {r.id for r in leaving}
    turnover = turnover_part(state)
    nodes = tuple(
        replace(
            n,  # what keeps its slot counts once, the turnover part `depth` times
            cpus=n.cpus + (depth - 1) * turnover[n.name].cpus,
            memory_mib=n.memory_mib + (depth - 1) * turnover[n.name].memory_mib,
        )
        for n in state.nodes
    )
    running = tuple(r for r in state.running if r.id not in left)
    return replace(state, nodes=nodes, groups=groups, running=running)


def ahead_profile(profile: Profile) -> Profile:
    """The ahead pass spreads where the profile packs (bestfit): a job waiting in the engine's
    queue starts when a slot of *its* node frees, so the waiting jobs go where that queue is
    shortest. Packed, a node's whole depth filled before the next node got any (bestfit prefers
    the fullest node that fits), and Slurm started them one slot at a time on that node while the
    slots of the others freed with nothing waiting for them."""
    return profile.with_placement("spread") if profile.placement == "bestfit" else profile


def fits_nodes(assignment: st.Assignment, nodes: Mapping[str, st.Node]) -> bool:
    """Does what the assignment puts on each node fit that node's CPUs and memory in `nodes`?"""
    cpus: dict[str, float] = {}
    memory: dict[str, int] = {}
    for p in assignment.allocation.instances:
        cpus[p.node] = cpus.get(p.node, 0.0) + p.cpus
        memory[p.node] = memory.get(p.node, 0) + p.memory_mib
    return all(
        name in nodes and cpus[name] <= nodes[name].cpus and memory[name] <= nodes[name].memory_mib
        for name in cpus
    )


def place_ahead(ctx: ServerContext, session: Session, now: float, read: ClusterState | None = None) -> int:
    """Place waiting jobs behind running ones (see the module's doc); how many were placed.
    `read`: the cluster as the normal pass read it, when that pass changed nothing (on a full
    cluster, most ticks); otherwise it is read again."""
    from corral.server.scheduling import place_assignments, scheduler_for  # it calls this module

    real = read
    if real is None:
        real = read_cluster_state(session)
        session.rollback()
    state = ahead_state(real, queue_depth(ctx))
    if state is None:
        return 0
    profile = ahead_profile(active_profile(ctx.settings))
    snapshot = build_snapshot(
        state,
        now,
        max_stop_grace_s=ctx.settings.max_stop_grace_s,
        cpu_jobs_on_gpu_nodes=profile.cpu_jobs_on_gpu_nodes,
    )
    scheduler = scheduler_for(ctx, profile, slot="ahead_scheduler")
    plan = scheduler.schedule(snapshot, now, random.Random(int(now)))
    # Each job must fit its nodes' turnover part, not the scaled nodes (the engine would refuse
    # it) nor the whole real ones (it would wait behind a job that keeps its slot).
    nodes = turnover_part(real)
    fitting = [a for a in plan.assignments if fits_nodes(a, nodes)]
    if len(fitting) < len(plan.assignments):
        # Once more without the too-big ones: their places in the plan were taken from others.
        too_big = {a.job_id for a in plan.assignments} - {a.job_id for a in fitting}
        snapshot = replace(snapshot, queued=tuple(j for j in snapshot.queued if j.id not in too_big))
        plan = scheduler.schedule(snapshot, now, random.Random(int(now)))
        fitting = [a for a in plan.assignments if fits_nodes(a, nodes)]
    # Such a job starts when the job before it ends, not now: its ETA outcome is that start
    # (Attempt.started_at, server/eta_record.py), not this placement
    placed = len(place_assignments(session, fitting, now)) if fitting else 0
    if placed:
        log.debug("schedule: %d placed ahead of a freed slot", placed)
    return placed
