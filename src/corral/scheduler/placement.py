"""Placement: where a job's instances go, all of them or none (gang).

Per task, instances go first onto nodes this job already uses (fewest nodes), then onto the best
node that holds all remaining instances, else onto the node that holds the most of them, and so
on. "Best" is the profile's filters and weighted scorers. For the plain best-fit and spread
profiles the bucket index in ClusterState finds the same node as the scan without visiting every
node: a node wins by (score, then lowest node index, then model name) either way, and
tests/scheduler/test_index_equivalence.py checks both paths agree.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from corral.scheduler.cluster import ClusterState, Request, fit_instances
from corral.scheduler.plugins import FILTERS, SCORERS
from corral.scheduler.profiles import Profile
from corral.scheduler.types import InstancePlacement, Job, Resources

Pick = tuple[int, "str | None", int]  # node index, GPU model (None: CPU-only), instances


@dataclass(slots=True)
class Placed:
    instances: list[InstancePlacement]
    undo: list[tuple[int, str | None, tuple[int, ...], float, int]]
    gpus_by_model: dict[str, int]

    def __init__(  # written out, as in types.py (one per placement)
        self,
        instances: list[InstancePlacement],
        undo: list[tuple[int, str | None, tuple[int, ...], float, int]],
        gpus_by_model: dict[str, int],
    ) -> None:
        self.instances = instances
        self.undo = undo
        self.gpus_by_model = gpus_by_model


class Placer:
    def __init__(self, st: ClusterState, profile: Profile, rng: random.Random) -> None:
        self.st = st
        self.rng = rng
        self.filters = [FILTERS[name] for name in profile.filters]
        self.scorers = [(SCORERS[name], w) for name, w in profile.scorers]
        self.indexed = profile.indexed
        self.spread = profile.placement == "spread"
        self.cpu_on_gpu = profile.cpu_jobs_on_gpu_nodes
        self._models: dict[str | None, frozenset[str] | None] = {}  # parsed GPU-model constraints

    # -- public -------------------------------------------------------------------------------------
    def request(self, res: Resources, allowed: frozenset[str] | None) -> tuple[Request, tuple[str, ...]]:
        """The instance request and the cluster models it may use (sorted), quota limits applied."""
        models = self._models.get(res.gpu_model)
        if models is None and res.gpu_model not in self._models:
            models = self._models[res.gpu_model] = res.gpu_models
        if allowed is not None:
            models = allowed if models is None else models & allowed
        req = Request(res.gpus, models, res.cpus, res.memory_mib)
        if res.gpus <= 0:
            return req, ()
        return req, tuple(m for m in self.st.models if models is None or m in models)

    def place(self, job: Job, allowed: frozenset[str] | None = None) -> Placed | None:
        """Place every instance of `job` or nothing; state is updated only on success. What the
        job must avoid is held back while it is placed and given back afterwards."""
        if not job.avoid:
            return self._place(job, allowed)
        held = self._withhold(job.avoid)
        try:
            return self._place(job, allowed)
        finally:
            for i, model, gpus, cpus, mem in reversed(held):
                self.st.give(i, model, gpus, cpus, mem)

    def _withhold(
        self, avoid: tuple[tuple[str, int | None], ...]
    ) -> list[tuple[int, str | None, tuple[int, ...], float, int]]:
        """Take the free GPUs (and, for a whole node, its CPUs and memory) the job must avoid."""
        st = self.st
        held: list[tuple[int, str | None, tuple[int, ...], float, int]] = []
        for node, gpu in avoid:
            i = st.index_of.get(node)
            if i is None:
                continue
            if gpu is None:
                for model, lst in list(st.free[i].items()):
                    if lst:
                        held.append((i, model, tuple(lst), 0.0, 0))
                        st.take(i, model, tuple(lst), 0.0, 0)
                cpus, mem = max(0.0, st.free_cpus[i]), max(0, st.free_mem[i])
                held.append((i, None, (), cpus, mem))
                st.take(i, None, (), cpus, mem)
                continue
            gpu_model = st.gpu_model[i].get(gpu)
            if gpu_model is not None and gpu in st.free[i].get(gpu_model, ()):
                held.append((i, gpu_model, (gpu,), 0.0, 0))
                st.take(i, gpu_model, (gpu,), 0.0, 0)
        return held

    def _place(self, job: Job, allowed: frozenset[str] | None) -> Placed | None:
        st = self.st
        placed = Placed([], [], {})
        used: list[tuple[int, str | None]] = []
        for task in job.tasks:
            req, cands = self.request(task.resources, allowed)
            if req.gpus > 0 and sum(st.free_total[m] for m in cands) < task.instances * req.gpus:
                self.rollback(placed)
                return None
            remaining, index = task.instances, 0
            while remaining > 0:
                pick = self._on_used(used, req, cands, remaining)
                if pick is None:
                    pick = self.find_best(req, cands, remaining)
                if pick is None:
                    pick = self.find_most(req, cands)
                if pick is None:
                    self.rollback(placed)
                    return None
                i, model, k = pick
                for _ in range(k):
                    gpus = st.choose_gpus(i, model, req.gpus) if model is not None else ()
                    st.take(i, model, gpus, req.cpus, req.memory_mib)
                    placed.undo.append((i, model, gpus, req.cpus, req.memory_mib))
                    placed.instances.append(
                        InstancePlacement(task.role, index, st.nodes[i].name, gpus, req.cpus, req.memory_mib)
                    )
                    index += 1
                if model is not None:
                    placed.gpus_by_model[model] = placed.gpus_by_model.get(model, 0) + k * req.gpus
                remaining -= k
                if (i, model) not in used:
                    used.append((i, model))
        return placed

    def rollback(self, placed: Placed) -> None:
        for i, model, gpus, cpus, mem in reversed(placed.undo):
            self.st.give(i, model, gpus, cpus, mem)
        placed.undo.clear()

    # -- node choice ----------------------------------------------------------------------------------
    def _passes(self, i: int, req: Request) -> bool:
        return all(f(self.st, i, req, self.cpu_on_gpu) is None for f in self.filters)

    def _models_on(self, i: int, req: Request) -> Sequence[str | None]:
        if req.gpus <= 0:
            return (None,)
        models = req.models
        return [m for m in self.st.node_models[i] if models is None or m in models]

    def _fit(self, i: int, model: str | None, req: Request) -> int:
        st = self.st
        free = len(st.free[i][model]) if model is not None else 0
        return fit_instances(free, st.free_cpus[i], st.free_mem[i], req)

    def _score(self, i: int, model: str | None, req: Request, k: int) -> float:
        return sum(w * f(self.st, i, model, req, k, self.rng) for f, w in self.scorers)

    def _on_used(
        self, used: list[tuple[int, str | None]], req: Request, cands: tuple[str, ...], remaining: int
    ) -> Pick | None:
        for i, model in used:
            if (model is None) != (req.gpus <= 0) or (model is not None and model not in cands):
                continue
            if not self._passes(i, req):
                continue
            fit = self._fit(i, model, req)
            if fit >= 1:
                return i, model, min(fit, remaining)
        return None

    def _scan_nodes(self, req: Request) -> Sequence[int]:
        """Nodes the scan visits: all of them, except that with the index on, CPU-only work skips
        GPU nodes the node_kind filter would reject anyway."""
        if self.indexed and req.gpus <= 0 and not self.cpu_on_gpu:
            return self.st.cpu_nodes
        return range(len(self.st.nodes))

    def find_best(self, req: Request, cands: tuple[str, ...], k: int) -> Pick | None:
        """The best node that holds `k` instances."""
        if self.indexed and req.gpus > 0:
            return self._index_best(req, cands, k)
        best: Pick | None = None
        best_score = 0.0
        for i in self._scan_nodes(req):
            if not self._passes(i, req):
                continue
            for model in self._models_on(i, req):
                if self._fit(i, model, req) < k:
                    continue
                score = self._score(i, model, req, k)
                if best is None or score > best_score:
                    best, best_score = (i, model, k), score
        return best

    def find_most(self, req: Request, cands: tuple[str, ...]) -> Pick | None:
        """The node that holds the most instances (ties: score, then lowest index)."""
        if self.indexed and req.gpus > 0:
            return self._index_most(req, cands)
        best: Pick | None = None
        best_key = (0, 0.0)
        for i in self._scan_nodes(req):
            if not self._passes(i, req):
                continue
            for model in self._models_on(i, req):
                fit = self._fit(i, model, req)
                if fit < 1:
                    continue
                key = (fit, self._score(i, model, req, fit))
                if best is None or key > best_key:
                    best, best_key = (i, model, fit), key
        return best

    # -- index paths (same answers as the scans above for bestfit/spread) ---------------------------
    def _index_best(self, req: Request, cands: tuple[str, ...], k: int) -> Pick | None:
        st = self.st
        need = k * req.gpus
        width = max((len(st.buckets[m]) - 1 for m in cands), default=-1)
        frees = range(width, need - 1, -1) if self.spread else range(need, width + 1)
        free_cpus, free_mem = st.free_cpus, st.free_mem
        for f in frees:
            best_i, best_m = -1, ""
            for m in cands:
                b = st.buckets[m]
                if f >= len(b):
                    continue
                for i in b[f]:
                    if best_i >= 0 and i >= best_i:
                        break
                    if fit_instances(f, free_cpus[i], free_mem[i], req) >= k:
                        best_i, best_m = i, m
                        break
            if best_i >= 0:
                return best_i, best_m, k
        return None

    def _index_most(self, req: Request, cands: tuple[str, ...]) -> Pick | None:
        st = self.st
        g = req.gpus
        width = max((len(st.buckets[m]) - 1 for m in cands), default=-1)
        best: tuple[int, float, int, int] | None = None  # fit, score, -index, -model rank
        best_m = ""
        for f in range(width, g - 1, -1):
            if best is not None and f // g < best[0]:
                break
            for m in cands:
                b = st.buckets[m]
                if f >= len(b):
                    continue
                rank = -st.model_rank[m]
                for i in b[f]:
                    fit = fit_instances(f, st.free_cpus[i], st.free_mem[i], req)
                    if fit >= 1:
                        rest = float(f - fit * g)
                        key = (fit, rest if self.spread else -rest, -i, rank)
                        if best is None or key > best:
                            best, best_m = key, m
                    if fit == f // g:
                        break  # later nodes in this bucket tie on score and lose on index
        if best is None:
            return None
        return -best[2], best_m, best[0]
