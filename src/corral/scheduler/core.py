"""`Scheduler`: one scheduling cycle at a time, from a Snapshot to a Plan. Pure: no I/O, no clock,
no globals; what it keeps between cycles (a pure cache) belongs to the Scheduler object.

Per cycle (`Cycle`): build free capacity from nodes minus running allocations, order the queue
(queues.py), and for each job in order: reject if it can never fit, check quota and per-user
caps (quota_check.py), place it (placement.py: gang, all or nothing), re-check quota on the concrete
placement, check backfill reservations (backfill.py), and commit. A job that does not fit may open
an EASY reservation and may look for preemption victims (preemption.py). Outcomes already known in
the cycle are replayed for later jobs of the same kind (known.py). Every job left waiting gets a
Diagnosis (diagnosis.py), from the reasons the stages recorded (outcomes.py).
"""

from __future__ import annotations

import random
from functools import partial
from operator import attrgetter

from corral.scheduler.admission import QuotaLedger, ResourceQuota, size_class, storage_refusal
from corral.scheduler.backfill import Backfill
from corral.scheduler.cluster import ClusterMemo, ClusterState
from corral.scheduler.diagnosis import DiagnosisView, LazyDiagnoses
from corral.scheduler.eta_kept import KeptRolls
from corral.scheduler.jobinfo import JobInfo, JobInfos, JobKinds
from corral.scheduler.known import KnownOutcomes
from corral.scheduler.outcomes import Verdicts
from corral.scheduler.placement import Placed, Placer
from corral.scheduler.preemption import Preemptor
from corral.scheduler.profiles import PROFILES, Profile
from corral.scheduler.queue_index import QueueIndex
from corral.scheduler.queues import build_queue
from corral.scheduler.quota_check import QuotaCheck
from corral.scheduler.quota_memo import KeptAllowed
from corral.scheduler.types import Allocation, Assignment, Job, Plan, Preemption, Reason, Snapshot
from corral.words import plural


class Scheduler:
    """A scheduling policy (`profile`) and the caches it keeps between its cycles: per-node tables
    of the last nodes tuples, the free capacity their running sets left, what each queued job
    needs from the cluster, and the waiting queue in order (queue_index.py). The caches never
    change a result (a fresh Scheduler gives the same plan); they only save work for a caller that
    passes the same nodes tuple and the same Job and RunningJob objects from cycle to cycle (the
    live loop and the simulator do). The one exception: with `Profile.eta_reuse_s` > 0 (the
    `default` profile's 60 s, 0 for the others) targeted estimated starts (the simulator's reads of
    its new jobs) may continue the last cycle's roll (eta_kept.py); the full diagnoses (what the
    live loop writes) never do. Two Schedulers share nothing. Not thread-safe: one caller at a time.

    `replay_known=False` turns off the replay of outcomes known within a cycle (known.py), for
    tests that compare it with working every job out afresh."""

    def __init__(self, profile: Profile | None = None, *, replay_known: bool = True) -> None:
        self.profile = profile if profile is not None else PROFILES["default"]
        self.replay_known = replay_known
        self.cluster_memo = ClusterMemo()
        self.job_kinds = JobKinds()
        self.kept_allowed = KeptAllowed()  # quota admission's model answers per group's holdings
        self._queue_index: tuple[tuple[bool, float], QueueIndex] | None = None
        self.kept_rolls = KeptRolls()  # the last targeted estimated-start roll (eta_kept.py)

    @property
    def queue_index(self) -> QueueIndex:
        """The queue index for the current profile: under fair share with size_order it also keeps
        each job's size class (pure per Job and default runtime) and each user's order by it."""
        profile = self.profile
        spec = (profile.order == "fair_share" and profile.size_order, profile.default_runtime_s)
        if self._queue_index is None or self._queue_index[0] != spec:
            size_of = partial(size_class, default_runtime_s=spec[1]) if spec[0] else None
            self._queue_index = (spec, QueueIndex(size_of, self.cluster_memo.running_diff))
        return self._queue_index[1]

    def schedule(self, snapshot: Snapshot, now: float, rng: random.Random) -> Plan:
        """One scheduling cycle. Deterministic for the same snapshot, `now`, profile and rng state."""
        return Cycle(self, snapshot, now, rng).run()


def schedule(snapshot: Snapshot, now: float, rng: random.Random, profile: Profile | None = None) -> Plan:
    """One cycle with a fresh Scheduler (nothing kept between calls: the same plan at full cost)."""
    return Scheduler(profile).schedule(snapshot, now, rng)


def waiting_jobs(snapshot: Snapshot) -> list[Job]:
    """Queued jobs that are not running, each id once (the first wins), sorted by (group, priority
    desc, submit time, id): three stable C-level sorts, no Python key calls."""
    ids = [j.id for j in snapshot.queued]
    running_ids = {rj.job.id for rj in snapshot.running}
    if len(set(ids)) == len(ids) and running_ids.isdisjoint(ids):
        waiting = list(snapshot.queued)  # the usual case, checked at C speed
    else:
        seen: set[str] = set()
        waiting = []
        for j in snapshot.queued:
            if j.id not in seen and j.id not in running_ids:
                seen.add(j.id)
                waiting.append(j)
    waiting.sort(key=attrgetter("submit_time", "id"))
    waiting.sort(key=attrgetter("priority"), reverse=True)
    waiting.sort(key=attrgetter("group"))
    return waiting


class Cycle:
    """One cycle's state and the order of its stages; each stage lives in its own module."""

    # run() drops `known` after the passes (mypyc's compiled classes need attributes that may be
    # deleted declared here; plain Python ignores this).
    __deletable__ = ("known",)

    def __init__(self, scheduler: Scheduler, snapshot: Snapshot, now: float, rng: random.Random) -> None:
        profile = scheduler.profile
        self.snapshot, self.now, self.profile = snapshot, now, profile
        self.kept_rolls = scheduler.kept_rolls
        st = self.st = ClusterState(snapshot.nodes, scheduler.cluster_memo)
        self.ledger = QuotaLedger(snapshot.groups, scheduler.kept_allowed)
        running, totals = st.occupy_running(snapshot.running)  # (job, GPUs per model), a new list
        self.ledger.charge_running(totals)
        if profile.quotas:  # work a guarantee cut since its placement no longer covers is borrowed
            running = self.ledger.mark_borrowed(running, totals)
        # CPU and memory limits per group (GPU quotas are the ledger's); None without quotas or
        # when no group has such a limit (then it would refuse and charge nothing).
        resources = ResourceQuota(snapshot.groups, snapshot.running) if profile.quotas else None
        self.resources = resources if resources is not None and resources.groups else None
        shapes = scheduler.cluster_memo.cluster_shapes(snapshot.nodes, profile.cpu_jobs_on_gpu_nodes)
        self.infos = JobInfos(scheduler.job_kinds, shapes, st)
        self.placer = Placer(st, profile, rng)
        self.preemptor = Preemptor(
            st, self.placer, self.ledger if profile.quotas else None, profile, now, running, totals
        )
        self.backfill = Backfill(now, profile, st, running, self.preemptor.victims)
        self.verdicts = Verdicts()
        self.quota = QuotaCheck(self.ledger, self.verdicts)
        self.assignments: list[Assignment] = []
        self.preemptions: list[Preemption] = []
        self.visited: list[Job] = []  # jobs the passes considered, in order
        self.failed: set[tuple[object, ...]] = set()  # (shape, allowed models) that did not place
        self.blocker: Job | None = None  # strict FIFO: the head job that did not fit
        self.no_fit: set[str] = set()  # jobs that already had their reservation/preemption turn
        self.small: dict[int, tuple[int, bool]] = {}  # fit id -> (st.version, too small then)
        # Not kept under strict FIFO (it stops at the first job that does not fit anyway).
        self.replay = scheduler.replay_known and not profile.head_of_line_blocking
        self.borrowing = False  # the pass under way
        self.behind_head = 0  # jobs considered while a backfill reservation stands
        self.cut_short = False  # the backfill depth stopped a pass early
        index = scheduler.queue_index
        waiting = index.sync(snapshot.queued, snapshot.running)
        indexed = sized = None
        if waiting is None:  # a duplicate id, or a queued job that also runs: sorted afresh
            waiting = waiting_jobs(snapshot)
        elif profile.order == "fair_share":
            if index.size_of is not None:  # the lists in the size order, with every job's class
                indexed, sized = (index.per_user_sized(), index.cpu_ids), index.sizes
            else:
                indexed = (index.per_user(), index.cpu_ids)
        self.waiting = waiting
        # the index as it is now, for the diagnoses (read later: valid while its version holds)
        self.index_at = (index, index.version) if indexed is not None else None
        self.assigned_ids: set[str] = set()
        self.assigned_users: set[tuple[str, str]] = set()  # (group, user) of the assigned jobs
        groups = self.ledger.groups
        self.queue = build_queue(self.waiting, profile, groups, snapshot.usage, totals, now, indexed, sized)
        self.known = KnownOutcomes(self)  # last: it reads the parts made above

    # -- main loop ----------------------------------------------------------------------------------
    def run(self) -> Plan:
        try:
            if self.profile.quotas and self.queue.aged:  # the starvation guard holds their quota
                self.quota.pledge_aged(self.queue.aged, self.infos)
            self.run_pass(borrowing=False)
            if self.quota.pledges:
                self.known.ledger_loosened()
            self.quota.release_pledges()
            if self.profile.quotas and self.blocker is None:
                # second pass: borrowed-quota work goes after every group's guaranteed work
                self.queue.resume([j for j in self.quota.deferred if j.id not in self.assigned_ids])
                self.run_pass(borrowing=True)
        finally:
            # The known outcomes hold this cycle (they read the pass under way) and nothing reads
            # them after the passes: dropped, so that no reference cycle leaves the cycle's state
            # to the garbage collector (measured: the whole replay ~1.5x slower with one).
            del self.known
        # The plan's diagnoses hold the cycle (never the other way round: no reference cycle, so
        # the cycle's state is freed as soon as the plan is)
        view = DiagnosisView(self)
        diagnoses = LazyDiagnoses(view.all, view.one, view.estimated_start, view.estimated_starts)
        return Plan(tuple(self.assignments), tuple(self.preemptions), diagnoses)

    def run_pass(self, borrowing: bool) -> None:
        queue, st, ledger, preemptor = self.queue, self.st, self.ledger, self.preemptor
        quotas, depth = self.profile.quotas, self.profile.backfill_depth
        reservations = self.backfill.reservations
        self.borrowing = borrowing
        parking = quotas and not borrowing
        replay, known, visited, infos = self.replay, self.known, self.visited, self.infos
        memo = infos.memo
        # groups over their storage quota (their jobs wait); none in most cycles
        over = {n for n, g in ledger.groups.items() if g.storage_over is not None} if quotas else None
        token: tuple[int, ...] | None = None  # the state token, recomputed after a job changed state
        while True:
            if st.free_sum == 0 and queue.cpu_only_left == 0 and not preemptor.possible:
                break  # nothing more can fit this cycle: leave the rest to the diagnosis
            if reservations and self.behind_head >= depth:
                self.cut_short = True
                break  # tested enough jobs behind a reserved head (Slurm's bf_max_job_test)
            job = queue.pop()
            if job is None:
                break
            if reservations:
                self.behind_head += 1
            hit = memo.get(id(job))
            info = hit[1] if hit is not None and hit[0] is job else infos(job)
            if parking and info.total > 0 and ledger.may_borrow(job) and not ledger.headroom(job.group):
                queue.park(job)  # its group has no guaranteed quota left: borrowing pass
                continue
            visited.append(job)
            if over is not None and (over or job.group not in ledger.groups):
                over_storage = storage_refusal(ledger.group(job.group))
                if over_storage is not None:  # its group holds more than its storage quota: it waits
                    self.verdicts.wait_or_never(job, over_storage, False)
                    continue
            if replay and not info.never:
                if token is None:
                    token = known.token()
                if known.replay(job, info, token):
                    if queue.run_ahead():  # (most have none: no call for them)
                        known.skip_run(token, borrowing)
                    continue
            self.consider(job, borrowing, info)
            token = None
            if self.blocker is not None:
                break

    def consider(self, job: Job, borrowing: bool, info: JobInfo) -> None:
        """The ordinary path of one job (`info`: its JobInfo): fit ever, quota, fit now,
        backfill, place, commit."""
        if info.never:
            self.verdicts.unschedulable[job.id] = info.never
            return
        refusal = self.resources.refusal(job) if self.resources is not None else None
        if refusal is not None:  # its group is at its CPU or memory limit
            self.verdicts.wait_or_never(job, *refusal)
            return
        allowed: frozenset[str] | None = None
        quota = self.profile.quotas and info.total > 0
        may_borrow = quota and self.ledger.may_borrow(job)
        if quota:
            # Quota and the per-user cap decide before the free GPUs do (as in Kueue and Slurm): a
            # job they hold could not start on free GPUs either, so it keeps their reason (and no
            # estimated start) and opens no backfill reservation.
            deferred = self.quota.deferred
            before = len(deferred)
            allowed = self.quota.admit(job, borrowing, may_borrow, info)
            if allowed is None:
                # Sent to the borrowing pass now (first pass only): borrowing may admit it. (Not
                # `deferred[-1] is job`: the list still holds the first pass's deferrals in the
                # borrowing pass, where the last of them, held there, is no deferral.)
                if len(deferred) > before:
                    borrow = self.ledger.allowed_models
                    if self.too_small(info) and borrow(job, info.models, True, info.total):
                        # it would be admitted there and does not fit the free GPUs: its
                        # reservation and preemption turn now, as before quota came first (moved
                        # to the borrowing pass, it cost up to 2.2x the preemptions on the synth
                        # traces: docs/scheduler.md)
                        deferred.pop()
                        self.short(job, info)
                    elif self.replay and self.same_admission(job):
                        self.known.record_deferred(job, info)
                elif job.id in self.verdicts.why:
                    # held: it may still stop work whose end would admit it (lower-priority work
                    # of its group or user: the preemptor checks quota and cap with its victims
                    # gone), as a job that is short of GPUs may; on free GPUs too, since what
                    # holds it is the quota or cap, which free GPUs do not lift
                    self.no_fit_once(job, info, reserve=False)
                return
        if info.total > 0:
            hit = self.small.get(info.fit_id)  # the remembered answer, read inline: most jobs ask it
            if hit[1] if hit is not None and hit[0] == self.st.version else self.learn_too_small(info):
                self.short(job, info)  # cheap test: too few free GPUs, or no block as large as one
                return
        if self.replay and (not quota or self.ledger.group(job.group).user_max_gpus is None):
            self.known.record_admitted(job, info, allowed)
        backfill, why = self.backfill, self.verdicts.why
        reserved, blocking = backfill.reserved_for_others(job, info)
        if blocking is not None:  # keep off the GPU models a reservation holds for its head job
            allowed = (allowed if allowed is not None else frozenset(info.models)) - reserved
            if not allowed:
                why[job.id] = backfill.reason(blocking)
                return
        placed = self.place(job, info, allowed)
        if placed is None:
            if blocking is not None:
                why[job.id] = backfill.reason(blocking)
                return
            self.no_fit_once(job, info)
            narrowed = allowed is not None and len(allowed) < len(info.models)
            if not borrowing and may_borrow and narrowed and job.id not in why:
                self.quota.deferred.append(job)  # borrowed quota may open other GPU models
            return
        borrowed = False
        if quota:
            ok, borrowed = self.ledger.fits(job, placed.gpus_by_model, borrowing)
            if not ok:
                self.placer.rollback(placed)
                why[job.id] = self.quota.reason(job, borrowing)
                return
        blocking = backfill.blocker(job, placed)
        if blocking is not None:
            self.placer.rollback(placed)
            why[job.id] = backfill.reason(blocking)
            return
        self.commit(job, placed, borrowed)

    def same_admission(self, job: Job) -> bool:
        """Whether quota admission reads only the job's admission kind (known.py): no per-user cap
        and no CPU or memory limit in its group."""
        if self.ledger.group(job.group).user_max_gpus is not None:
            return False
        return self.resources is None or job.group not in self.resources.groups

    def too_small(self, info: JobInfo) -> bool:
        """Whether the job does not fit the free GPUs at all (`consider` reads `small` inline)."""
        hit = self.small.get(info.fit_id)
        return hit[1] if hit is not None and hit[0] == self.st.version else self.learn_too_small(info)

    def learn_too_small(self, info: JobInfo) -> bool:
        """`ClusterState.too_small` for the job's (models, GPUs, widest instance), remembered per
        kind while the free capacity stays as it is (`consider` reads `small` first: most jobs of
        a busy cycle ask it, and few kinds exist)."""
        st = self.st
        small = st.too_small(info.models, info.total, info.widest)
        self.small[info.fit_id] = (st.version, small)
        return small

    def place(self, job: Job, info: JobInfo, allowed: frozenset[str] | None) -> Placed | None:
        """Place the job's gang; a (shape, allowed models) that failed once this cycle fails again
        (capacity only shrinks within a cycle)."""
        sig = (info.sig, allowed)
        placed = None if sig in self.failed else self.placer.place(job, allowed)
        if placed is None:
            self.failed.add(sig)
        return placed

    def commit(self, job: Job, placed: Placed, borrowed: bool) -> None:
        self.assignments.append(Assignment(job.id, Allocation(job.id, tuple(placed.instances)), borrowed))
        if self.profile.quotas:
            self.ledger.charge(job, placed.gpus_by_model)
        if self.resources is not None:
            self.resources.charge(job)
        self.backfill.record_start(job, placed.gpus_by_model)
        self.assigned_ids.add(job.id)
        self.assigned_users.add((job.group, job.user))
        self.queue.charge(job)

    # -- a job that does not fit --------------------------------------------------------------------
    def short(self, job: Job, info: JobInfo) -> None:
        """The job does not fit the free GPUs at all: its reservation and preemption turn, and the
        outcome remembered for later jobs of its kind when the turn changed nothing."""
        if job.id in self.no_fit:
            return
        if not self.replay:
            self.no_fit_once(job, info)
            return
        token, attempts = self.known.token(), self.preemptor.attempts_left
        self.no_fit_once(job, info)
        self.known.record_short(job, info, token, attempts)

    def no_fit_once(self, job: Job, info: JobInfo, reserve: bool = True) -> None:
        if job.id not in self.no_fit:
            self.no_fit.add(job.id)
            self.no_fit_turn(job, info, reserve)

    def no_fit_turn(self, job: Job, info: JobInfo, reserve: bool = True) -> None:
        """Strict FIFO stops here; otherwise the job may reserve (backfill; not a job its quota or
        cap holds: `reserve` False) and look for victims."""
        p = self.profile
        if p.head_of_line_blocking:
            self.blocker = job
        backfill = self.backfill
        if reserve and p.backfill and info.total > 0 and len(backfill.reservations) < p.max_reservations:
            models = info.model_set
            if not any(r.models == models for r in backfill.reservations):
                backfill.reserve(job, models)
        if p.preemption != "none":
            room = self.preemptor.try_for(job, info.models, info.total)
            if room is not None:
                if p.quotas:  # the freed room is promised: count it against the quota now
                    self.ledger.charge(job, room.pledged)
                self.preemptions.extend(room.preemptions)
                self.verdicts.why[job.id] = Reason(
                    "waiting_for_preemption",
                    "preemption",
                    f"{plural(room.waits_for, 'running job')} {'is' if room.waits_for == 1 else 'are'} "
                    "being stopped to make room; "
                    "it starts once they exit",
                )
