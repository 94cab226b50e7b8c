"""The CPU and memory side of estimated starts: the GPU roll (eta.py) sees only GPUs, so a job
that waits for CPUs or memory (a CPU-only job on a full node, or a GPU job whose node has free
GPUs but no CPUs left) would be told "now". Its start is no earlier than the first time a node
that could take it has the CPUs and memory for one instance free, counting what running jobs on
that node give back at their expected ends (the same ends the GPU timelines use: `remaining_s`,
victims and stopping jobs when they are gone, jobs started this cycle after their estimate).

A lower bound, like Slurm's backfill for each resource on its own: the CPUs the jobs ahead of it
will take are not held (they hold GPUs on the timelines), and a gang's other instances are not
counted. A job that fits some node's free CPUs and memory now is left as the GPU roll put it, so
the GPU-bound estimates do not change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from corral.scheduler.cluster import EPS, ClusterState, Request
from corral.scheduler.plugins import filter_node_kind
from corral.scheduler.types import Allocation, Job, Resources

Return = tuple[float, float, int]  # (time, CPUs, memory MiB) given back on one node
CANDIDATES_KEPT = 4096  # request shapes whose candidate nodes a node table keeps


class CpuMemoryFloors:
    """Per job: the earliest time some node that could take one instance of each of its tasks has
    the CPUs and memory for it free (`floor`), from the cycle's final free capacity and the
    running work's expected ends on each node."""

    def __init__(
        self,
        st: ClusterState,
        cpu_on_gpu: bool,
        now: float,
        ends: Callable[[], Sequence[tuple[float, Allocation]]],
    ) -> None:
        self.st, self.cpu_on_gpu, self.now = st, cpu_on_gpu, now
        self._ends = ends  # (expected end, allocation) of the running work: read when first needed
        self._returns: list[list[Return]] | None = None  # per node, by time: built when first needed
        # id(Resources) -> some node has it free now: the per-job look-up (jobs share few shapes,
        # not their Resources objects); `_held` keeps each id meaning the same object
        self.fits_now_by_id: dict[int, bool] = {}
        self._held: list[Resources] = []
        self._fits_now: dict[Resources, bool] = {}  # by value: once per shape
        self._floors: dict[Resources, float | None] = {}  # earliest time (None: never)

    def floor(self, job: Job) -> float | None:
        """`now` when every task fits some node's free CPUs and memory now; else the latest over
        its tasks of the earliest time one instance fits (None: no running work frees enough)."""
        out = self.now
        for t in job.tasks:
            r = t.resources
            fits = self.fits_now_by_id.get(id(r))
            if fits is None:
                fits = self._fits_now.get(r)
                if fits is None:
                    fits = self._fits_now[r] = self._fits_anywhere_now(r)
                self._held.append(r)
                self.fits_now_by_id[id(r)] = fits
            if fits:
                continue
            if r not in self._floors:
                self._floors[r] = self._earliest(r)
            at = self._floors[r]
            if at is None:
                return None
            out = max(out, at)
        return out

    def _candidates(self, r: Resources) -> tuple[int, ...]:
        """Ready nodes that could ever take one instance: the right kind, with enough GPUs of an
        allowed model (healthy or not: a count, not what is free) and enough CPUs and memory.
        Read only from the node table, so kept there (`NodeTable.cpu_candidates`)."""
        key = (r.gpus, r.gpu_model, r.cpus, r.memory_mib, self.cpu_on_gpu)
        kept = self.st.table.cpu_candidates
        found = kept.get(key)
        if found is None:
            if len(kept) >= CANDIDATES_KEPT:  # a live cluster may see many shapes over its life
                kept.clear()
            found = kept[key] = tuple(self._find_candidates(r))
        return found

    def _find_candidates(self, r: Resources) -> list[int]:
        st = self.st
        req = Request(r.gpus, r.gpu_models, r.cpus, r.memory_mib)
        out = []
        for i, node in enumerate(st.nodes):
            if not st.ready[i] or filter_node_kind(st, i, req, self.cpu_on_gpu) is not None:
                continue
            if node.cpus + EPS < r.cpus or node.memory_mib < r.memory_mib:
                continue
            if r.gpus > 0:
                models = st.gpu_model[i].values()
                if sum(1 for m in models if req.models is None or m in req.models) < r.gpus:
                    continue
            out.append(i)
        return out

    def _fits_anywhere_now(self, r: Resources) -> bool:
        st = self.st
        free_cpus, free_mem = st.free_cpus, st.free_mem
        return any(free_cpus[i] + EPS >= r.cpus and free_mem[i] >= r.memory_mib for i in self._candidates(r))

    def _earliest(self, r: Resources) -> float | None:
        returns = self._node_returns()
        st = self.st
        best: float | None = None
        for i in self._candidates(r):
            cpus, mem = st.free_cpus[i], st.free_mem[i]
            for end, c, m in returns[i]:
                if best is not None and end >= best:
                    break
                cpus += c
                mem += m
                if cpus + EPS >= r.cpus and mem >= r.memory_mib:
                    best = end
                    break
        return None if best is None else max(best, self.now)

    def _node_returns(self) -> list[list[Return]]:
        if self._returns is None:
            index_of = self.st.index_of
            out: list[list[Return]] = [[] for _ in self.st.nodes]
            for end, allocation in self._ends():
                for inst in allocation.instances:
                    i = index_of.get(inst.node)
                    if i is not None:
                        out[i].append((end, inst.cpus, inst.memory_mib))
            for lst in out:
                lst.sort()
            self._returns = out
        return self._returns


def raise_to_floors(found: dict[str, float | None], jobs: Sequence[Job], floors: CpuMemoryFloors) -> None:
    """Each of `jobs` with an estimate in `found` starts no earlier than its CPU/memory floor
    (none at all when no running work frees enough for it). Runs for every job of every roll: a
    one-task job whose request fits some node now costs two look-ups."""
    now = floors.now
    fits_now = floors.fits_now_by_id
    left = len(found)  # (a targeted roll's `found` ends well before `jobs` does)
    for job in jobs:
        if left <= 0:
            return
        # membership, not a sentinel default: compiled (mypyc), a float default is unboxed and
        # boxed again, so `at is SENTINEL` never held and every job counted as found
        if job.id not in found:
            continue
        at = found[job.id]
        left -= 1
        if at is None:
            continue
        tasks = job.tasks
        if len(tasks) == 1 and fits_now.get(id(tasks[0].resources)):
            continue
        floor = floors.floor(job)
        if floor is None:
            found[job.id] = None
        elif floor > at and floor > now:
            found[job.id] = floor
