"""Small builders for hand-made traces and clusters."""

from __future__ import annotations

from typing import Any

from corral.sim.cluster import ClusterSpec, parse_cluster
from corral.sim.replay import SimConfig, SimJob, SimResult
from corral.sim.runner import simulate
from corral.sim.trace import Trace, TraceJob


def trace(*jobs: tuple[str, float, float, int] | tuple[str, float, float, int, dict[str, Any]]) -> Trace:
    """Jobs as (job_id, submit_time, duration, num_gpus[, extra TraceJob fields])."""
    made = []
    for item in jobs:
        extra: dict[str, Any] = dict(item[4]) if len(item) > 4 else {}  # type: ignore[misc]
        extra.setdefault("group", "g")
        made.append(
            TraceJob(job_id=item[0], submit_time=item[1], duration=item[2], num_gpus=item[3], **extra)
        )
    made.sort(key=lambda j: j.submit_time)
    return Trace(name="hand", jobs=tuple(made))


def cluster(
    nodes: int, gpus: int, groups: list[dict[str, Any]] | None = None, model: str = "V100"
) -> ClusterSpec:
    data = {
        "name": "hand",
        "pools": [{"name": "n", "count": nodes, "gpus_per_node": gpus, "gpu_model": model, "cpus": 32}],
        "groups": groups if groups is not None else [{"name": "g", "guaranteed": nodes * gpus}],
    }
    return parse_cluster(data, "hand.yaml")


def run(tr: Trace, cl: ClusterSpec, policy: str, **config: Any) -> tuple[SimResult, dict[str, SimJob]]:
    result = simulate(tr, cl, policy, SimConfig(**config))
    return result, {j.trace.job_id: j for j in result.jobs}
