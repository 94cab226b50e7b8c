"""Diagnosis of waiting jobs: capacity reasons read off the final free-capacity index, and an
estimated start from rolling the plan forward with runtime estimates.

The roll-forward treats each GPU model as one pool (it ignores how free GPUs are spread over
nodes), walks waiting jobs in the order the cycle considered them, and lets each start at the
earliest time its model pool has room, holding the GPUs for its runtime estimate. It costs
O((waiting jobs looked at + running jobs) log n) and is bounded by Profile.eta_limit.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence

from corral.scheduler.cluster import ClusterState, ShapeKey, shape_key
from corral.scheduler.types import Diagnosis, Job, Reason

Event = tuple[float, Mapping[str, int]]  # (time GPUs come back, GPUs per model)


def job_models(st: ClusterState, job: Job) -> tuple[str, ...]:
    """Cluster GPU models any GPU task of the job may use."""
    out: set[str] = set()
    for t in job.tasks:
        if t.resources.gpus > 0:
            allowed = t.resources.gpu_models
            out.update(m for m in st.models if allowed is None or m in allowed)
    return tuple(sorted(out))


class LazyDiagnoses(Mapping[str, Diagnosis]):
    """The plan's diagnoses, built all at once on first access.

    Building them (a reason, a queue position and an estimate for every waiting job) costs about as
    much as placing; a caller that never asks "why is it waiting" in a cycle does not pay for it.
    The builder only reads the cycle's final state, so the result is the same whenever it runs."""

    def __init__(self, build: Callable[[], dict[str, Diagnosis]]) -> None:
        self._build: Callable[[], dict[str, Diagnosis]] | None = build
        self._data: dict[str, Diagnosis] | None = None

    def _get(self) -> dict[str, Diagnosis]:
        if self._data is None:
            assert self._build is not None
            self._data = self._build()
            self._build = None  # let the cycle's state go
        return self._data

    def __getitem__(self, job_id: str) -> Diagnosis:
        return self._get()[job_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())


class CapacityReasons:
    """Why a job does not fit the free capacity left at the end of the cycle (cached per shape)."""

    def __init__(self, st: ClusterState) -> None:
        self.st = st
        self._cache: dict[ShapeKey, tuple[Reason]] = {}

    def reasons(self, job: Job, key: ShapeKey | None = None) -> tuple[Reason]:
        key = shape_key(job) if key is None else key
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = (self._reason(job),)
        return hit

    def _reason(self, job: Job) -> Reason:
        st = self.st
        for t in job.tasks:
            r = t.resources
            if r.gpus <= 0:
                continue
            models = [m for m in st.models if r.gpu_models is None or m in r.gpu_models]
            label = "|".join(models) or "any"
            free = sum(st.free_total.get(m, 0) for m in models)
            need = t.instances * r.gpus
            if free < need:
                return Reason(
                    "insufficient_gpus", "filter:gpu_free", f"needs {need} {label} GPUs; {free} are free now"
                )
            block = max((st.largest_block(m) for m in models), default=0)
            if block < r.gpus:
                return Reason(
                    "gpu_fragmented",
                    "filter:gpu_free",
                    f"needs {r.gpus} {label} GPUs on one node; largest free block is {block}",
                )
        if job.total_gpus == 0:
            r = job.tasks[0].resources
            return Reason(
                "insufficient_cpu_memory",
                "filter:cpu_memory",
                f"needs {r.cpus:g} CPUs and {r.memory_mib} MiB on a node for CPU-only work; none has it free",
            )
        return Reason(
            "no_fit",
            "placement:gang",
            "free GPUs exist, but no set of nodes holds every instance with its CPUs and memory at once",
        )


def estimate_starts(
    now: float,
    free_by_model: Mapping[str, int],
    capacity_by_model: Mapping[str, int],
    events: Sequence[Event],
    waiting: Sequence[Job],
    models_of: Callable[[Job], tuple[str, ...]],
    runtime_of: Callable[[Job], float],
    gpus_of: Callable[[Job], int] | None = None,
) -> dict[str, float | None]:
    """Roll the cluster forward: each waiting job (in order) starts when its model pool has room.
    `gpus_of` may supply each job's total GPUs when the caller already knows them."""
    free = dict(free_by_model)
    heap: list[tuple[float, int, Mapping[str, int]]] = [(end, n, pm) for n, (end, pm) in enumerate(events)]
    heapq.heapify(heap)
    seq = len(heap)
    t = now
    out: dict[str, float | None] = {}
    capacity: dict[tuple[str, ...], int] = {}
    for job in waiting:
        need = job.total_gpus if gpus_of is None else gpus_of(job)
        models = models_of(job)
        cap = capacity.get(models)
        if cap is None:
            cap = capacity[models] = sum(capacity_by_model.get(m, 0) for m in models)
        if need <= 0 or not models or need > cap:
            out[job.id] = now if need <= 0 else None
            continue
        avail = sum(free.get(m, 0) for m in models)
        while avail < need and heap:
            end, _, pm = heapq.heappop(heap)
            t = max(t, end)
            for m, n in pm.items():
                free[m] = free.get(m, 0) + n
                if m in models:
                    avail += n
        if avail < need:
            out[job.id] = None
            continue
        out[job.id] = t
        taken: dict[str, int] = {}
        left = need
        for m in models:
            k = min(left, free.get(m, 0))
            if k:
                free[m] -= k
                taken[m] = k
                left -= k
        heapq.heappush(heap, (t + runtime_of(job), seq, taken))
        seq += 1
    return out
