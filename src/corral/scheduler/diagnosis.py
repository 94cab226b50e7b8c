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
from typing import TYPE_CHECKING

from corral.scheduler.cluster import ClusterState, ShapeKey, shape_key
from corral.scheduler.types import Diagnosis, Job, Reason

if TYPE_CHECKING:
    from corral.scheduler.core import _Cycle

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
    """The plan's diagnoses, built on first access: one job's alone when it is looked up by id
    (`one`), all at once when they are iterated or counted.

    Building them (a reason, a queue position and an estimate for every waiting job) costs about as
    much as placing; a caller that never asks "why is it waiting" in a cycle does not pay for it.
    The builders only read the cycle's final state, so the result is the same whenever they run."""

    def __init__(
        self,
        build: Callable[[], dict[str, Diagnosis]],
        one: Callable[[str], Diagnosis | None] | None = None,
    ) -> None:
        self._build: Callable[[], dict[str, Diagnosis]] | None = build
        self._one = one
        self._data: dict[str, Diagnosis] | None = None

    def _get(self) -> dict[str, Diagnosis]:
        if self._data is None:
            assert self._build is not None
            self._data = self._build()
            self._build = self._one = None  # let the cycle's state go
        return self._data

    def __getitem__(self, job_id: str) -> Diagnosis:
        if self._data is None and self._one is not None:
            found = self._one(job_id)
            if found is None:
                raise KeyError(job_id)
            return found
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


# (job id, GPUs, usable models, runtime estimate or None: `default_runtime_s`)
Waiting = tuple[str, int, tuple[str, ...], float | None]


def estimate_starts(
    now: float,
    free_by_model: Mapping[str, int],
    capacity_by_model: Mapping[str, int],
    events: Sequence[Event],
    waiting: Sequence[Waiting],
    default_runtime_s: float,
) -> dict[str, float | None]:
    """Roll the cluster forward: each waiting job (in order) starts when its model pool has room."""
    pools = {w[2] for w in waiting if w[1] > 0}
    if len(pools) == 1:
        (only,) = pools
        if len(only) == 1:  # one pool of one model (a homogeneous cluster): plain counts
            return _roll_one_model(
                now, only[0], free_by_model, capacity_by_model, events, waiting, default_runtime_s
            )
    free = dict(free_by_model)
    heap: list[tuple[float, int, Mapping[str, int]]] = [(end, n, pm) for n, (end, pm) in enumerate(events)]
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    seq = len(heap)
    t = now
    out: dict[str, float | None] = {}
    capacity: dict[tuple[str, ...], int] = {}
    for job_id, need, models, runtime in waiting:
        cap = capacity.get(models)
        if cap is None:
            cap = capacity[models] = sum(capacity_by_model.get(m, 0) for m in models)
        if need <= 0 or not models or need > cap:
            out[job_id] = now if need <= 0 else None
            continue
        taken: dict[str, int]
        if len(models) == 1:  # the common case: one pool, no sums
            model = models[0]
            avail = free.get(model, 0)
            while avail < need and heap:
                end, _, pm = pop(heap)
                if end > t:
                    t = end
                for m, n in pm.items():
                    free[m] = free.get(m, 0) + n
                avail = free.get(model, 0)
            if avail < need:
                out[job_id] = None
                continue
            free[model] = avail - need
            taken = {model: need}
        else:
            avail = sum(free.get(m, 0) for m in models)
            while avail < need and heap:
                end, _, pm = pop(heap)
                t = max(t, end)
                for m, n in pm.items():
                    free[m] = free.get(m, 0) + n
                    if m in models:
                        avail += n
            if avail < need:
                out[job_id] = None
                continue
            taken = {}
            left = need
            for m in models:
                k = min(left, free.get(m, 0))
                if k:
                    free[m] -= k
                    taken[m] = k
                    left -= k
        out[job_id] = t
        push(heap, (t + (default_runtime_s if runtime is None else runtime), seq, taken))
        seq += 1
    return out


def _roll_one_model(
    now: float,
    model: str,
    free_by_model: Mapping[str, int],
    capacity_by_model: Mapping[str, int],
    events: Sequence[Event],
    waiting: Sequence[Waiting],
    default_s: float,
) -> dict[str, float | None]:
    """estimate_starts when every waiting GPU job uses the same single model: the same walk with
    that model's free GPUs as a plain count (other models cannot change any estimate)."""
    free = free_by_model.get(model, 0)
    cap = capacity_by_model.get(model, 0)
    heap = [(end, n, pm.get(model, 0)) for n, (end, pm) in enumerate(events)]
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    seq = len(heap)
    t = now
    out: dict[str, float | None] = {}
    for job_id, need, models, runtime in waiting:
        if need <= 0 or not models or need > cap:
            out[job_id] = now if need <= 0 else None
            continue
        while free < need and heap:
            end, _, back = pop(heap)
            if end > t:
                t = end
            free += back
        if free < need:
            out[job_id] = None
            continue
        free -= need
        out[job_id] = t
        push(heap, (t + (default_s if runtime is None else runtime), seq, need))
        seq += 1
    return out


class DiagnosisView:
    """What the diagnoses of one cycle share (queue positions, estimated starts, capacity
    reasons), built from the cycle's final state (a `core._Cycle`, read only) on the first
    diagnosis read. The plan's LazyDiagnoses hold it; the cycle never points back to it, so the
    cycle is freed by reference counting as soon as the plan is."""

    def __init__(self, cycle: _Cycle) -> None:
        self.cycle = cycle
        self.built = False
        self.positions: dict[str, tuple[Job, int]] | None = None  # for one(): id -> (job, position)

    def all(self) -> dict[str, Diagnosis]:
        """Every waiting job's Diagnosis."""
        self._build()
        out: dict[str, Diagnosis] = {}
        for job, pos in self._positions():
            out[job.id] = self.diagnose(job, pos)
        return out

    def one(self, job_id: str) -> Diagnosis | None:
        """One waiting job's Diagnosis (None: not waiting), equal to its entry in `all()`."""
        self._build()
        if self.positions is None:
            self.positions = {job.id: (job, pos) for job, pos in self._positions()}
        hit = self.positions.get(job_id)
        return None if hit is None else self.diagnose(*hit)

    def _positions(self) -> Iterator[tuple[Job, int]]:
        """Waiting jobs not assigned, each with its 1-based position among its group's."""
        assigned = self.cycle.assigned_ids
        group, pos = None, 0
        for job in self.cycle.waiting:  # sorted by group, then the in-group order
            if job.id in assigned:
                continue
            if job.group != group:
                group, pos = job.group, 0
            pos += 1
            yield job, pos

    def _build(self) -> None:
        if self.built:
            return
        self.built = True
        cycle = self.cycle
        eta_order = cycle._eta_order()
        unschedulable = cycle.unschedulable
        if unschedulable:
            eta_order = [j for j in eta_order if j.id not in unschedulable]
        self.etas = cycle._etas(eta_order)
        self.caps = CapacityReasons(cycle.st)
        self.visited = {j.id for j in cycle.visited} if cycle.cut_short else set()
        self.blocked = None if cycle.blocker is None else cycle._blocked_reason(cycle.blocker)
        self.depth_reason = Reason(
            "backfill_depth",
            "admission:backfill",
            f"not tried this cycle: at most {cycle.profile.backfill_depth} jobs are tried "
            "behind a reserved job",
        )

    def diagnose(self, job: Job, pos: int) -> Diagnosis:
        cycle = self.cycle
        never = cycle.unschedulable.get(job.id)
        if never is not None:
            return Diagnosis(job.id, never, pos, None, True)
        reasons: tuple[Reason, ...]
        why = cycle.why.get(job.id)
        hit = cycle._info_memo.get(id(job))  # a job no pass reached needs no JobInfo made for this
        sig = hit[1].sig if hit is not None and hit[0] is job else shape_key(job)
        if why is not None:
            reasons = (why,)
        elif self.blocked is not None and job is not cycle.blocker:
            reasons = (self.blocked, *self.caps.reasons(job, sig))
        elif cycle.cut_short and job.id not in self.visited:
            reasons = (self.depth_reason, *self.caps.reasons(job, sig))
        else:
            reasons = self.caps.reasons(job, sig)
        return Diagnosis(job.id, reasons, pos, self.etas.get(job.id))
