"""Placement plugins, registered by name: filters reject nodes, scorers rank the ones left.

A filter looks at one node and one task instance and returns None (keep) or the code of why it
refused the node; placement keeps the nodes no filter refuses, and a waiting job's diagnosis is
built from the same refusals (diagnosis.py, `CapacityReasons`).
A scorer rates placing `k` instances of a request on node `i` using GPU model `model`
(None for CPU-only work); higher is better. A Profile names the filters it runs and the
scorers it adds up with weights. Plugins must be pure: the only randomness is the `rng` passed in.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from corral.scheduler.cluster import EPS, ClusterState, Request

Filter = Callable[[ClusterState, int, Request, bool], "str | None"]
Scorer = Callable[[ClusterState, int, "str | None", Request, int, random.Random], float]


def filter_node_state(st: ClusterState, i: int, req: Request, cpu_on_gpu: bool) -> str | None:
    """Cordoned, draining, down and unknown nodes take nothing new."""
    return None if st.ready[i] else "node_not_ready"


def filter_node_kind(st: ClusterState, i: int, req: Request, cpu_on_gpu: bool) -> str | None:
    """GPU work only on GPU nodes; CPU-only work off GPU nodes unless the profile allows it."""
    if req.gpus > 0:
        return None if st.is_gpu[i] else "cpu_only_node"
    if st.is_gpu[i] and not cpu_on_gpu:
        return "gpu_node_reserved"
    return None


def filter_gpu_model(st: ClusterState, i: int, req: Request, cpu_on_gpu: bool) -> str | None:
    """The node must have GPUs of an allowed model ("A100" or "V100M16|V100M32")."""
    if req.gpus <= 0 or req.models is None:
        return None
    return None if any(m in req.models for m in st.free[i]) else "gpu_model_mismatch"


def filter_gpu_free(st: ClusterState, i: int, req: Request, cpu_on_gpu: bool) -> str | None:
    """Enough free healthy GPUs of one allowed model on this node for one instance."""
    if req.gpus <= 0:
        return None
    for m, lst in st.free[i].items():
        if (req.models is None or m in req.models) and len(lst) >= req.gpus:
            return None
    return "insufficient_free_gpus"


def filter_cpu_memory(st: ClusterState, i: int, req: Request, cpu_on_gpu: bool) -> str | None:
    """Enough free CPUs and memory for one instance."""
    if st.free_cpus[i] + EPS < req.cpus or st.free_mem[i] < req.memory_mib:
        return "insufficient_cpu_memory"
    return None


# In the order a diagnosis reads them: what a node is (kind, models) before whether it is ready,
# before what it has free, so the filter that refused the nodes that got furthest says why a job
# waits (a job whose only suitable node is cordoned is told so, not that CPUs are short).
FILTERS: dict[str, Filter] = {
    "node_kind": filter_node_kind,
    "gpu_model": filter_gpu_model,
    "node_state": filter_node_state,
    "gpu_free": filter_gpu_free,
    "cpu_memory": filter_cpu_memory,
}
DEFAULT_FILTERS: tuple[str, ...] = tuple(FILTERS)


def _remaining(st: ClusterState, i: int, model: str | None, req: Request, k: int) -> float:
    if model is None:
        return st.free_cpus[i] - k * req.cpus
    return float(len(st.free[i][model]) - k * req.gpus)


def score_bestfit(
    st: ClusterState, i: int, model: str | None, req: Request, k: int, rng: random.Random
) -> float:
    """Least remaining after placement wins (GPUs of the model used; CPUs for CPU-only work)."""
    return -_remaining(st, i, model, req, k)


def score_spread(
    st: ClusterState, i: int, model: str | None, req: Request, k: int, rng: random.Random
) -> float:
    """Most remaining after placement wins: spreads load, keeps headroom on every node."""
    return _remaining(st, i, model, req, k)


def score_random(
    st: ClusterState, i: int, model: str | None, req: Request, k: int, rng: random.Random
) -> float:
    """Uniformly random among feasible nodes (a baseline policy)."""
    return rng.random()


def score_topology(
    st: ClusterState, i: int, model: str | None, req: Request, k: int, rng: random.Random
) -> float:
    """1 when one instance's GPUs can come from a single NVLink/PCIe group on this node."""
    topo = st.topo[i]
    if model is None or topo is None or req.gpus <= 1:
        return 1.0
    counts: dict[int, int] = {}
    for g in st.free[i][model]:
        counts[topo.get(g, -1)] = counts.get(topo.get(g, -1), 0) + 1
    return 1.0 if any(c >= req.gpus for c in counts.values()) else 0.0


SCORERS: dict[str, Scorer] = {
    "bestfit": score_bestfit,
    "spread": score_spread,
    "random": score_random,
    "topology": score_topology,
}
PLACEMENTS: tuple[str, ...] = ("bestfit", "spread", "random")
