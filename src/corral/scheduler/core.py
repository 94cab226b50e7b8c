"""`schedule()`: one scheduling cycle, from a Snapshot to a Plan. Pure: no I/O, no clock, no globals.

Per cycle: build free capacity from nodes minus running allocations, order the queue (admission),
and for each job in order: reject if it can never fit, check quota and per-user caps, place it
(gang, all or nothing), re-check quota on the concrete placement, check backfill reservations, and
commit. A job that does not fit may open an EASY reservation and may look for preemption victims.
Every job left waiting gets a Diagnosis.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from operator import attrgetter

from corral.scheduler.admission import QuotaLedger, build_queue, runtime_of
from corral.scheduler.cluster import ClusterShapes, ClusterState, cluster_shapes, shape_key
from corral.scheduler.diagnosis import CapacityReasons, Event, LazyDiagnoses, estimate_starts, job_models
from corral.scheduler.placement import Placed, Placer
from corral.scheduler.preemption import Preemptor
from corral.scheduler.profiles import PROFILES, Profile
from corral.scheduler.types import (
    Allocation,
    Assignment,
    Diagnosis,
    Job,
    Plan,
    Preemption,
    Reason,
    Snapshot,
)


@dataclass(slots=True)
class Reservation:
    """EASY backfill: the head job of a model pool starts at `start`; `extra` GPUs of the pool are
    free then beyond what it needs, so later jobs may hold that many past `start`."""

    job_id: str
    models: frozenset[str]
    start: float
    extra: int


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What the cycle needs about a job, computed once."""

    total: int  # GPUs in all
    models: tuple[str, ...]  # cluster GPU models its GPU tasks may use
    sig: tuple[object, ...]  # its tasks' shape: jobs with equal shapes fit or fail alike
    widest: int  # most GPUs one instance needs
    never: tuple[Reason, ...]  # why it can never fit this cluster (empty: it could)
    model_set: frozenset[str]  # `models` as a set (reservations are keyed by it)


# JobInfo depends only on the job and the cluster's shapes, so it is kept across cycles while the
# caller passes the very same Job objects and nodes tuple (the simulator and the control loop do).
# Keyed by id(job) with the job itself kept, so a reused id can never match another job.
_INFOS: list[tuple[ClusterShapes, dict[int, tuple[Job, JobInfo]]]] = []  # a pure cache, like _TABLES
_INFOS_MAX = 200_000  # jobs remembered before the memo starts afresh
_MODEL_SETS: dict[tuple[str, ...], frozenset[str]] = {}  # one shared set per model tuple (few exist)


def _info_memo(shapes: ClusterShapes) -> dict[int, tuple[Job, JobInfo]]:
    for seen, memo in _INFOS:
        if seen is shapes:
            if len(memo) > _INFOS_MAX:
                memo.clear()
            return memo
    memo = {}
    _INFOS[:] = [*_INFOS[-1:], (shapes, memo)]
    return memo


def schedule(snapshot: Snapshot, now: float, rng: random.Random, profile: Profile | None = None) -> Plan:
    """One scheduling cycle. Deterministic for the same snapshot, `now`, profile and rng state."""
    return _Cycle(snapshot, now, rng, profile or PROFILES["default"]).run()


class _Cycle:
    def __init__(self, snapshot: Snapshot, now: float, rng: random.Random, profile: Profile) -> None:
        self.snapshot, self.now, self.profile = snapshot, now, profile
        st = self.st = ClusterState(snapshot.nodes)
        self.ledger = QuotaLedger(snapshot.groups)
        held, totals = st.occupy_running(snapshot.running)
        running = list(zip(snapshot.running, held, strict=True))
        self.ledger.charge_running(totals)
        self.running = running
        self.shapes = cluster_shapes(snapshot.nodes, profile.cpu_jobs_on_gpu_nodes)
        self.placer = Placer(st, profile, rng)
        self.preemptor = Preemptor(
            st, self.placer, self.ledger if profile.quotas else None, profile, now, running
        )
        self.assignments: list[Assignment] = []
        self.preemptions: list[Preemption] = []
        self.why: dict[str, Reason] = {}
        self.unschedulable: dict[str, tuple[Reason, ...]] = {}
        self.visited: list[Job] = []
        self.reservations: list[Reservation] = []
        self.started: list[Event] = []
        self.failed: set[tuple[object, ...]] = set()
        self.blocker: Job | None = None
        self.deferred: list[Job] = []
        self.no_fit: set[str] = set()  # jobs that already had their reservation/preemption turn
        self.infos: dict[str, JobInfo] = {}
        self._info_memo = _info_memo(self.shapes)
        self._ends: tuple[int, list[Event]] | None = None  # running jobs' ends, per victim count
        self.behind_head = 0  # jobs considered while a backfill reservation stands
        self.cut_short = False  # the backfill depth stopped a pass early
        self._models_memo: dict[tuple[str | None, ...], tuple[str, ...]] = {}
        running_ids = {rj.job.id for rj in snapshot.running}
        seen: set[str] = set()
        self.waiting: list[Job] = []
        for j in snapshot.queued:
            if j.id not in seen and j.id not in running_ids:
                seen.add(j.id)
                self.waiting.append(j)
        # by (group, priority desc, submit time, id): three stable C-level sorts, no Python key calls
        self.waiting.sort(key=attrgetter("submit_time", "id"))
        self.waiting.sort(key=attrgetter("priority"), reverse=True)
        self.waiting.sort(key=attrgetter("group"))
        self.assigned_ids: set[str] = set()
        self.queue = build_queue(
            self.waiting,
            profile.order,
            self.ledger.groups,
            snapshot.usage,
            totals,
            profile.fair_share_horizon_s,
            profile.las_thresholds,
        )

    # -- main loop ----------------------------------------------------------------------------------
    def run(self) -> Plan:
        self._pass(borrowing=False)
        if self.profile.quotas and self.blocker is None:
            # second pass: work that needs borrowed quota goes after every group's guaranteed work
            self.queue.resume([j for j in self.deferred if j.id not in self.assigned_ids])
            self._pass(borrowing=True)
        seen: set[str] = set()
        eta_order: list[Job] = []
        for job in self.visited:
            if job.id not in self.assigned_ids and job.id not in seen:
                seen.add(job.id)
                eta_order.append(job)
        while len(eta_order) < self.profile.eta_limit:  # then the jobs no pass reached, in order
            rest = self.queue.pop()
            if rest is None:
                break
            if rest.id not in seen:
                seen.add(rest.id)
                eta_order.append(rest)
        diagnoses = LazyDiagnoses(lambda: self._diagnoses(eta_order))
        return Plan(tuple(self.assignments), tuple(self.preemptions), diagnoses)

    def _pass(self, borrowing: bool) -> None:
        queue, st, ledger = self.queue, self.st, self.ledger
        quotas = self.profile.quotas
        while True:
            if st.free_gpus_total() == 0 and queue.cpu_only_left == 0 and not self.preemptor.possible:
                break  # nothing more can fit this cycle: leave the rest to the diagnosis
            if self.reservations and self.behind_head >= self.profile.backfill_depth:
                self.cut_short = True
                break  # tested enough jobs behind a reserved head (Slurm's bf_max_job_test)
            job = queue.pop()
            if job is None:
                break
            if self.reservations:
                self.behind_head += 1
            if (
                quotas
                and not borrowing
                and self._info(job).total > 0
                and ledger.may_borrow(job)
                and not ledger.headroom(job.group)
            ):
                queue.park(job)  # its group has no guaranteed quota left: borrowing pass
                continue
            self.visited.append(job)
            self._consider(job, borrowing)
            if self.blocker is not None:
                break

    def _info(self, job: Job) -> JobInfo:
        info = self.infos.get(job.id)
        if info is None:
            hit = self._info_memo.get(id(job))
            if hit is not None and hit[0] is job:
                info = self.infos[job.id] = hit[1]
                return info
            sig = shape_key(job)
            widest = max((t.resources.gpus for t in job.tasks), default=0)
            constraints = tuple(t.resources.gpu_model for t in job.tasks if t.resources.gpus > 0)
            models = self._models_memo.get(constraints)
            if models is None:
                models = self._models_memo[constraints] = job_models(self.st, job)
            never = self.shapes.reasons(job, sig)
            model_set = _MODEL_SETS.get(models)
            if model_set is None:
                model_set = _MODEL_SETS[models] = frozenset(models)
            info = JobInfo(job.total_gpus, models, sig, widest, never, model_set)
            self.infos[job.id] = info
            self._info_memo[id(job)] = (job, info)
        return info

    def _capacity_short(self, info: JobInfo) -> bool:
        """Cheap test that the job cannot fit the free capacity at all (too few GPUs, no big block)."""
        if info.total <= 0:
            return False
        st = self.st
        if sum(st.free_total[m] for m in info.models) < info.total:
            return True
        return all(st.largest_block(m) < info.widest for m in info.models)

    def _consider(self, job: Job, borrowing: bool) -> None:
        info = self._info(job)
        if info.never:
            self.unschedulable[job.id] = info.never
            return
        if self._capacity_short(info):
            self._no_fit_once(job)
            return
        allowed: frozenset[str] | None = None
        quota = self.profile.quotas and info.total > 0
        may_borrow = quota and self.ledger.may_borrow(job)
        if quota:
            allowed = self._admit(job, borrowing, may_borrow)
            if allowed is None:
                return
        reserved, blocking = self._reserved_for_others(job, info)
        if blocking is not None:  # keep off the GPU models a reservation holds for its head job
            allowed = (allowed if allowed is not None else frozenset(info.models)) - reserved
            if not allowed:
                self.why[job.id] = self._backfill_reason(blocking)
                return
        sig = (info.sig, allowed)
        placed = None if sig in self.failed else self.placer.place(job, allowed)
        if placed is None:
            self.failed.add(sig)
            if blocking is not None:
                self.why[job.id] = self._backfill_reason(blocking)
                return
            self._no_fit_once(job)
            narrowed = allowed is not None and len(allowed) < len(info.models)
            if not borrowing and may_borrow and narrowed and job.id not in self.why:
                self.deferred.append(job)  # borrowed quota may open other GPU models
            return
        borrowed = False
        if quota:
            ok, borrowed = self.ledger.fits(job, placed.gpus_by_model, borrowing)
            if not ok:
                self.placer.rollback(placed)
                self.why[job.id] = self._quota_reason(job, borrowing)
                return
        blocking = self._backfill_blocker(job, placed)
        if blocking is not None:
            self.placer.rollback(placed)
            self.why[job.id] = self._backfill_reason(blocking)
            return
        self._commit(job, placed, borrowed)

    def _commit(self, job: Job, placed: Placed, borrowed: bool) -> None:
        self.assignments.append(Assignment(job.id, Allocation(job.id, tuple(placed.instances)), borrowed))
        if self.profile.quotas:
            self.ledger.charge(job, placed.gpus_by_model)
        self.started.append(
            (self.now + runtime_of(job, self.profile.default_runtime_s), placed.gpus_by_model)
        )
        self.assigned_ids.add(job.id)
        self.queue.charge(job)

    # -- admission ----------------------------------------------------------------------------------
    def _admit(self, job: Job, borrowing: bool, may_borrow: bool) -> frozenset[str] | None:
        """Models the job may use under its group's quota now; None when none (reason recorded, or
        the job deferred to the borrowing pass)."""
        ledger = self.ledger
        group = ledger.group(job.group)
        cap = group.user_max_gpus
        if cap is not None and not ledger.user_fits(job):
            reason = Reason(
                "user_cap",
                "quota:user",
                f"user {job.user} may hold {cap} GPUs in group {group.name}; "
                f"holds {ledger.user_used.get((group.name, job.user), 0)}; this job needs {job.total_gpus}",
            )
            self._wait_or_never(job, reason, never=job.total_gpus > cap)
            return None
        models = self._info(job).models
        allowed = ledger.allowed_models(job, models, borrowing, self._info(job).total)
        if allowed:
            return allowed
        if not borrowing and may_borrow:
            self.deferred.append(job)
            return None
        never = all(job.total_gpus > ledger.limit(group, ledger.key(group, m), may_borrow) for m in models)
        self._wait_or_never(job, self._quota_reason(job, may_borrow), never)
        return None

    def _wait_or_never(self, job: Job, reason: Reason, never: bool) -> None:
        if never:
            self.unschedulable[job.id] = (reason,)
        else:
            self.why[job.id] = reason

    def _quota_reason(self, job: Job, borrow: bool) -> Reason:
        group = self.ledger.group(job.group)
        if borrow:
            return Reason(
                "quota_max",
                "quota",
                f"group {group.name} is at its maximum quota for the GPU models this job can use",
            )
        why = (
            "borrowing is off" if not group.borrowing else "the job is not preemptible, so it may not borrow"
        )
        return Reason(
            "quota_exhausted",
            "quota",
            f"group {group.name} is at its guaranteed quota for the GPU models this job can use and {why}",
        )

    # -- a job that does not fit --------------------------------------------------------------------
    def _no_fit_once(self, job: Job) -> None:
        if job.id not in self.no_fit:
            self.no_fit.add(job.id)
            self._on_no_fit(job)

    def _on_no_fit(self, job: Job) -> None:
        p = self.profile
        if p.head_of_line_blocking:
            self.blocker = job
        info = self._info(job)
        if p.backfill and info.total > 0 and len(self.reservations) < p.max_reservations:
            models = info.model_set
            if not any(r.models == models for r in self.reservations):
                self._reserve(job, models)
        if p.preemption != "none":
            room = self.preemptor.try_for(job, info.models, info.total)
            if room is not None:
                if self.profile.quotas:  # the freed room is promised: count it against the quota now
                    self.ledger.charge(job, room.pledged)
                self.preemptions.extend(room.preemptions)
                self.why[job.id] = Reason(
                    "waiting_for_preemption",
                    "preemption",
                    f"{room.waits_for} running job(s) are being stopped to make room; "
                    "it starts once they exit",
                )

    def _events(self) -> list[Event]:
        """When GPUs come back: running jobs at their estimated end (victims after their grace),
        jobs started this cycle after their estimate."""
        victims = self.preemptor.victims
        if self._ends is None or self._ends[0] != len(victims):
            self._ends = (len(victims), self._running_ends(victims))
        return self._ends[1] + self.started

    def _running_ends(self, victims: set[str]) -> list[Event]:
        grace_end = self.now + self.profile.grace_s
        out: list[Event] = []
        for rj, per_model in self.running:
            if rj.job.id in victims and not rj.stopping:
                out.append((grace_end, per_model))
                continue
            end = rj.start_time + runtime_of(rj.job, self.profile.default_runtime_s)
            if rj.stopping:  # asked to stop earlier: gone by the end of its grace at the latest
                end = min(end, grace_end if rj.stops_by is None else rj.stops_by)
            out.append((max(end, self.now), per_model))
        return out

    def _reserve(self, job: Job, models: frozenset[str]) -> None:
        """Find when the head job could start (shadow time) if everything ends as estimated."""
        avail = sum(self.st.free_total.get(m, 0) for m in models)
        need = job.total_gpus
        start = self.now
        if avail < need:
            for end, per_model in sorted(self._events(), key=lambda e: e[0]):
                avail += sum(n for m, n in per_model.items() if m in models)
                if avail >= need:
                    start = end
                    break
            else:
                return  # it cannot start even when everything running ends: nothing to protect
        self.reservations.append(Reservation(job.id, models, start, avail - need))

    def _reserved_for_others(self, job: Job, info: JobInfo) -> tuple[frozenset[str], Reservation | None]:
        """GPU models this job must avoid: those of reservations it would delay (it would still run
        at their head's reserved start and needs more than the spare GPUs), and the first such."""
        if not self.reservations or info.total <= 0:
            return frozenset(), None
        end = self.now + runtime_of(job, self.profile.default_runtime_s)
        first = None
        models: frozenset[str] = frozenset()
        for r in self.reservations:
            if end > r.start and info.total > r.extra:
                models |= r.models
                first = first or r
        return models, first

    @staticmethod
    def _backfill_reason(r: Reservation) -> Reason:
        return Reason(
            "backfill_would_delay",
            "admission:backfill",
            f"starting now would delay job {r.job_id}, reserved to start at {r.start:.0f}",
        )

    def _backfill_blocker(self, job: Job, placed: Placed) -> Reservation | None:
        """The reservation this placement would delay, if any; otherwise consume the extras."""
        end = self.now + runtime_of(job, self.profile.default_runtime_s)
        takes: list[tuple[Reservation, int]] = []
        for r in self.reservations:
            used = sum(n for m, n in placed.gpus_by_model.items() if m in r.models)
            if used == 0 or end <= r.start:
                continue
            if used > r.extra:
                return r
            takes.append((r, used))
        for r, used in takes:
            r.extra -= used
        return None

    # -- diagnosis ----------------------------------------------------------------------------------
    def _diagnoses(self, eta_order: list[Job]) -> dict[str, Diagnosis]:
        assigned = self.assigned_ids
        caps = CapacityReasons(self.st)
        etas = self._etas([j for j in eta_order if j.id not in self.unschedulable])
        blocked = self.blocker
        visited = {j.id for j in self.visited} if self.cut_short else set()
        depth_reason = Reason(
            "backfill_depth",
            "admission:backfill",
            f"not tried this cycle: at most {self.profile.backfill_depth} jobs are tried "
            "behind a reserved job",
        )
        out: dict[str, Diagnosis] = {}
        position: dict[str, int] = {}
        for job in self.waiting:  # sorted by group, then the in-group order
            if job.id in assigned:
                continue
            pos = position[job.group] = position.get(job.group, 0) + 1
            never = self.unschedulable.get(job.id)
            if never is not None:
                out[job.id] = Diagnosis(job.id, never, pos, None, True)
                continue
            reasons: tuple[Reason, ...]
            why = self.why.get(job.id)
            if why is not None:
                reasons = (why,)
            elif blocked is not None and job is not blocked:
                reasons = (self._blocked_reason(blocked), *caps.reasons(job))
            elif self.cut_short and job.id not in visited:
                reasons = (depth_reason, *caps.reasons(job))
            else:
                info = self.infos.get(job.id)
                reasons = caps.reasons(job, info.sig if info is not None else None)
            out[job.id] = Diagnosis(job.id, reasons, pos, etas.get(job.id))
        return out

    def _blocked_reason(self, blocker: Job) -> Reason:
        return Reason(
            "blocked_by_head",
            "admission:fifo",
            f"strict FIFO: waits behind job {blocker.id}, which does not fit yet",
        )

    def _etas(self, order: list[Job]) -> dict[str, float | None]:
        st = self.st
        return estimate_starts(
            self.now,
            st.free_total,
            st.capacity,
            self._events(),
            order[: self.profile.eta_limit],
            lambda j: self._info(j).models,  # equal to job_models(st, j), remembered across cycles
            lambda j: runtime_of(j, self.profile.default_runtime_s),
            lambda j: self._info(j).total,
        )
