"""Preemption: which running jobs to stop so that a waiting job can run.

quota_priority: a job within its group's guarantee may reclaim borrowed work of other groups,
and a job may displace lower-priority work of its own group. las: a job in a lower LAS queue
(less attained service) may displace jobs in higher queues. Victims are tried in the order that
loses least work (borrowed first, then lowest priority, then youngest; for las, most attained
first, then youngest) and added one by one until the waiting job fits. The victims keep their
resources during this cycle (they get a grace period); the waiting job starts in a later cycle.
The free GPUs its room counts on are held too, for the rest of the cycle (`_hold_free`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice, takewhile

from corral.scheduler.admission import QuotaLedger, attained_now, las_queue
from corral.scheduler.cluster import ClusterState, RunningTotals
from corral.scheduler.placement import Placer
from corral.scheduler.profiles import Profile, grace_of
from corral.scheduler.types import Job, Preemption, RunningJob

Spot = tuple[int, str | None, tuple[int, ...], float, int]  # Placed.undo entry: node, model, GPUs, CPUs, MiB


@dataclass(slots=True)
class Candidate:
    rj: RunningJob
    gpus_by_model: dict[str, int]
    las: int

    def __init__(self, rj: RunningJob, gpus_by_model: dict[str, int], las: int) -> None:
        # written out, as in types.py (one per running job a search sorts)
        self.rj = rj
        self.gpus_by_model = gpus_by_model
        self.las = las


@dataclass(slots=True)
class Room:
    """What `try_for` found: new victims to stop, the GPUs per model the job would use once the
    room is free, and how many running jobs (new victims and claimed draining ones) it waits for."""

    preemptions: list[Preemption]
    pledged: dict[str, int]
    waits_for: int


class Preemptor:
    def __init__(
        self,
        st: ClusterState,
        placer: Placer,
        ledger: QuotaLedger | None,
        profile: Profile,
        now: float,
        running: list[tuple[RunningJob, dict[str, int]]],
        totals: RunningTotals | None = None,
    ) -> None:
        self.st, self.placer, self.ledger, self.profile, self.now = st, placer, ledger, profile, now
        self.attempts_left = profile.max_preemption_attempts if profile.preemption != "none" else 0
        self.running = running
        self.preemptible = 0  # running jobs that may become victims
        # jobs already asked to stop: never victims again; their room goes to the first job it fits
        self.draining: list[Candidate] = []
        self._ranks: set[tuple[str, int]] = set()  # (group, priority) of preemptible running jobs
        self._lenders: set[str] = set()  # groups with preemptible running jobs on borrowed quota
        if self.attempts_left:
            self._survey(running, totals)
        self.claimed = 0  # draining jobs whose room is promised to a waiting job
        self.candidates: list[Candidate] = []  # las: every candidate, in victim order
        self.borrowed: list[Candidate] = []
        # (group, priority) -> its candidates in order, made on first ask (`_rank`)
        self.by_rank: dict[tuple[str, int], list[Candidate]] = {}
        self._pairs: list[tuple[RunningJob, dict[str, int]]] = []  # the candidates' running jobs
        self._built = False
        self.victims: dict[str, float] = {}  # job id -> when it is gone at the latest (its grace)
        self.hopeless: set[tuple[object, ...]] = set()  # memo keys with no eligible victim left
        self._lower: dict[tuple[str, int], bool] = {}  # (group, priority) -> has lower-ranked candidates

    def _survey(self, running: list[tuple[RunningJob, dict[str, int]]], totals: RunningTotals | None) -> None:
        """Draining jobs, and what the cheap pre-check reads: from the running totals when given
        (kept up to date between calls), else from one pass over the running jobs."""
        if totals is not None:
            self.preemptible = totals.preemptible
            self._ranks.update(totals.ranks)
            self._lenders.update(totals.lenders)
            if totals.stopping:
                self.draining = [Candidate(rj, pm, 0) for rj, pm in running if rj.stopping]
            return
        ranks, lenders = self._ranks, self._lenders
        for rj, pm in running:
            if rj.stopping:
                self.draining.append(Candidate(rj, pm, 0))
                continue
            job = rj.job
            if job.preemptible:
                self.preemptible += 1
                ranks.add((job.group, int(job.priority)))
                if rj.borrowed:
                    lenders.add(job.group)

    def _build(self) -> None:
        """Sort the candidates, on the first search of the cycle (many cycles have none): under
        las all of them; otherwise the borrowed ones, each (group, priority)'s on first ask.

        Each list is its part of every candidate sorted by `order_key`, as a stable sort of the
        part alone gives it: most searches read only the borrowed work of other groups (on
        Philly's first 20,000 jobs no search read a (group, priority) list), so the others are
        not sorted or indexed for them."""
        if self._built:
            return
        self._built = True
        profile, now = self.profile, self.now
        bound = profile.max_preemptions or None  # jobs preempted this often are spared
        pairs = [
            (rj, pm)
            for rj, pm in self.running
            if rj.job.preemptible and not rj.stopping and (bound is None or rj.job.preemptions < bound)
        ]
        if profile.preemption == "las":
            thresholds = profile.las_thresholds
            cands = [
                Candidate(rj, pm, las_queue(attained_now(rj, now, sum(pm.values())), thresholds))
                for rj, pm in pairs
            ]
            cands.sort(key=lambda c: (-c.las, -c.rj.start_time, c.rj.job.id))
            self.candidates = cands
            self.borrowed = [c for c in cands if c.rj.borrowed]
            return
        self._pairs = pairs
        self.borrowed = sorted((Candidate(rj, pm, 0) for rj, pm in pairs if rj.borrowed), key=self.order_key)

    def _rank(self, group: str, priority: int) -> list[Candidate]:
        """The candidates of one group and priority in victim order (not under las)."""
        found = self.by_rank.get((group, priority))
        if found is None:
            found = self.by_rank[group, priority] = sorted(
                (
                    Candidate(rj, pm, 0)
                    for rj, pm in self._pairs
                    if rj.job.group == group and int(rj.job.priority) == priority
                ),
                key=self.order_key,
            )
        return found

    @staticmethod
    def order_key(c: Candidate) -> tuple[bool, int, float, str]:
        """Victims that lose least work first: borrowed, then lowest priority, then youngest."""
        return (not c.rj.borrowed, int(c.rj.job.priority), -c.rj.start_time, c.rj.job.id)

    @property
    def possible(self) -> bool:
        new_victims = len(self.victims) - self.claimed
        return self.attempts_left > 0 and (
            new_victims < self.preemptible or self.claimed < len(self.draining)
        )

    def _eligible(self, job: Job, models: tuple[str, ...]) -> Iterator[Candidate]:
        """Candidates this job may displace, in victim order."""
        if self.profile.preemption == "las":
            mine = las_queue(job.attained_gpu_seconds, self.profile.las_thresholds)
            return takewhile(lambda c: c.las > mine, self.candidates)
        lower = [self._rank(job.group, p) for p in range(int(job.priority))]
        # heapq.merge is interpreted Python (a generator): one list alone is already in order
        own: Iterator[Candidate] = (
            iter(lower[0]) if len(lower) == 1 else heapq.merge(*lower, key=self.order_key)
        )
        ledger = self.ledger
        if ledger is None or not self.borrowed or not ledger.below_guarantee(job, models):
            return own
        lent = (c for c in self.borrowed if c.rj.job.group != job.group)
        return heapq.merge(own, lent, key=self.order_key)

    def _may_have_victims(self, job: Job, models: tuple[str, ...], need: int | None) -> bool:
        """Cheap necessary condition for `_eligible` to yield anything: for quota_priority, a
        preemptible running job of lower priority in the job's group, or borrowed work of another
        group while the job is within its guarantee; for las, the job is not in the last queue
        (victims sit in a higher one). Needs no sorted candidate list."""
        if self.profile.preemption == "las":
            thresholds = self.profile.las_thresholds
            return las_queue(job.attained_gpu_seconds, thresholds) < len(thresholds)
        group, lenders = job.group, self._lenders
        lower = self._lower.get((group, job.priority))
        if lower is None:
            ranks, priority = self._ranks, int(job.priority)
            lower = self._lower[group, job.priority] = any((group, p) in ranks for p in range(priority))
        if lower:
            return True
        ledger = self.ledger
        if ledger is None or not lenders or (len(lenders) == 1 and group in lenders):
            return False
        return bool(ledger.allowed_models(job, models, False, need))  # ledger.below_guarantee

    def _memo_key(self, job: Job, models: tuple[str, ...]) -> tuple[object, ...]:
        """Jobs with equal keys have the same eligible victims."""
        if self.profile.preemption == "las":
            return (las_queue(job.attained_gpu_seconds, self.profile.las_thresholds), models)
        reclaim = self.ledger is not None and bool(self.borrowed) and self.ledger.below_guarantee(job, models)
        return (job.group, int(job.priority), models, reclaim)

    def try_for(self, job: Job, models: tuple[str, ...], need: int | None = None) -> Room | None:
        """New victims that make room for `job` (with draining jobs' room it claims) and the GPUs
        per model it would then use; None when no victims would do (state is left as it was).
        `need`: the job's total GPUs, if known."""
        if self.attempts_left <= 0:
            return None
        draining_left = self.claimed < len(self.draining)
        if not draining_left and (
            len(self.victims) - self.claimed >= self.preemptible
            or not self._may_have_victims(job, models, need)
        ):
            return None  # the common case, decided without building anything
        wanted = set(models)

        def useful(c: Candidate) -> bool:
            return c.rj.job.id not in self.victims and (
                not wanted or not c.gpus_by_model or bool(wanted & c.gpus_by_model.keys())
            )

        draining = [c for c in self.draining if useful(c)] if draining_left else []
        pool = draining + self._new_victims(job, models, need, useful)
        if not pool:
            return None
        self.attempts_left -= 1
        chosen: list[Candidate] = []
        fits: dict[str, int] | None = None
        spots: list[Spot] = []
        total = job.total_gpus
        widest = max((t.resources.gpus for t in job.tasks), default=0)
        if total > 0 and self._short_even_if_all_released(pool, models, total, widest):
            return None  # what the loop below finds, without releasing and restoring every victim
        before: dict[int, float] = {}  # node -> its free CPUs before the search (an exact restore)
        for c in pool:
            self.st.note_free_cpus(c.rj.allocation, before)
            self._release(c, -1)
            chosen.append(c)
            if total > 0 and self.st.too_small(models, total, widest):
                continue  # too few free GPUs, or no block as large as one instance: placing fails
            found = self._fits_now(job, models, chosen)
            if found is not None:
                fits, spots = found
                break
        for c in reversed(chosen):
            self._release(c, 1)
        self.st.put_free_cpus(before)  # as if nothing had been released, to the last bit
        if fits is None:
            return None
        self._hold_free(spots)  # any preemption mode: else the room's free GPUs go to others
        profile, now = self.profile, self.now
        stops: list[Preemption] = []
        for c in chosen:
            victim = c.rj.job
            grace = grace_of(victim, profile)  # the victim's own stop grace
            self.victims[victim.id] = now + grace
            if not c.rj.stopping:
                stops.append(Preemption(victim.id, grace, self._sentence(job, c), for_job=job.id))
        self.claimed += sum(1 for c in chosen if c.rj.stopping)
        return Room(stops, fits, len(chosen))

    def _short_even_if_all_released(
        self, pool: list[Candidate], models: tuple[str, ...], total: int, widest: int
    ) -> bool:
        """Whether the capacity test (`ClusterState.too_small`) would fail after every release of
        the search loop, told from upper bounds without releasing anything: the free GPUs on
        `models` plus all the pool's, and per node the free GPUs of a model plus the pool's there
        (a release gives back at most the GPUs of its allocation; releases only add, so the whole
        pool bounds every prefix of it). Then the loop tests no placement and finds no room: in a
        profile of Philly's first 20,000 jobs, 3,924 of 6,872 searches ended so, after releasing
        and restoring 227,000 candidates one by one."""
        st = self.st
        wanted = set(models)
        room = sum(st.free_total.get(m, 0) for m in models)
        block = max((st.largest_block(m) for m in models), default=0)
        if room >= total and block >= widest:
            return False
        added: dict[tuple[int, str], int] = {}
        index_of, gpu_model, single = st.index_of, st.gpu_model, st.table.single_model
        for c in pool:
            for inst in c.rj.allocation.instances:
                i = index_of.get(inst.node)
                if i is None or not inst.gpu_indices:
                    continue
                only = single[i]
                if only is not None:  # a one-model node: every index counted (an upper bound)
                    if only in wanted:
                        added[i, only] = added.get((i, only), 0) + len(inst.gpu_indices)
                    continue
                models_of = gpu_model[i]
                for g in inst.gpu_indices:
                    m = models_of.get(g)
                    if m in wanted:
                        added[i, m] = added.get((i, m), 0) + 1
        room += sum(added.values())
        if room < total:
            return True
        if block >= widest:
            return False
        free = st.free
        return all(len(free[i].get(m, ())) + n < widest for (i, m), n in added.items())

    def _new_victims(
        self, job: Job, models: tuple[str, ...], need: int | None, useful: Callable[[Candidate], bool]
    ) -> list[Candidate]:
        """Running jobs not yet asked to stop that this job may displace, in victim order."""
        if len(self.victims) - self.claimed >= self.preemptible or not self._may_have_victims(
            job, models, need
        ):
            return []
        self._build()
        memo_key = self._memo_key(job, models)
        if memo_key in self.hopeless:
            return []
        pool = list(islice(filter(useful, self._eligible(job, models)), self.profile.max_victims))
        if not pool:  # stays empty for the cycle: victims are only ever taken away
            self.hopeless.add(memo_key)
        return pool

    def _release(self, c: Candidate, sign: int) -> None:
        self.st.occupy(c.rj.allocation, sign=1 if sign > 0 else -1)
        if self.ledger is not None:
            self.ledger.charge(c.rj.job, c.gpus_by_model, sign)

    def _fits_now(
        self, job: Job, models: tuple[str, ...], chosen: list[Candidate]
    ) -> tuple[dict[str, int], list[Spot]] | None:
        """GPUs per model the job would use if `chosen` were gone, and where it would be placed;
        None when it would still not fit."""
        ledger = self.ledger
        allowed = None
        borrow = False
        if ledger is not None and job.total_gpus > 0:
            # the per-user cap (the victims' GPUs released: a user's own lower-priority work makes
            # room under it): else work is stopped for a job that would still wait on the cap.
            # First: one look-up, where the models' test below builds a key and walks the memo
            # (both only read the ledger, so their order changes no answer)
            if not ledger.user_fits(job):
                return None
            # taking back lent GPUs must leave this job within its own guarantee, not borrowing
            borrow = ledger.may_borrow(job) and all(c.rj.job.group == job.group for c in chosen)
            allowed = ledger.allowed_models(job, models, borrow)
            if not allowed:
                return None
        placed = self.placer.place(job, allowed)
        if placed is None:
            return None
        ok = ledger is None or ledger.fits(job, placed.gpus_by_model, borrow)[0]
        spots = list(placed.undo)
        self.placer.rollback(placed)
        return (dict(placed.gpus_by_model), spots) if ok else None

    def _hold_free(self, spots: list[Spot]) -> None:
        """Hold, for the rest of this cycle, the free GPUs that the room counts on besides the
        victims' (the victims keep theirs through their grace anyway). Otherwise jobs later in the
        order take them in this same cycle; when the victims have stopped the
        job still does not fit, preempts again, and the victims restart in the room it left: a
        multi-node gang and its victims preempt each other forever and nobody keeps any work."""
        st = self.st
        for i, model, gpus, _cpus, _mem in spots:
            if model is None or not gpus:
                continue
            free = set(st.free[i][model])
            held = tuple(g for g in gpus if g in free)
            if held:
                st.take(i, model, held, 0.0, 0)  # GPUs only: the job's CPUs/memory are not reserved

    def _sentence(self, job: Job, c: Candidate) -> str:
        if self.profile.preemption == "las":
            return f"preempted for job {job.id}, which has attained less GPU service"
        if c.rj.job.group != job.group:
            return f"reclaimed by group {job.group} for job {job.id}: this job ran on borrowed quota"
        return f"preempted by higher-priority job {job.id} in group {job.group}"
