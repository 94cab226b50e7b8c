"""Property tests over random clusters and queues."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import ANY_MODEL, PROFILES, NodeState, Plan, Scheduler, Snapshot, schedule
from tests.scheduler.builders import apply_plan, gpu_node, group, job, plan_for, running, snap
from tests.scheduler.strategies import snapshots

PROFILE_NAMES = sorted(PROFILES)


def check_capacity(s: Snapshot, plan: Plan) -> None:
    """Running + assigned never over-allocate a node's CPUs/memory or any GPU; only healthy GPUs
    on ready nodes are assigned; each gang is complete."""
    nodes = {n.name: n for n in s.nodes}
    gpu_users: dict[tuple[str, int], str] = {}
    cpus: dict[str, float] = {}
    queued = {j.id: j for j in s.queued}
    allocs = [(rj.allocation, False) for rj in s.running] + [(a.allocation, True) for a in plan.assignments]
    for alloc, new in allocs:
        for inst in alloc.instances:
            node = nodes[inst.node]
            cpus[node.name] = cpus.get(node.name, 0.0) + inst.cpus
            for g in inst.gpu_indices:
                assert (node.name, g) not in gpu_users, f"GPU {node.name}:{g} given twice"
                gpu_users[(node.name, g)] = alloc.job_id
                if new:
                    assert node.gpus[g].healthy
            if new:
                assert node.state is NodeState.READY
                spec = queued[alloc.job_id]
                want = {t.role: t.resources for t in spec.tasks}[inst.role]
                assert len(inst.gpu_indices) == want.gpus
                models = want.gpu_models
                assert models is None or all(node.gpus[g].model in models for g in inst.gpu_indices)
                assert bool(node.gpus) == (want.gpus > 0)  # the profiles keep CPU work off GPU nodes
    for name, used in cpus.items():
        assert used <= nodes[name].cpus + 1e-6, f"node {name} CPUs over-allocated"
    for a in plan.assignments:  # gang: every instance of every task, each once
        spec = queued[a.job_id]
        got = sorted((p.role, p.index) for p in a.allocation.instances)
        assert got == sorted((t.role, i) for t in spec.tasks for i in range(t.instances))


def group_usage(s: Snapshot, plan: Plan) -> dict[str, int]:
    used: dict[str, int] = {}
    by_id = {j.id: j for j in s.queued}
    for rj in s.running:
        used[rj.job.group] = used.get(rj.job.group, 0) + rj.job.total_gpus
    for a in plan.assignments:
        j = by_id[a.job_id]
        used[j.group] = used.get(j.group, 0) + j.total_gpus
    return used


@settings(max_examples=120, deadline=None)
@given(snapshots(), st.sampled_from(PROFILE_NAMES), st.sampled_from(["bestfit", "spread", "random"]))
def test_never_overallocate_never_half_a_gang(s: Snapshot, name: str, placement: str) -> None:
    plan = plan_for(s, PROFILES[name].with_placement(placement))
    check_capacity(s, plan)
    assigned = {a.job_id for a in plan.assignments}
    assert assigned.isdisjoint(plan.diagnoses)
    assert assigned | set(plan.diagnoses) == {j.id for j in s.queued}


@settings(max_examples=80, deadline=None)
@given(snapshots())
def test_never_exceed_group_max(s: Snapshot) -> None:
    before = group_usage(s, Plan((), (), {}))
    plan = plan_for(s, PROFILES["default"])
    after = group_usage(s, plan)
    for g in s.groups:
        cap = (g.max or {}).get(ANY_MODEL)
        limit = cap if g.borrowing else g.guaranteed.get(ANY_MODEL, 0)
        if limit is not None and after.get(g.name, 0) > before.get(g.name, 0):
            assert after[g.name] <= max(limit, g.guaranteed.get(ANY_MODEL, 0))


@settings(max_examples=60, deadline=None)
@given(snapshots(), st.integers(0, 2**32), st.sampled_from(PROFILE_NAMES))
def test_deterministic_under_same_seed(s: Snapshot, seed: int, name: str) -> None:
    profile = PROFILES[name].with_placement("random")
    assert schedule(s, 100.0, random.Random(seed), profile) == schedule(
        s, 100.0, random.Random(seed), profile
    )


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4),  # nodes
    st.integers(0, 8),  # guarantee of group a
    st.integers(0, 12),  # a's demand (1-GPU jobs)
    st.integers(0, 40),  # b's borrowed running jobs
)
def test_borrowed_work_does_not_keep_a_group_below_guarantee(
    nodes: int, guar: int, demand: int, lent: int
) -> None:
    cluster = [gpu_node(f"n{i}", gpus=4) for i in range(nodes)]
    groups = [group("a", guaranteed={ANY_MODEL: guar}), group("b")]
    run = []
    for k in range(min(lent, 4 * nodes)):  # b fills the cluster with borrowed 1-GPU jobs
        run.append(running(job(f"b{k}", group="b"), f"n{k // 4}", (k % 4,), start=float(k), borrowed=True))
    queued = [job(f"a{k}", group="a", submit=float(k)) for k in range(demand)]
    s = snap(cluster, queued, groups, run)
    preempted = False
    for cycle in range(6):
        plan = plan_for(s, PROFILES["default"], now=100.0 + cycle)
        check_capacity(s, plan)
        preempted |= bool(plan.preemptions)
        s = apply_plan(s, plan, 100.0 + cycle)
    a_running = sum(rj.job.total_gpus for rj in s.running if rj.job.group == "a")
    owed = min(guar, demand, 4 * nodes)
    assert a_running >= owed
    if preempted:  # reclaiming takes only what is owed: b keeps the rest
        assert all(not rj.borrowed for rj in s.running if rj.job.group == "a")


@settings(max_examples=40, deadline=None)
@given(snapshots(max_nodes=6, max_jobs=12), st.sampled_from(["default", "las", "fifo-backfill"]))
def test_cycles_reusing_state_between_calls_match_fresh_ones(s: Snapshot, name: str) -> None:
    """A Scheduler keeps a memo of the node table and of the running set between calls; a run of
    cycles with one nodes tuple must give the plans a fresh computation gives."""
    profile = PROFILES[name]
    kept = Scheduler(profile)
    for cycle in range(4):
        now = 100.0 + 50 * cycle
        plan = kept.schedule(s, now, random.Random(0))
        fresh_nodes = tuple(dataclasses.replace(n) for n in s.nodes)  # new identity: no memo
        fresh = plan_for(dataclasses.replace(s, nodes=fresh_nodes), profile, now=now)
        assert plan.assignments == fresh.assignments
        assert plan.preemptions == fresh.preemptions
        assert dict(plan.diagnoses) == dict(fresh.diagnoses)
        s = apply_plan(s, plan, now)
        if s.running:  # some work finishes between cycles
            s = dataclasses.replace(s, running=s.running[1:])
