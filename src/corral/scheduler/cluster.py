"""Mutable per-cycle view of free capacity, with an index for fast placement.

`ClusterState` is built once per `schedule()` call from the snapshot: every node's free CPUs,
memory and free healthy GPU indices per model, with running allocations subtracted. Ready GPU
nodes are also indexed in buckets `model -> free count -> sorted node indices`, so a best-fit
search walks free counts upward instead of scanning every node (see placement.py).

`ClusterShapes` summarises what each node could hold when empty; it answers "can this job ever
fit here?" in O(number of distinct node shapes) instead of O(nodes).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import TypeVar

from corral.scheduler.seqdiff import DiffMemo, appended_diff
from corral.scheduler.types import Allocation, Job, Node, NodeState, Reason, RunningJob
from corral.words import gpus_of, plural

EPS = 1e-9
MANY = 1 << 30


@dataclass(frozen=True, slots=True)
class Request:
    """What one task instance needs, with its GPU-model constraint parsed."""

    gpus: int
    models: frozenset[str] | None
    cpus: float
    memory_mib: int

    def __init__(  # written out, as in types.py (one per placement)
        self, gpus: int, models: frozenset[str] | None, cpus: float, memory_mib: int
    ) -> None:
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "memory_mib", memory_mib)


ShapeKey = tuple[object, ...]
K = TypeVar("K")


def shape_key(job: Job) -> ShapeKey:
    """A cheap hashable key of a job's task shapes: jobs with equal keys fit or fail alike (a job
    that must avoid nodes or GPUs is its own kind)."""
    tasks = job.tasks
    if job.avoid:
        return (_shape(job), job.avoid)
    if len(tasks) == 1:
        t = tasks[0]
        r = t.resources
        return (t.instances, r.gpus, r.gpu_model, r.cpus, r.memory_mib)
    return _shape(job)


def _shape(job: Job) -> ShapeKey:
    return tuple(
        (t.instances, t.resources.gpus, t.resources.gpu_model, t.resources.cpus, t.resources.memory_mib)
        for t in job.tasks
    )


def fit_instances(free_gpus: int, free_cpus: float, free_mem: int, req: Request) -> int:
    """How many instances of `req` fit into the given free amounts."""
    k = free_gpus // req.gpus if req.gpus > 0 else MANY
    if req.cpus > 0:
        # Capped before int(): a CPU request the spec takes (any positive float) can be so small
        # (5e-324) that the quotient is infinite, which int() refuses (the schedule loop failed
        # on every tick while such a job was queued).
        k = min(k, int(min((free_cpus + EPS) // req.cpus, MANY)))
    if req.memory_mib > 0:
        k = min(k, free_mem // req.memory_mib)
    return max(k, 0)


class NodeTable:
    """What depends only on the nodes tuple: names, readiness, healthy GPUs per model, topology,
    and the bucket index of the empty cluster. Read-only once built, so cycles can share it."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = nodes
        self.index_of = {n.name: i for i, n in enumerate(nodes)}
        self.ready = [n.state is NodeState.READY for n in nodes]
        self.is_gpu = [bool(n.gpus) for n in nodes]
        self.cpus = [float(n.cpus) for n in nodes]
        self.mem = [int(n.memory_mib) for n in nodes]
        self.free: list[dict[str, list[int]]] = []  # per node: model -> sorted healthy GPU indices
        self.gpu_model: list[dict[int, str]] = []  # per node: GPU index -> model (all GPUs)
        self.topo: list[dict[int, int] | None] = []  # per node: GPU index -> topology group
        self.unhealthy: list[frozenset[int]] = []
        models: set[str] = set()
        for n in nodes:
            by_model: dict[str, list[int]] = {}
            topo: dict[int, int] = {}
            for g in n.gpus:
                models.add(g.model)
                lst = by_model.setdefault(g.model, [])
                if g.healthy:
                    lst.append(g.index)
                if g.topology_group is not None:
                    topo[g.index] = g.topology_group
            for lst in by_model.values():
                lst.sort()
            self.free.append(by_model)
            self.gpu_model.append({g.index: g.model for g in n.gpus})
            self.topo.append(topo or None)
            self.unhealthy.append(frozenset(g.index for g in n.gpus if not g.healthy))
        self.models: tuple[str, ...] = tuple(sorted(models))
        self.model_rank = {m: r for r, m in enumerate(self.models)}
        self.node_models: list[tuple[str, ...]] = [tuple(sorted(d)) for d in self.free]
        self.cpu_nodes = [i for i, n in enumerate(nodes) if not n.gpus]
        # nodes whose GPUs are all one model indexed 0..n-1: running work is counted in bulk there
        self.single_model: list[str | None] = []
        self.dense_width: list[int] = []
        for n in nodes:
            dense = len(n.gpus) > 0 and sorted(g.index for g in n.gpus) == list(range(len(n.gpus)))
            one = dense and len({g.model for g in n.gpus}) == 1
            self.single_model.append(n.gpus[0].model if one else None)
            self.dense_width.append(len(n.gpus))
        width: dict[str, int] = dict.fromkeys(self.models, 0)
        for models_of in self.gpu_model:
            counts: dict[str, int] = {}
            for m in models_of.values():
                counts[m] = counts.get(m, 0) + 1
            for m, c in counts.items():
                width[m] = max(width[m], c)
        self.buckets: dict[str, list[list[int]]] = {m: [[] for _ in range(width[m] + 1)] for m in self.models}
        self.free_total: dict[str, int] = dict.fromkeys(self.models, 0)
        for i, by_model in enumerate(self.free):
            if self.ready[i]:
                for m, lst in by_model.items():
                    self.buckets[m][len(lst)].append(i)  # i ascends, so each bucket stays sorted
                    self.free_total[m] += len(lst)
        self.capacity = dict(self.free_total)  # healthy GPUs on ready nodes
        # eta_cpu's nodes that could ever take one instance of a request, per (GPUs, GPU model
        # constraint, CPUs, memory, CPU jobs on GPU nodes): read only from this table, so kept
        # with it across the cycles that share it (a few shapes, hundreds of nodes each)
        self.cpu_candidates: dict[tuple[int, str | None, float, int, bool], tuple[int, ...]] = {}


MEMO_SIZE = 2  # node tables (and occupied states) remembered between calls


class ClusterMemo:
    """What a `Scheduler` keeps between calls about the cluster, a pure cache that never changes a
    result: the NodeTables of the last nodes tuples, the free capacity their running sets left
    (Occupied), and their ClusterShapes. Each Scheduler owns one; nothing is shared between them."""

    def __init__(self) -> None:
        self.tables: list[NodeTable] = []  # most recent last
        self.occupied: list[Occupied] = []
        self.shapes: list[tuple[Sequence[Node], bool, ClusterShapes]] = []
        # the last difference of two running tuples (seqdiff.py), shared with the queue index
        self.running_diff = DiffMemo()

    def node_table(self, nodes: Sequence[Node]) -> NodeTable:
        """The NodeTable of `nodes`, reused while the caller passes the very same (immutable) tuple:
        the simulator and the control loop keep one nodes tuple until a node changes."""
        for table in self.tables:
            if table.nodes is nodes and isinstance(nodes, tuple):
                self.tables[:] = [*(t for t in self.tables if t is not table), table]
                return table
        table = NodeTable(nodes)
        self.tables[:] = [*self.tables[-(MEMO_SIZE - 1) :], table]
        return table

    def cluster_shapes(self, nodes: Sequence[Node], cpu_jobs_on_gpu_nodes: bool) -> ClusterShapes:
        """ClusterShapes of `nodes`, reused while the same nodes tuple comes back."""
        for seen, flag, shapes in self.shapes:
            if seen is nodes and flag == cpu_jobs_on_gpu_nodes and isinstance(nodes, tuple):
                return shapes
        shapes = ClusterShapes(nodes, cpu_jobs_on_gpu_nodes)
        self.shapes[:] = [*self.shapes[-1:], (nodes, cpu_jobs_on_gpu_nodes, shapes)]
        return shapes


def _bump(counts: dict[K, int], key: K, delta: int) -> None:
    """Add `delta` to a count, dropping it at zero (so the keys are exactly the nonzero counts)."""
    left = counts.get(key, 0) + delta
    if left:
        counts[key] = left
    else:
        counts.pop(key, None)


class RunningTotals:
    """GPUs held by running work per (group, model) and per (group, user), and what the preemption
    pre-check reads of it: preemptible jobs (not asked to stop) by (group, priority), those on
    borrowed quota by group, and how many jobs are asked to stop. Kept up to date between calls."""

    def __init__(self) -> None:
        self.by_group_model: dict[tuple[str, str], int] = {}
        self.by_user: dict[tuple[str, str], int] = {}
        self.preemptible = 0
        self.ranks: dict[tuple[str, int], int] = {}  # (group, priority) -> preemptible jobs
        self.lenders: dict[str, int] = {}  # group -> preemptible jobs on borrowed quota
        self.stopping = 0  # jobs marked stopping
        self.borrowed: dict[tuple[str, str], int] = {}  # GPUs per (group, model) of work marked borrowed

    def add(self, rj: RunningJob, per_model: dict[str, int], sign: int) -> None:
        job = rj.job
        group = job.group
        total = 0
        for m, n in per_model.items():
            _bump(self.by_group_model, (group, m), sign * n)
            total += n
            if rj.borrowed:
                _bump(self.borrowed, (group, m), sign * n)
        _bump(self.by_user, (group, job.user), sign * total)
        if rj.stopping:
            self.stopping += sign
        elif job.preemptible:
            self.preemptible += sign
            _bump(self.ranks, (group, int(job.priority)), sign)
            if rj.borrowed:
                _bump(self.lenders, group, sign)

    def copy(self) -> RunningTotals:
        out = RunningTotals()
        out.by_group_model = dict(self.by_group_model)
        out.by_user = dict(self.by_user)
        out.preemptible = self.preemptible
        out.ranks = dict(self.ranks)
        out.lenders = dict(self.lenders)
        out.stopping = self.stopping
        out.borrowed = dict(self.borrowed)
        return out


class Occupied:
    """Free capacity of a NodeTable with a set of running jobs subtracted, kept between calls and
    brought up to date by the difference in running jobs (compared by object identity, with strong
    references held, so an id is never confused with a new object's).

    Per-node dicts are replaced, never changed in place, and cycles copy the lists they change, so
    a ClusterState built from an earlier version is unaffected. Anything unexpected (a GPU held
    twice, an unknown or unhealthy GPU index) marks it unusable and the caller rebuilds from
    scratch, which gives the same result."""

    def __init__(self, table: NodeTable) -> None:
        self.table = table
        self.free_cpus = list(table.cpus)
        self.free_mem = list(table.mem)
        self.free = list(table.free)
        self.buckets = {m: [lst[:] for lst in b] for m, b in table.buckets.items()}
        self.free_total = dict(table.free_total)
        self.jobs: dict[int, RunningJob] = {}  # id(running job) -> the job (held, so ids stay unique)
        self.held: dict[int, dict[str, int]] = {}  # id(running job) -> GPUs per model
        self.totals = RunningTotals()
        self.ok = True
        # The tuple the last usable sync was given and its answer: a caller that hands the very
        # same tuple again (the simulator, when nothing started, ended or stopped since: a tuple
        # cannot change) gets the answer without the difference over every running job. The
        # answer's (job, GPUs per model) pairs are kept from call to call, so that a cycle does
        # not make one new pair per running job (a copy of the list is handed out).
        self.last: tuple[RunningJob, ...] | None = None
        self.last_pairs: list[tuple[RunningJob, dict[str, int]]] = []

    def sync(
        self, running: Sequence[RunningJob], diffs: DiffMemo | None = None
    ) -> list[tuple[RunningJob, dict[str, int]]] | None:
        """Make the running set exactly `running`; each job with its GPUs per model (a new list,
        in `running`'s order), or None if unusable.
        `diffs`: where the difference of the two running tuples is worked out (the Scheduler's,
        shared with its queue index, which diffs the same two tuples)."""
        if running is self.last and self.ok:
            return list(self.last_pairs)
        last = self.last if self.ok else None
        self.last = None  # the state moves off the kept tuple's (a list is not kept: see below)
        if last is not None and isinstance(running, tuple):
            diff = appended_diff(last, running) if diffs is None else diffs.diff(last, running)
            if diff is not None and self._all_new(running[diff[1] :]):
                return self._sync_appended(last, running, diff[0], running[diff[1] :])
        # A set of ids, not an id -> job dict: the new jobs are picked out of `running` (at C
        # speed), so a cycle with a few changes among hundreds of running jobs builds one
        # container of them instead of two (about half the cost of this difference).
        keys = list(map(id, running))
        current = set(keys)
        if len(current) != len(running):
            self.ok = False  # the same object twice
        touched: set[int] = set()
        jobs, held = self.jobs, self.held
        for key in jobs.keys() - current:
            rj = jobs.pop(key)
            per_model = held.pop(key)
            self._apply(rj, -1, touched)
            self.totals.add(rj, per_model, -1)
        new = current.difference(jobs)
        for rj in compress(running, map(new.__contains__, keys)) if new else ():
            key = id(rj)
            if key in jobs:
                continue  # the same object twice (already marked unusable)
            jobs[key] = rj
            per_model = held[key] = self._apply(rj, 1, touched)
            self.totals.add(rj, per_model, 1)
        if not self.ok:
            return None
        found = list(zip(running, map(held.__getitem__, keys), strict=True))
        if isinstance(running, tuple):  # (a list could change under the same identity)
            self.last, self.last_pairs = running, found
            return list(found)
        return found

    def _all_new(self, added: tuple[RunningJob, ...]) -> bool:
        """None of `added` is held, and none is there twice."""
        ids = [id(rj) for rj in added]
        return len(set(ids)) == len(ids) and not any(k in self.jobs for k in ids)

    def _sync_appended(
        self,
        last: tuple[RunningJob, ...],
        running: tuple[RunningJob, ...],
        gone: list[int],
        added: tuple[RunningJob, ...],
    ) -> list[tuple[RunningJob, dict[str, int]]] | None:
        """`sync` when `running` is the last tuple without the jobs at positions `gone` and with
        `added` appended (the usual step: seqdiff.py), without a set difference over every
        running job. The same state and answer as that difference."""
        jobs, held = self.jobs, self.held
        touched: set[int] = set()
        found = list(self.last_pairs)
        for pos in reversed(gone):
            rj = last[pos]
            key = id(rj)
            del jobs[key]
            per_model = held.pop(key)
            del found[pos]
            self._apply(rj, -1, touched)
            self.totals.add(rj, per_model, -1)
        for rj in added:
            key = id(rj)
            jobs[key] = rj
            per_model = held[key] = self._apply(rj, 1, touched)
            self.totals.add(rj, per_model, 1)
            found.append((rj, per_model))
        if not self.ok:
            return None
        self.last, self.last_pairs = running, found
        return list(found)

    def _apply(self, rj: RunningJob, sign: int, touched: set[int]) -> dict[str, int]:
        t = self.table
        per_model: dict[str, int] = {}
        for inst in rj.allocation.instances:
            i = t.index_of.get(inst.node)
            if i is None:
                continue
            self.free_cpus[i] -= sign * inst.cpus
            self.free_mem[i] -= sign * inst.memory_mib
            if not inst.gpu_indices:
                continue
            if i not in touched:
                self.free[i] = {m: lst[:] for m, lst in self.free[i].items()}
                touched.add(i)
            models = t.gpu_model[i]
            for g in inst.gpu_indices:
                m = models.get(g)
                if m is None or g in t.unhealthy[i]:
                    self.ok = False
                    continue
                per_model[m] = per_model.get(m, 0) + 1
                lst = self.free[i][m]
                before = len(lst)
                pos = bisect_left(lst, g)
                present = pos < before and lst[pos] == g
                if sign > 0 and present:
                    del lst[pos]
                elif sign < 0 and not present:
                    lst.insert(pos, g)
                else:
                    self.ok = False  # held twice, or given back while free
                    continue
                if t.ready[i]:
                    b = self.buckets[m]
                    del b[before][bisect_left(b[before], i)]
                    insort(b[len(lst)], i)
                    self.free_total[m] += len(lst) - before
        return per_model


class ClusterState:
    """Free capacity of every node, updated as the cycle places (and test-releases) work.

    Starts from the shared NodeTable; a node's free-GPU lists are copied on its first change."""

    def __init__(self, nodes: Sequence[Node], memo: ClusterMemo | None = None) -> None:
        self.memo = memo if memo is not None else ClusterMemo()  # None: nothing kept between calls
        t = self.table = self.memo.node_table(nodes)
        self.nodes = nodes
        self.index_of, self.ready, self.is_gpu = t.index_of, t.ready, t.is_gpu
        self.gpu_model, self.topo, self.unhealthy = t.gpu_model, t.topo, t.unhealthy
        self.models, self.model_rank, self.node_models = t.models, t.model_rank, t.node_models
        self.cpu_nodes, self.capacity = t.cpu_nodes, t.capacity
        self.free_cpus = list(t.cpus)
        self.free_mem = list(t.mem)
        self.free: list[dict[str, list[int]]] = list(t.free)  # shared until _own() copies a node
        self._owned: set[int] = set()
        self.buckets: dict[str, list[list[int]]] = {}
        self.free_total: dict[str, int] = dict.fromkeys(self.models, 0)
        self.free_sum = 0  # free healthy GPUs on ready nodes, all models
        self.version = 0  # bumped whenever the GPU buckets or free totals change (memo keys)

    def _own(self, i: int) -> dict[str, list[int]]:
        """Node i's free lists, copied from the shared table before the first change."""
        if i not in self._owned:
            self.free[i] = {m: lst[:] for m, lst in self.free[i].items()}
            self._owned.add(i)
        return self.free[i]

    def occupy_running(
        self, running: Sequence[RunningJob]
    ) -> tuple[list[tuple[RunningJob, dict[str, int]]], RunningTotals]:
        """Subtract the running jobs and build the index; each running job with its GPUs per
        model (in `running`'s order), and totals per group and user.

        Reuses the previous call's Occupied (same NodeTable) and applies only the difference."""
        memo = self.memo
        found = [o for o in memo.occupied if o.table is self.table]
        occ = found[0] if found else Occupied(self.table)
        others = [o for o in memo.occupied if o is not occ]
        pairs = occ.sync(running, memo.running_diff)
        if pairs is None:
            memo.occupied[:] = others
            held = self.occupy_all([rj.allocation for rj in running])
            self.build_index()
            totals = RunningTotals()
            pairs = list(zip(running, held, strict=True))
            for rj, per_model in pairs:
                totals.add(rj, per_model, 1)
            return pairs, totals
        memo.occupied[:] = [*others[-(MEMO_SIZE - 1) :], occ]
        self.free_cpus = list(occ.free_cpus)
        self.free_mem = list(occ.free_mem)
        self.free = list(occ.free)
        self._owned = set()
        self.buckets = {m: [lst[:] for lst in b] for m, b in occ.buckets.items()}
        self.free_total = dict(occ.free_total)
        self.free_sum = sum(self.free_total.values())
        self.version += 1
        return pairs, occ.totals.copy()

    def build_index(self) -> None:
        """Index ready nodes by (model, free count): the empty cluster's index, with the nodes that
        running work changed moved. Call after running work is subtracted."""
        t = self.table
        self.buckets = {m: [lst[:] for lst in b] for m, b in t.buckets.items()}
        self.free_total = dict(t.free_total)
        for i in sorted(self._owned):
            if not self.ready[i]:
                continue
            for m, lst in self.free[i].items():
                before, after = len(t.free[i][m]), len(lst)
                if before != after:
                    b = self.buckets[m]
                    del b[before][bisect_left(b[before], i)]
                    insort(b[after], i)
                    self.free_total[m] += after - before
        self.free_sum = sum(self.free_total.values())
        self.version += 1

    # -- mutation -------------------------------------------------------------------------------
    def _move(self, i: int, model: str, before: int, after: int) -> None:
        if not self.ready[i] or before == after:
            return
        b = self.buckets[model]
        old = b[before]
        del old[bisect_left(old, i)]
        insort(b[after], i)
        self.free_total[model] += after - before
        self.free_sum += after - before
        self.version += 1

    def take(self, i: int, model: str | None, gpu_indices: Sequence[int], cpus: float, mem: int) -> None:
        self.free_cpus[i] -= cpus
        self.free_mem[i] -= mem
        if model is None or not gpu_indices:
            return
        lst = self._own(i)[model]
        before = len(lst)
        for g in gpu_indices:
            del lst[bisect_left(lst, g)]
        self._move(i, model, before, len(lst))

    def give(self, i: int, model: str | None, gpu_indices: Sequence[int], cpus: float, mem: int) -> None:
        self.free_cpus[i] += cpus
        self.free_mem[i] += mem
        if model is None or not gpu_indices:
            return
        lst = self._own(i)[model]
        before = len(lst)
        for g in gpu_indices:
            insort(lst, g)
        self._move(i, model, before, len(lst))

    def occupy(self, allocation: Allocation, sign: int = 1) -> dict[str, int]:
        """Subtract (sign=1) or add back (sign=-1) a running allocation; GPUs used per model."""
        per_model: dict[str, int] = {}
        for inst in allocation.instances:
            i = self.index_of.get(inst.node)
            if i is None:
                continue  # node no longer exists: nothing to hold
            models = self.gpu_model[i]
            groups: dict[str, list[int]] = {}
            for g in inst.gpu_indices:
                m = models.get(g)
                if m is not None:
                    groups.setdefault(m, []).append(g)
            self.free_cpus[i] -= sign * inst.cpus
            self.free_mem[i] -= sign * inst.memory_mib
            for m, idxs in groups.items():
                per_model[m] = per_model.get(m, 0) + len(idxs)
                lst = self._own(i)[m]
                before = len(lst)
                if sign > 0:
                    drop = set(idxs)
                    lst[:] = [g for g in lst if g not in drop]
                else:
                    for g in idxs:
                        if g not in lst and g not in self.unhealthy[i]:
                            insort(lst, g)
                if self.buckets:
                    self._move(i, m, before, len(lst))
        return per_model

    def note_free_cpus(self, allocation: Allocation, into: dict[int, float]) -> None:
        """Keep the free CPUs of the allocation's nodes in `into` (the first value seen per node):
        a release and its restore through `occupy` are not exact in floating point (8 - 2.3 - 1.6
        + 1.6 is not 8 - 2.3), and a search that restores must leave the cycle's later placements
        the CPUs they would have found without it (put_free_cpus). Memory is whole MiB: exact."""
        for inst in allocation.instances:
            i = self.index_of.get(inst.node)
            if i is not None and i not in into:
                into[i] = self.free_cpus[i]

    def put_free_cpus(self, saved: Mapping[int, float]) -> None:
        for i, cpus in saved.items():
            self.free_cpus[i] = cpus

    def occupy_all(self, allocations: Sequence[Allocation]) -> list[dict[str, int]]:
        """Subtract many running allocations at once (before build_index); GPUs used per model each.

        One pass that collects held GPU indices per node, then rebuilds each touched free list."""
        held: dict[int, set[int]] = {}
        out: list[dict[str, int]] = []
        single, width = self.table.single_model, self.table.dense_width
        index_of, gpu_model, free_cpus, free_mem = (
            self.index_of,
            self.gpu_model,
            self.free_cpus,
            self.free_mem,
        )
        for allocation in allocations:
            per_model: dict[str, int] = {}
            for inst in allocation.instances:
                i = index_of.get(inst.node)
                if i is None:
                    continue  # node no longer exists: nothing to hold
                free_cpus[i] -= inst.cpus
                free_mem[i] -= inst.memory_mib
                if inst.gpu_indices:
                    h = held.setdefault(i, set())
                    only = single[i]
                    idx = inst.gpu_indices
                    if only is not None and min(idx) >= 0 and max(idx) < width[i]:
                        per_model[only] = per_model.get(only, 0) + len(idx)  # one model: count in bulk
                        h.update(idx)
                        continue
                    models = gpu_model[i]
                    for g in inst.gpu_indices:
                        m = models.get(g)
                        if m is not None:
                            per_model[m] = per_model.get(m, 0) + 1
                            h.add(g)
            out.append(per_model)
        for i, h in held.items():
            for lst in self._own(i).values():
                lst[:] = [g for g in lst if g not in h]
        return out

    def choose_gpus(self, i: int, model: str, count: int) -> tuple[int, ...]:
        """Pick `count` free GPUs of `model` on node i, from one topology group when one can hold them
        (the group with the fewest free GPUs that still fits: best-fit inside the node)."""
        lst = self.free[i][model]
        topo = self.topo[i]
        if topo is None or count <= 1:
            return tuple(lst[:count])
        by_group: dict[int, list[int]] = {}
        for g in lst:
            by_group.setdefault(topo.get(g, -1), []).append(g)
        fitting = [(len(v), k) for k, v in by_group.items() if len(v) >= count]
        if fitting:
            _, key = min(fitting)
            return tuple(by_group[key][:count])
        # no single group holds them: take whole groups, largest first, to span as few as possible
        picked: list[int] = []
        for _, key in sorted(((len(v), k) for k, v in by_group.items()), key=lambda t: (-t[0], t[1])):
            picked.extend(by_group[key][: count - len(picked)])
            if len(picked) == count:
                break
        return tuple(sorted(picked))

    # -- summaries --------------------------------------------------------------------------------
    def largest_block(self, model: str) -> int:
        b = self.buckets.get(model, [])
        for f in range(len(b) - 1, 0, -1):
            if b[f]:
                return f
        return 0

    def too_small(self, models: tuple[str, ...], total: int, widest: int) -> bool:
        """Cheap test that `total` GPUs over `models` (`widest` on one node) cannot fit the free
        capacity at all: too few free GPUs, or no node with a block as large as one instance."""
        if sum(self.free_total.get(m, 0) for m in models) < total:
            return True
        return all(self.largest_block(m) < widest for m in models)


class ClusterShapes:
    """Distinct shapes of the nodes as if empty, to tell whether a job could ever fit."""

    def __init__(self, nodes: Iterable[Node], cpu_jobs_on_gpu_nodes: bool = False) -> None:
        gpu_shapes: dict[str, set[tuple[int, float, int]]] = {}
        totals: dict[str, int] = {}
        cpu_shapes: set[tuple[float, int]] = set()
        for n in nodes:
            counts: dict[str, int] = {}
            for g in n.gpus:
                counts[g.model] = counts.get(g.model, 0) + 1
            for m, c in counts.items():
                gpu_shapes.setdefault(m, set()).add((c, n.cpus, n.memory_mib))
                totals[m] = totals.get(m, 0) + c
            if not n.gpus or cpu_jobs_on_gpu_nodes:
                cpu_shapes.add((n.cpus, n.memory_mib))
        self.gpu_shapes = gpu_shapes
        self.totals = totals
        self.cpu_shapes = cpu_shapes
        self._cache: dict[ShapeKey, tuple[Reason, ...]] = {}

    def reasons(self, job: Job, key: ShapeKey | None = None) -> tuple[Reason, ...]:
        key = shape_key(job) if key is None else key
        hit = self._cache.get(key)
        if hit is None:
            hit = self._reasons(job)
            self._cache[key] = hit
        return hit

    def _reasons(self, job: Job) -> tuple[Reason, ...]:
        out: list[Reason] = []
        if not job.tasks or any(t.instances <= 0 for t in job.tasks):
            out.append(Reason("invalid_job", "admission", f"job {job.id} has no task instances to run"))
        for t in job.tasks:
            r = t.resources
            models = r.gpu_models
            if r.gpus <= 0:
                if not self.cpu_shapes:  # the true reason, not "no CPU node is that large"
                    out.append(
                        Reason(
                            "no_cpu_nodes",
                            "filter:cpu_memory",
                            f"task {t.role} asks for no GPU; this cluster has no node that takes "
                            "CPU-only work (no CPU nodes, and CPU-only work is not placed on GPU nodes "
                            "unless an admin sets CORRAL_CPU_JOBS_ON_GPU_NODES=true)",
                        )
                    )
                    continue
                if not any(c + EPS >= r.cpus and m >= r.memory_mib for c, m in self.cpu_shapes):
                    out.append(
                        Reason(
                            "instance_too_large",
                            "filter:cpu_memory",
                            f"task {t.role} needs {plural(r.cpus, 'CPU')} and {r.memory_mib} MiB on one "
                            "CPU node; no node that takes CPU-only work is that large",
                        )
                    )
                continue
            known = set(self.gpu_shapes) if models is None else models & set(self.gpu_shapes)
            if not known:
                want = r.gpu_model or "any"
                out.append(
                    Reason(
                        "unknown_gpu_model",
                        "filter:gpu_model",
                        f"task {t.role} asks for GPU model {want}; this cluster has "
                        f"{', '.join(sorted(self.gpu_shapes)) or 'no GPUs'}",
                    )
                )
                continue
            fits = any(
                g >= r.gpus and c + EPS >= r.cpus and mem >= r.memory_mib
                for m in known
                for g, c, mem in self.gpu_shapes[m]
            )
            if not fits:
                # the GPUs fit somewhere: name what falls short there (CPUs or memory), not the GPUs
                enough = [(c, mem) for m in known for g, c, mem in self.gpu_shapes[m] if g >= r.gpus]
                if enough:
                    have = (
                        f"nodes with {plural(r.gpus, 'such GPU')} have at most "
                        f"{plural(max(c for c, _ in enough), 'CPU')} and {max(mem for _, mem in enough)} MiB"
                    )
                else:
                    biggest = max(g for m in known for g, _, _ in self.gpu_shapes[m])
                    have = f"the largest node has {plural(biggest, 'such GPU')}"
                out.append(
                    Reason(
                        "instance_too_large",
                        "filter:gpu_free",
                        f"task {t.role} needs {gpus_of(r.gpus, '|'.join(sorted(known)))}, "
                        f"{plural(r.cpus, 'CPU')} and {r.memory_mib} MiB on one node; {have}",
                    )
                )
                continue
            total = sum(self.totals[m] for m in known)
            if t.instances * r.gpus > total:
                out.append(
                    Reason(
                        "cluster_too_small",
                        "filter:gpu_free",
                        f"task {t.role} needs {plural(t.instances * r.gpus, 'GPU')} in all; "
                        f"the cluster has {total}",
                    )
                )
        return tuple(out)


def check_fits_anywhere(
    job: Job, nodes: Sequence[Node], *, cpu_jobs_on_gpu_nodes: bool = False
) -> tuple[Reason, ...]:
    """Why `job` could never run on `nodes` even if they were all empty; empty = it could fit.
    Pass the profile's `cpu_jobs_on_gpu_nodes` so the answer matches what `schedule` would do.

    Node state is ignored (a down node may come back); GPU health too."""
    return ClusterShapes(nodes, cpu_jobs_on_gpu_nodes=cpu_jobs_on_gpu_nodes).reasons(job)
