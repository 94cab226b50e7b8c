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
from itertools import count
from operator import attrgetter, itemgetter
from typing import cast

from corral.scheduler.admission import QuotaLedger, ResourceQuota, build_queue, las_queue, runtime_of
from corral.scheduler.cluster import ClusterShapes, ClusterState, cluster_shapes, shape_key
from corral.scheduler.diagnosis import (
    DiagnosisView,
    Event,
    LazyDiagnoses,
    Waiting,
    estimate_starts,
    job_models,
)
from corral.scheduler.placement import Placed, Placer
from corral.scheduler.preemption import Preemptor
from corral.scheduler.profiles import PROFILES, Profile
from corral.scheduler.types import (
    Allocation,
    Assignment,
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
    reason: Reason | None = None  # the backfill_would_delay reason it gives, made once


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What the cycle needs about a job, computed once."""

    total: int  # GPUs in all
    models: tuple[str, ...]  # cluster GPU models its GPU tasks may use
    sig: tuple[object, ...]  # its tasks' shape: jobs with equal shapes fit or fail alike
    widest: int  # most GPUs one instance needs
    never: tuple[Reason, ...]  # why it can never fit this cluster (empty: it could)
    model_set: frozenset[str]  # `models` as a set (reservations are keyed by it)
    # Small ints standing for tuples of fields (equal tuples, equal ints; see _kind_id): cheap keys
    fit_id: int  # (total, widest, models): what the cheap capacity test reads
    rank_id: int  # the same with group and priority: what the preemption pre-check reads too
    admit_id: int  # the same with group and preemptible: what quota admission reads too
    search_id: int  # (sig, group, priority, preemptible): what a preemption search reads
    eta: Waiting  # what the estimated start reads (its models equal job_models(st, job))


# JobInfo depends only on the job and the cluster's shapes, so it is kept across cycles while the
# caller passes the very same Job objects and nodes tuple (the simulator and the control loop do).
# Keyed by id(job) with the job itself kept, so a reused id can never match another job.
_INFOS: list[tuple[ClusterShapes, dict[int, tuple[Job, JobInfo]]]] = []  # a pure cache, like _TABLES
_INFOS_MAX = 200_000  # jobs remembered before the memo starts afresh
_MODEL_SETS: dict[tuple[str, ...], frozenset[str]] = {}  # one shared set per model tuple (few exist)
_KIND_IDS: dict[tuple[object, ...], int] = {}  # interned job kinds (few: shapes x groups x priorities)
_NEXT_KIND = count()  # never reset, so an id never stands for two kinds even after a clear
# outcomes _skip_known replays for a whole kind of job (see _decide)
_SHORT, _SEARCHED, _EACH, _UNKNOWN = object(), object(), object(), object()
SKIP_KNOWN = True  # replay outcomes already known in the cycle (tests turn it off to compare)


def _info_memo(shapes: ClusterShapes) -> dict[int, tuple[Job, JobInfo]]:
    for seen, memo in _INFOS:
        if seen is shapes:
            if len(memo) > _INFOS_MAX:
                memo.clear()
            return memo
    memo = {}
    _INFOS[:] = [*_INFOS[-1:], (shapes, memo)]
    return memo


def _kind_id(kind: tuple[object, ...]) -> int:
    """A small int for `kind`, the same for equal kinds (dict keys hash faster than nested tuples)."""
    found = _KIND_IDS.get(kind)
    if found is None:
        if len(_KIND_IDS) > _INFOS_MAX:
            _KIND_IDS.clear()
        found = _KIND_IDS[kind] = next(_NEXT_KIND)
    return found


_KINDS: dict[tuple[object, ...], tuple[int, int, int, int]] = {}  # a job's kind -> its four ids


def _kind_ids(
    sig: tuple[object, ...], models: tuple[str, ...], total: int, widest: int, job: Job
) -> tuple[int, int, int, int]:
    """(fit, rank, admit, search) ids of a job (see JobInfo), looked up once per kind of job."""
    kind = (sig, models, job.group, job.priority, job.preemptible)
    found = _KINDS.get(kind)
    if found is None:
        if len(_KINDS) > _INFOS_MAX:
            _KINDS.clear()
        fit_id = _kind_id((total, widest, models))
        priority = int(job.priority)
        found = _KINDS[kind] = (
            fit_id,
            _kind_id((fit_id, job.group, priority)),
            _kind_id((fit_id, job.group, job.preemptible)),
            _kind_id((sig, job.group, priority, job.preemptible)),
        )
    return found


def _waiting_jobs(snapshot: Snapshot) -> list[Job]:
    """Queued jobs that are not running, each id once (the first wins)."""
    ids = [j.id for j in snapshot.queued]
    running_ids = {rj.job.id for rj in snapshot.running}
    if len(set(ids)) == len(ids) and running_ids.isdisjoint(ids):
        return list(snapshot.queued)  # the usual case, checked at C speed
    seen: set[str] = set()
    waiting: list[Job] = []
    for j in snapshot.queued:
        if j.id not in seen and j.id not in running_ids:
            seen.add(j.id)
            waiting.append(j)
    return waiting


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
        self.resources = ResourceQuota(snapshot.groups, snapshot.running) if profile.quotas else None
        self.running = running
        self.shapes = cluster_shapes(snapshot.nodes, profile.cpu_jobs_on_gpu_nodes)
        self.placer = Placer(st, profile, rng)
        self.preemptor = Preemptor(
            st, self.placer, self.ledger if profile.quotas else None, profile, now, running, totals
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
        # Outcomes known in this cycle, replayed for later jobs of the same kind (_replay_known); not
        # kept under strict FIFO (it stops at the first job that does not fit anyway).
        self.replay = SKIP_KNOWN and not profile.head_of_line_blocking
        # failure key -> state (_token) in which a job of that key met "too few free GPUs" and
        # changed nothing (no reservation, no victims)
        self.known_short: dict[object, tuple[int, ...]] = {}
        # admission key -> (state token, GPU models quota allowed) of a job that passed the capacity
        # test and quota admission in that state
        self.known_admit: dict[int, tuple[tuple[int, ...], frozenset[str] | None]] = {}
        # search key -> state in which a job of that key searched for victims and found no room
        self.known_searched: dict[object, tuple[int, ...]] = {}
        self.borrowing = False  # the pass under way
        self._info_memo = _info_memo(self.shapes)
        self._ends: tuple[int, list[Event]] | None = None  # running jobs' ends, per victim count
        self.behind_head = 0  # jobs considered while a backfill reservation stands
        self.cut_short = False  # the backfill depth stopped a pass early
        self._models_memo: dict[tuple[str | None, ...], tuple[str, ...]] = {}
        self.waiting = _waiting_jobs(snapshot)
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
        # The plan's diagnoses hold the cycle (never the other way round: no reference cycle, so
        # the cycle's state is freed as soon as the plan is)
        view = DiagnosisView(self)
        return Plan(tuple(self.assignments), tuple(self.preemptions), LazyDiagnoses(view.all, view.one))

    def _pass(self, borrowing: bool) -> None:
        queue, st, ledger, preemptor = self.queue, self.st, self.ledger, self.preemptor
        quotas, depth = self.profile.quotas, self.profile.backfill_depth
        self.borrowing = borrowing
        token: tuple[int, ...] | None = None  # the state token, recomputed after a job changed state
        while True:
            if st.free_sum == 0 and queue.cpu_only_left == 0 and not preemptor.possible:
                break  # nothing more can fit this cycle: leave the rest to the diagnosis
            if self.reservations and self.behind_head >= depth:
                self.cut_short = True
                break  # tested enough jobs behind a reserved head (Slurm's bf_max_job_test)
            job = queue.pop()
            if job is None:
                break
            if self.reservations:
                self.behind_head += 1
            info = self._info(job)
            if (
                quotas
                and not borrowing
                and info.total > 0
                and ledger.may_borrow(job)
                and not ledger.headroom(job.group)
            ):
                queue.park(job)  # its group has no guaranteed quota left: borrowing pass
                continue
            self.visited.append(job)
            if self.replay and not info.never:
                if token is None:
                    token = self._token()
                if self._replay_known(job, info, token):
                    self._skip_known(token, borrowing)
                    continue
            self._consider(job, borrowing)
            token = None
            if self.blocker is not None:
                break

    def _replay_known(self, job: Job, info: JobInfo, token: tuple[int, ...]) -> bool:
        """Give `job` the outcome an earlier job of its kind had in this same state (`token`):
        "too few free GPUs" with nothing to reserve or preempt, a preemption search that found no
        room (one attempt spent), or admitted and then held off by a backfill reservation (checked
        against its own runtime). False when no such outcome is known; then the job takes the
        ordinary path (`_consider`), which records what it finds."""
        if self.known_short.get(self._fail_key(job, info)) == token:
            self.no_fit.add(job.id)
            return True
        if self.known_searched.get(self._search_key(job, info)) == token:
            self.no_fit.add(job.id)
            self._spend_attempt()
            return True
        return self._replay_held_off(job, info, token)

    def _spend_attempt(self) -> None:
        """What a preemption search that finds no room leaves behind: one attempt fewer."""
        pre = self.preemptor
        if pre.attempts_left > 0:
            pre.attempts_left -= 1

    def _replay_held_off(self, job: Job, info: JobInfo, token: tuple[int, ...]) -> bool:
        admitted = self.known_admit.get(self._admit_key(job, info))
        if admitted is None or admitted[0] != token:
            return False
        reserved, blocking = self._reserved_for_others(job, info)
        if blocking is None:
            return False
        allowed = admitted[1]
        if (info.model_set if allowed is None else allowed) - reserved:
            return False  # other models are left to it: the ordinary path places it there
        self.why[job.id] = self._backfill_reason(blocking)
        return True

    def _skip_known(self, token: tuple[int, ...], borrowing: bool) -> None:
        """Take the jobs the queue gives next (while nothing is placed) as far as each meets an
        outcome already known in this state: the same as popping and considering them one by one
        (_replay_known), at a fraction of the cost (a busy cycle has ~250 such jobs)."""
        queue, ledger, st, preemptor = self.queue, self.ledger, self.st, self.preemptor
        if st.free_sum == 0 and queue.cpu_only_left == 0 and not preemptor.possible:
            return  # the job just replayed spent the last preemption attempt: the pass stops
        rest = queue.run_ahead()
        if not rest:
            return
        limit = len(rest)
        if self.reservations:  # each of them would count against the backfill depth
            limit = min(limit, self.profile.backfill_depth - self.behind_head)
        parking = self.profile.quotas and not borrowing
        memo, no_fit, las = self._info_memo, self.no_fit, self.profile.preemption == "las"
        now, default_s, why = self.now, self.profile.default_runtime_s, self.why
        full: dict[str, bool] = {}  # group -> no guaranteed quota left (unchanged while skipping)
        decided: dict[object, object] = {}  # search key (the finest kind) -> _decide's outcome
        n = 0
        for job in rest:
            if n >= limit:
                break
            hit = memo.get(id(job))
            if hit is None or hit[0] is not job or hit[1].never:
                break  # first seen, or never fits: take the ordinary path
            info = hit[1]
            if parking:
                no_room = full.get(job.group)
                if no_room is None:
                    no_room = full[job.group] = not ledger.headroom(job.group)
                if no_room and ledger.may_borrow(job):
                    break  # it would be parked for the borrowing pass
            kind = self._search_key(job, info) if las else info.search_id
            outcome = decided.get(kind)
            if outcome is None:
                outcome = decided[kind] = self._decide(job, info, token)
            if outcome is _SHORT:
                no_fit.add(job.id)
            elif outcome is _SEARCHED:
                no_fit.add(job.id)
                self._spend_attempt()
                if st.free_sum == 0 and queue.cpu_only_left == 0 and not preemptor.possible:
                    n += 1
                    break  # no attempts left: the pass stops here (see _pass)
            elif outcome is _EACH:
                if not self._replay_held_off(job, info, token):
                    break
            elif outcome is _UNKNOWN:
                break
            else:  # held off when it would still run at the reservation's start
                start, reason = cast(tuple[float, Reason], outcome)
                estimate = job.runtime_estimate  # the end _reserved_for_others computes
                if not now + (default_s if estimate is None else estimate) > start:
                    break
                why[job.id] = reason
            n += 1
        if n:
            self.visited.extend(queue.skip(n))
            if self.reservations:
                self.behind_head += n

    def _decide(self, job: Job, info: JobInfo, token: tuple[int, ...]) -> object:
        """What `_replay_known` does with every job of this one's search key (the finest kind: it
        fixes the failure and admission keys too) in state `token`: _SHORT, _SEARCHED, a
        `_held_off_rule`, _EACH (ask _replay_held_off job by job) or _UNKNOWN."""
        if self.known_short.get(self._fail_key(job, info)) == token:
            return _SHORT
        if self.known_searched.get(self._search_key(job, info)) == token:
            return _SEARCHED
        rule = self._held_off_rule(self._admit_key(job, info), info, token)
        return _EACH if rule is True else _UNKNOWN if rule is False else rule

    def _held_off_rule(self, key: int, info: JobInfo, token: tuple[int, ...]) -> tuple[float, Reason] | bool:
        """How `_replay_held_off` decides for jobs of this admission key now: False, never (not
        known admitted, or no reservation it could delay would take all its models); (start,
        reason) when one reservation alone decides: held off when the job would still run at
        `start`; True when several do (then ask `_replay_held_off` job by job)."""
        admitted = self.known_admit.get(key)
        if admitted is None or admitted[0] != token or info.total <= 0:
            return False
        relevant = [r for r in self.reservations if info.total > r.extra]
        if len(relevant) != 1:
            return bool(relevant)
        r = relevant[0]
        allowed = admitted[1]
        if (info.model_set if allowed is None else allowed) - r.models:
            return False
        return (r.start, self._backfill_reason(r))

    def _info(self, job: Job) -> JobInfo:
        hit = self._info_memo.get(id(job))
        if hit is not None and hit[0] is job:
            return hit[1]
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
        total = job.total_gpus
        fit_id, rank_id, admit_id, search_id = _kind_ids(sig, models, total, widest, job)
        info = JobInfo(
            total,
            models,
            sig,
            widest,
            never,
            model_set,
            fit_id,
            rank_id,
            admit_id,
            search_id,
            (job.id, total, models, job.runtime_estimate),
        )
        self._info_memo[id(job)] = (job, info)
        return info

    def _capacity_short(self, info: JobInfo) -> bool:
        """Cheap test that the job cannot fit the free capacity at all (too few GPUs, no big block)."""
        return info.total > 0 and self.st.too_small(info.models, info.total, info.widest)

    def _consider(self, job: Job, borrowing: bool) -> None:
        info = self._info(job)
        if info.never:
            self.unschedulable[job.id] = info.never
            return
        refusal = self.resources.refusal(job) if self.resources is not None else None
        if refusal is not None:  # its group is at its CPU or memory limit
            self._wait_or_never(job, *refusal)
            return
        if self._capacity_short(info):
            self._short(job, info)
            return
        allowed: frozenset[str] | None = None
        quota = self.profile.quotas and info.total > 0
        may_borrow = quota and self.ledger.may_borrow(job)
        if quota:
            allowed = self._admit(job, borrowing, may_borrow)
            if allowed is None:
                return
        if self.replay and (not quota or self.ledger.group(job.group).user_max_gpus is None):
            self.known_admit[self._admit_key(job, info)] = (self._token(), allowed)
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
        if self.resources is not None:
            self.resources.charge(job)
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
    def _token(self) -> tuple[int, ...]:
        """Changes whenever anything a replayed outcome reads may have changed: free capacity and
        quota (only commits and found victims change them for good; preemption searches and
        placement attempts restore them), reservations, victims and claimed draining room. Not the
        preemption attempts left: no outcome but "no attempt left" depends on them, and a replayed
        failed search spends one as the real one did."""
        pre = self.preemptor
        return (len(self.assignments), len(self.reservations), len(pre.victims), pre.claimed)

    def _fail_key(self, job: Job, info: JobInfo) -> object:
        """Jobs with equal keys get the same capacity test, reservation and preemption outcome in
        an unchanged state (the preemption search reads the group and priority, or the LAS queue)."""
        p = self.profile
        if p.preemption == "none":
            return info.fit_id
        if p.preemption == "las":
            return (info.fit_id, las_queue(job.attained_gpu_seconds, p.las_thresholds))
        return info.rank_id

    def _search_key(self, job: Job, info: JobInfo) -> object:
        """Jobs with equal keys get the same preemption search: the same candidates, and the same
        placement on the room they would leave (it reads the tasks, group, priority, may-borrow)."""
        if self.profile.preemption == "las":
            return (info.search_id, las_queue(job.attained_gpu_seconds, self.profile.las_thresholds))
        return info.search_id

    def _admit_key(self, job: Job, info: JobInfo) -> int:
        """Jobs with equal keys pass or fail the capacity test and quota admission alike in an
        unchanged state (without a per-user cap: that reads the user too)."""
        if not self.profile.quotas:
            return info.fit_id
        return 2 * info.admit_id + self.borrowing

    def _short(self, job: Job, info: JobInfo) -> None:
        """The job does not fit the free GPUs at all. When its reservation and preemption turn
        change nothing, remember its failure key: later jobs of that key fail the same way until
        the state changes, and `_pass` skips them (about nine in ten jobs of a busy cycle)."""
        if job.id in self.no_fit:
            return
        if not self.replay:
            self._no_fit_once(job)
            return
        token, attempts = self._token(), self.preemptor.attempts_left
        self._no_fit_once(job)
        if self._token() != token:
            return  # it reserved, or found victims: the next job of its kind must look again
        if self.preemptor.attempts_left == attempts:
            self.known_short[self._fail_key(job, info)] = token
        else:  # a preemption search that found no room
            self.known_searched[self._search_key(job, info)] = token

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
        now, default_s = self.now, self.profile.default_runtime_s
        grace_end = now + self.profile.grace_s
        out: list[Event] = []
        for rj, per_model in self.running:
            job = rj.job
            if victims and job.id in victims and not rj.stopping:
                out.append((grace_end, per_model))
                continue
            estimate = job.runtime_estimate  # runtime_of, inlined: this runs for every running job
            end = rj.start_time + (default_s if estimate is None else estimate)
            if rj.stopping:  # asked to stop earlier: gone by the end of its grace at the latest
                end = min(end, grace_end if rj.stops_by is None else rj.stops_by)
            out.append((now if now > end else end, per_model))  # max(end, now)
        return out

    def _reserve(self, job: Job, models: frozenset[str]) -> None:
        """Find when the head job could start (shadow time) if everything ends as estimated."""
        avail = sum(self.st.free_total.get(m, 0) for m in models)
        need = job.total_gpus
        start = self.now
        if avail < need:
            for end, per_model in sorted(self._events(), key=itemgetter(0)):
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
        if r.reason is None:  # one per reservation: many jobs wait behind the same one
            r.reason = Reason(
                "backfill_would_delay",
                "admission:backfill",
                f"starting now would delay job {r.job_id}, reserved to start at {r.start:.0f}",
            )
        return r.reason

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
    def _eta_order(self) -> list[Job]:
        """Waiting jobs in the order the cycle considered them, then those no pass reached (in
        queue order, up to eta_limit). Pops the queue: call once, after the passes."""
        seen: set[str] = set()
        eta_order: list[Job] = []
        for job in self.visited:
            if job.id not in self.assigned_ids and job.id not in seen:
                seen.add(job.id)
                eta_order.append(job)
        while len(eta_order) < self.profile.eta_limit:
            rest = self.queue.pop()
            if rest is None:
                break
            if rest.id not in seen:
                seen.add(rest.id)
                eta_order.append(rest)
        return eta_order

    def _blocked_reason(self, blocker: Job) -> Reason:
        return Reason(
            "blocked_by_head",
            "admission:fifo",
            f"strict FIFO: waits behind job {blocker.id}, which does not fit yet",
        )

    def _etas(self, order: list[Job]) -> dict[str, float | None]:
        st, info_of = self.st, self._info
        waiting = [info_of(job).eta for job in order[: self.profile.eta_limit]]
        return estimate_starts(
            self.now, st.free_total, st.capacity, self._events(), waiting, self.profile.default_runtime_s
        )
