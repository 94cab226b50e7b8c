"""What the cycle needs to know about a job on one cluster (`JobInfo`), worked out once per job and
kept across cycles by the `Scheduler` that owns the `JobKinds` memo."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import count

from corral.scheduler.cluster import ClusterShapes, ClusterState, shape_key
from corral.scheduler.types import Job, Reason

# (job id, GPUs, usable models, runtime estimate or None: `default_runtime_s`)
Waiting = tuple[str, int, tuple[str, ...], float | None]

MEMO_MAX = 200_000  # jobs (and kinds) remembered before a memo starts afresh


def job_models(st: ClusterState, job: Job) -> tuple[str, ...]:
    """Cluster GPU models any GPU task of the job may use."""
    out: set[str] = set()
    for t in job.tasks:
        if t.resources.gpus > 0:
            allowed = t.resources.gpu_models
            out.update(m for m in st.models if allowed is None or m in allowed)
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What the cycle needs about a job, computed once."""

    total: int  # GPUs in all
    models: tuple[str, ...]  # cluster GPU models its GPU tasks may use
    sig: tuple[object, ...]  # its tasks' shape: jobs with equal shapes fit or fail alike
    widest: int  # most GPUs one instance needs
    never: tuple[Reason, ...]  # why it can never fit this cluster (empty: it could)
    model_set: frozenset[str]  # `models` as a set (reservations are keyed by it)
    # Small ints standing for tuples of fields (equal tuples, equal ints; see JobKinds.kind_id):
    # cheap keys
    fit_id: int  # (total, widest, models): what the cheap capacity test reads
    rank_id: int  # the same with group, priority, preemptible: the preemption pre-check and quota admission
    admit_id: int  # the same with group and preemptible: what quota admission reads too
    search_id: int  # (sig, group, priority, preemptible): what a preemption search reads
    eta: Waiting  # what the estimated start reads (its models equal job_models(st, job))

    def __init__(  # written out, as in types.py (one per job)
        self,
        total: int,
        models: tuple[str, ...],
        sig: tuple[object, ...],
        widest: int,
        never: tuple[Reason, ...],
        model_set: frozenset[str],
        fit_id: int,
        rank_id: int,
        admit_id: int,
        search_id: int,
        eta: Waiting,
    ) -> None:
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "sig", sig)
        object.__setattr__(self, "widest", widest)
        object.__setattr__(self, "never", never)
        object.__setattr__(self, "model_set", model_set)
        object.__setattr__(self, "fit_id", fit_id)
        object.__setattr__(self, "rank_id", rank_id)
        object.__setattr__(self, "admit_id", admit_id)
        object.__setattr__(self, "search_id", search_id)
        object.__setattr__(self, "eta", eta)


InfoMemo = dict[int, tuple[Job, JobInfo]]  # id(job) -> (the job, held so the id stays unique, info)


class JobKinds:
    """A Scheduler's memo of JobInfo, kept across cycles: JobInfo depends only on the job and the
    cluster's shapes, so it is reused while the caller passes the very same Job objects and nodes
    tuple (the simulator and the control loop do). Kinds of job are interned as small ints."""

    def __init__(self) -> None:
        self._infos: list[tuple[ClusterShapes, InfoMemo]] = []  # the last two clusters
        self._model_sets: dict[tuple[str, ...], frozenset[str]] = {}  # one set per model tuple
        self._kind_ids: dict[tuple[object, ...], int] = {}
        self._next_kind = count()  # never reset, so an id never stands for two kinds after a clear
        self._kinds: dict[tuple[object, ...], tuple[int, int, int, int]] = {}  # kind -> its four ids

    def memo_for(self, shapes: ClusterShapes) -> InfoMemo:
        for seen, memo in self._infos:
            if seen is shapes:
                if len(memo) > MEMO_MAX:
                    memo.clear()
                return memo
        memo = {}
        self._infos[:] = [*self._infos[-1:], (shapes, memo)]
        return memo

    def model_set(self, models: tuple[str, ...]) -> frozenset[str]:
        found = self._model_sets.get(models)
        if found is None:
            found = self._model_sets[models] = frozenset(models)
        return found

    def kind_id(self, kind: tuple[object, ...]) -> int:
        """A small int for `kind`, the same for equal kinds (dict keys hash faster than tuples)."""
        found = self._kind_ids.get(kind)
        if found is None:
            if len(self._kind_ids) > MEMO_MAX:
                self._kind_ids.clear()
            found = self._kind_ids[kind] = next(self._next_kind)
        return found

    def kind_ids(
        self, sig: tuple[object, ...], models: tuple[str, ...], total: int, widest: int, job: Job
    ) -> tuple[int, int, int, int]:
        """(fit, rank, admit, search) ids of a job (see JobInfo), looked up once per kind of job."""
        kind = (sig, models, job.group, job.priority, job.preemptible)
        found = self._kinds.get(kind)
        if found is None:
            if len(self._kinds) > MEMO_MAX:
                self._kinds.clear()
            kind_id = self.kind_id
            fit_id = kind_id((total, widest, models))
            priority = int(job.priority)
            found = self._kinds[kind] = (
                fit_id,
                kind_id((fit_id, job.group, priority, job.preemptible)),
                kind_id((fit_id, job.group, job.preemptible)),
                kind_id((sig, job.group, priority, job.preemptible)),
            )
        return found


class JobInfos:
    """JobInfo of jobs on one cycle's cluster (from the Scheduler's memo when known)."""

    def __init__(self, kinds: JobKinds, shapes: ClusterShapes, st: ClusterState) -> None:
        self.kinds, self.shapes, self.st = kinds, shapes, st
        self.memo = kinds.memo_for(shapes)
        self._models: dict[tuple[str | None, ...], tuple[str, ...]] = {}  # GPU constraints -> models

    def known(self, job: Job) -> JobInfo | None:
        """The job's JobInfo if it was worked out already (no work done here)."""
        hit = self.memo.get(id(job))
        return hit[1] if hit is not None and hit[0] is job else None

    def __call__(self, job: Job) -> JobInfo:
        hit = self.memo.get(id(job))
        if hit is not None and hit[0] is job:
            return hit[1]
        sig = shape_key(job)
        widest = max((t.resources.gpus for t in job.tasks), default=0)
        constraints = tuple(t.resources.gpu_model for t in job.tasks if t.resources.gpus > 0)
        models = self._models.get(constraints)
        if models is None:
            models = self._models[constraints] = job_models(self.st, job)
        total = job.total_gpus
        fit_id, rank_id, admit_id, search_id = self.kinds.kind_ids(sig, models, total, widest, job)
        info = JobInfo(
            total,
            models,
            sig,
            widest,
            self.shapes.reasons(job, sig),
            self.kinds.model_set(models),
            fit_id,
            rank_id,
            admit_id,
            search_id,
            (job.id, total, models, job.runtime_estimate),
        )
        self.memo[id(job)] = (job, info)
        return info


InfoOf = Callable[[Job], JobInfo]
