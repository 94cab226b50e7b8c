"""Placement rules: node state, node kind, GPU model, health, best-fit/spread, topology, gang."""

from __future__ import annotations

import dataclasses

from corral.scheduler import PROFILES, NodeState, Profile
from tests.scheduler.builders import assigned_nodes, cpu_node, gpu_node, job, plan_for, running, snap

FIFO = PROFILES["fifo-backfill"]


def test_not_ready_nodes_take_nothing() -> None:
    nodes = [
        gpu_node("cordoned", state=NodeState.CORDONED),
        gpu_node("draining", state=NodeState.DRAINING),
        gpu_node("down", state=NodeState.DOWN),
        gpu_node("unknown", state=NodeState.UNKNOWN),
        gpu_node("ok"),
    ]
    plan = plan_for(snap(nodes, [job(f"j{i}") for i in range(3)]), FIFO)
    assert {n for ns in assigned_nodes(plan).values() for n in ns} == {"ok"}


def test_cpu_jobs_stay_off_gpu_nodes_unless_allowed() -> None:
    s = snap([gpu_node("g1"), cpu_node("c1", cpus=4)], [job("cpu", gpus=0, cpus=2)])
    assert assigned_nodes(plan_for(s, FIFO)) == {"cpu": ["c1"]}
    s_full = snap([gpu_node("g1"), cpu_node("c1", cpus=1)], [job("cpu", gpus=0, cpus=2)])
    plan = plan_for(s_full, FIFO)
    assert not plan.assignments
    assert plan.diagnoses["cpu"].unschedulable  # no node that takes CPU-only work is big enough
    assert plan.diagnoses["cpu"].reasons[0].code == "instance_too_large"
    allow = dataclasses.replace(FIFO, cpu_jobs_on_gpu_nodes=True)
    assert assigned_nodes(plan_for(s_full, allow)) == {"cpu": ["g1"]}


def test_gpu_jobs_only_on_gpu_nodes_and_model_constraint() -> None:
    nodes = [cpu_node("c1"), gpu_node("v16", model="V100M16"), gpu_node("a", model="A100")]
    queued = [
        job("any", gpus=1, model="V100M16|V100M32", submit=0),
        job("a100", gpus=1, model="A100", submit=1),
    ]
    got = assigned_nodes(plan_for(snap(nodes, queued), FIFO))
    assert got == {"any": ["v16"], "a100": ["a"]}


def test_unhealthy_gpus_are_never_assigned() -> None:
    nodes = [gpu_node("n", gpus=4, unhealthy=(0, 2))]
    plan = plan_for(snap(nodes, [job("j", gpus=2), job("k", gpus=1, submit=1)]), FIFO)
    gpus = [p.gpu_indices for a in plan.assignments for p in a.allocation.instances]
    assert gpus == [(1, 3)]
    assert plan.diagnoses["k"].reasons[0].code == "insufficient_gpus"


def test_bestfit_picks_fullest_node_spread_picks_emptiest() -> None:
    nodes = [gpu_node("empty"), gpu_node("half")]
    occupant = job("occ", gpus=4)
    s = snap(nodes, [job("j", gpus=2)], run=[running(occupant, "half", (0, 1, 2, 3))])
    assert assigned_nodes(plan_for(s, FIFO)) == {"j": ["half"]}
    assert assigned_nodes(plan_for(s, FIFO.with_placement("spread"))) == {"j": ["empty"]}


def test_random_placement_is_seeded() -> None:
    nodes = [gpu_node(f"n{i}") for i in range(20)]
    s = snap(nodes, [job(f"j{i}", submit=i) for i in range(5)])
    rnd = FIFO.with_placement("random")
    assert plan_for(s, rnd, seed=3) == plan_for(s, rnd, seed=3)
    picks = {tuple(assigned_nodes(plan_for(s, rnd, seed=k))["j0"]) for k in range(8)}
    assert len(picks) > 1


def test_instance_gpus_come_from_one_topology_group() -> None:
    node = gpu_node("n", topology=4)
    # GPUs 0 and 4 busy: each group has 3 free; a 3-GPU instance must use one group only
    occ = job("occ", gpus=2)
    s = snap([node], [job("j", gpus=3)], run=[running(occ, "n", (0, 4))])
    (a,) = plan_for(s, FIFO).assignments
    (inst,) = a.allocation.instances
    assert len({g // 4 for g in inst.gpu_indices}) == 1


def test_multi_instance_job_prefers_fewest_nodes() -> None:
    nodes = [gpu_node("a", gpus=4), gpu_node("b", gpus=8), gpu_node("c", gpus=4)]
    plan = plan_for(snap(nodes, [job("j", gpus=2, instances=4)]), FIFO)
    assert assigned_nodes(plan) == {"j": ["b", "b", "b", "b"]}


def test_gang_is_all_or_nothing() -> None:
    nodes = [gpu_node("a", gpus=4), gpu_node("b", gpus=4)]
    plan = plan_for(snap(nodes, [job("big", gpus=4, instances=3)]), FIFO)
    assert not plan.assignments
    assert plan.diagnoses["big"].unschedulable  # 12 GPUs asked, the cluster has 8
    plan = plan_for(snap(nodes, [job("two", gpus=4, instances=2)]), FIFO)
    assert sorted(assigned_nodes(plan)["two"]) == ["a", "b"]


def test_running_allocations_occupy_resources() -> None:
    occ = job("occ", gpus=8, cpus=60)
    s = snap([gpu_node("n")], [job("j", gpus=1, cpus=8)], run=[running(occ, "n", tuple(range(8)))])
    assert not plan_for(s, FIFO).assignments


def test_cpu_and_memory_limit_placement() -> None:
    s = snap([gpu_node("n", cpus=8)], [job("j", gpus=1, cpus=16)])
    plan = plan_for(s, FIFO)
    assert plan.diagnoses["j"].unschedulable
    assert plan.diagnoses["j"].reasons[0].code == "instance_too_large"


def test_profile_rejects_unknown_plugin_names() -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown placement 'tightest'"):
        Profile(placement="tightest")
    with pytest.raises(ValueError, match="unknown filter"):
        Profile(filters=("node_state", "nope"))
    with pytest.raises(ValueError, match="grace_s must be >= 0"):
        Profile(grace_s=-1)


def test_multi_task_job_is_one_gang() -> None:
    from corral.scheduler import Job, Resources, TaskSpec

    tasks = (
        TaskSpec("ps", 1, Resources(gpus=0, cpus=2)),
        TaskSpec("worker", 2, Resources(gpus=4, gpu_model="A100", cpus=4)),
    )
    j = Job(id="mt", group="g", user="u", tasks=tasks)
    allow = dataclasses.replace(FIFO, cpu_jobs_on_gpu_nodes=True)
    plan = plan_for(snap([gpu_node("a"), gpu_node("b", gpus=2)], [j]), allow)
    (a,) = plan.assignments
    assert sorted((p.role, p.node, len(p.gpu_indices)) for p in a.allocation.instances) == [
        ("ps", "a", 0),
        ("worker", "a", 4),
        ("worker", "a", 4),
    ]


def test_shared_node_table_is_never_modified_by_a_cycle() -> None:
    nodes = (gpu_node("a"), gpu_node("b"))
    busy = snap(nodes, [job(f"j{i}", gpus=4, submit=i) for i in range(3)])
    first = plan_for(busy, FIFO)
    assert len(first.assignments) == 3
    empty_same_tuple = plan_for(snap(nodes, [job("x", gpus=8)]), FIFO)
    empty_fresh_tuple = plan_for(snap(tuple(nodes), [job("x", gpus=8)]), FIFO)
    fresh = plan_for(snap([gpu_node("a"), gpu_node("b")], [job("x", gpus=8)]), FIFO)
    assert empty_same_tuple == empty_fresh_tuple == fresh
    assert len(fresh.assignments) == 1


def test_profiles_and_placement_switch() -> None:
    for name in ("default", "fifo", "fifo-backfill", "sjf", "las"):
        assert PROFILES[name].name == name
    spread = PROFILES["default"].with_placement("spread")
    assert spread.placement == "spread" and spread.order == "fair_share"


def test_doubly_booked_gpu_from_a_bad_snapshot_stays_taken() -> None:
    nodes = (gpu_node("n", gpus=2),)
    run = [running(job("x"), "n", (0,)), running(job("y"), "n", (0,))]  # both claim GPU 0
    for _ in range(2):  # second call goes through the state kept between calls
        plan = plan_for(snap(nodes, [job("a"), job("b", submit=1)], run=run), FIFO)
        assert [p.gpu_indices for a in plan.assignments for p in a.allocation.instances] == [(1,)]
    plan = plan_for(snap(nodes, [job("a"), job("b", submit=1)], run=run[:1]), FIFO)
    assert len(plan.assignments) == 1  # GPU 0 is still held by x


def test_cpu_job_on_cluster_without_cpu_nodes_gets_the_true_reason() -> None:
    plan = plan_for(snap([gpu_node("g1")], [job("cpu", gpus=0, cpus=1)]), FIFO)
    reason = plan.diagnoses["cpu"].reasons[0]
    assert plan.diagnoses["cpu"].unschedulable
    assert reason.code == "no_cpu_nodes"
    assert "no node that takes CPU-only work" in reason.message
    assert reason.message.endswith("unless an admin sets CORRAL_CPU_JOBS_ON_GPU_NODES=true)")  # the way out
