"""Hypothesis strategies: random clusters, groups, queues and running work."""

from __future__ import annotations

from hypothesis import strategies as st

from corral.scheduler import ANY_MODEL, NodeState, Priority, Snapshot, Usage
from tests.scheduler.builders import cpu_node, gpu_node, group, job, running

MODELS = ("A100", "V100M16", "V100M32")
CONSTRAINTS = (None, None, "A100", "V100M16|V100M32", "V100M32")


@st.composite
def snapshots(draw: st.DrawFn, max_nodes: int = 8, max_jobs: int = 14) -> Snapshot:
    nodes = []
    for i in range(draw(st.integers(1, max_nodes))):
        if draw(st.integers(0, 5)) == 0:
            nodes.append(cpu_node(f"c{i}", cpus=draw(st.sampled_from([4, 16]))))
            continue
        nodes.append(
            gpu_node(
                f"n{i}",
                gpus=draw(st.sampled_from([2, 4, 8])),
                model=draw(st.sampled_from(MODELS)),
                cpus=draw(st.sampled_from([8, 32])),
                state=draw(st.sampled_from([NodeState.READY] * 4 + [NodeState.CORDONED, NodeState.DOWN])),
                topology=draw(st.sampled_from([None, 2, 4])),
                unhealthy=(0,) if draw(st.integers(0, 7)) == 0 else (),
            )
        )
    groups = [
        group(
            name,
            guaranteed={ANY_MODEL: draw(st.integers(0, 6))},
            max=draw(st.sampled_from([None, {ANY_MODEL: 10}])),
            user_max_gpus=draw(st.sampled_from([None, 6])),
            borrowing=draw(st.booleans()),
        )
        for name in ("a", "b", "c")
    ]
    jobs = []
    for k in range(draw(st.integers(0, max_jobs))):
        jobs.append(
            job(
                f"j{k}",
                gpus=draw(st.sampled_from([0, 1, 1, 2, 4, 8])),
                instances=draw(st.sampled_from([1, 1, 2, 3])),
                group=draw(st.sampled_from(["a", "b", "c"])),
                user=draw(st.sampled_from(["x", "y"])),
                model=draw(st.sampled_from(CONSTRAINTS)),
                cpus=draw(st.sampled_from([1, 4])),
                priority=draw(st.sampled_from(list(Priority))),
                submit=float(draw(st.integers(0, 50))),
                runtime=draw(st.sampled_from([None, 50.0, 500.0])),
                preemptible=draw(st.booleans()),
                attained=float(draw(st.sampled_from([0, 5000, 50000]))),
            )
        )
    # some jobs already run: put single-instance ones onto free GPUs of ready-or-not nodes
    run = []
    taken: dict[str, set[int]] = {}
    for k in range(draw(st.integers(0, 6))):
        node = draw(st.sampled_from(nodes))
        free = [g.index for g in node.gpus if g.healthy and g.index not in taken.get(node.name, set())]
        if not node.gpus or not free:
            continue
        n = draw(st.integers(1, len(free)))
        idx = tuple(free[:n])
        taken.setdefault(node.name, set()).update(idx)
        rj = job(f"r{k}", gpus=n, group=draw(st.sampled_from(["a", "b", "c"])), model=node.gpus[0].model)
        run.append(running(rj, node.name, idx, start=float(k * 10), borrowed=draw(st.booleans())))
    usage = Usage(by_group={"a": float(draw(st.integers(0, 1000))), "b": 0.0})
    return Snapshot(tuple(nodes), tuple(groups), tuple(jobs), tuple(run), usage)
