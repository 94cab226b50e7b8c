"""A job's retry avoids the node or GPU that failed it (corral.diagnosis -> Job.avoid)."""

from __future__ import annotations

import random

from corral.scheduler import Scheduler
from corral.scheduler.types import GPU, Group, Job, Node, Resources, Snapshot, TaskSpec


def node(name: str, gpus: int = 4) -> Node:
    gpu_list = tuple(GPU(i, f"{name}-{i}", "A100") for i in range(gpus))
    return Node(name, cpus=32, memory_mib=256_000, gpus=gpu_list)


def job(job_id: str, gpus: int, avoid: tuple[tuple[str, int | None], ...] = ()) -> Job:
    task = TaskSpec("main", 1, Resources(gpus=gpus, cpus=1, memory_mib=1000))
    return Job(job_id, "g", "u", (task,), avoid=avoid)


def snap(nodes: tuple[Node, ...], queued: tuple[Job, ...]) -> Snapshot:
    return Snapshot(nodes=nodes, groups=(Group("g"),), queued=queued)


def placed(snapshot: Snapshot) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    plan = Scheduler().schedule(snapshot, 0.0, random.Random(0))
    return {a.job_id: [(p.node, p.gpu_indices) for p in a.allocation.instances] for a in plan.assignments}


def test_a_retry_never_lands_on_the_gpu_it_must_avoid() -> None:
    nodes = (node("a", 2),)
    without = placed(snap(nodes, (job("1", 1),)))
    assert without["1"] == [("a", (0,))]  # the GPU a plain job gets first
    got = placed(snap(nodes, (job("1", 1, avoid=(("a", 0),)),)))
    assert got["1"] == [("a", (1,))]


def test_a_job_avoiding_a_whole_node_goes_elsewhere_or_waits() -> None:
    nodes = (node("a"), node("b"))
    got = placed(snap(nodes, (job("1", 4, avoid=(("a", None),)),)))
    assert got["1"] == [("b", (0, 1, 2, 3))]
    alone = placed(snap((node("a"),), (job("1", 1, avoid=(("a", None),)),)))
    assert alone == {}


def test_what_one_job_avoids_stays_free_for_the_next() -> None:
    nodes = (node("a", 2),)
    queued = (job("1", 1, avoid=(("a", 0),)), job("2", 1))
    got = placed(snap(nodes, queued))
    assert got == {"1": [("a", (1,))], "2": [("a", (0,))]}
