"""Outcomes replayed within a cycle: most waiting jobs of a busy cycle fail in one of a few ways
that depend only on the job's kind and on the cycle's state, so a later job of the same kind in
the same state gets the outcome an earlier one had, without the work (see docs/scheduler.md,
"Outcomes replayed within a cycle"). A pure speed-up: `Scheduler(replay_known=False)` gives the
same plans."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, cast

from corral.scheduler.admission import las_queue
from corral.scheduler.jobinfo import JobInfo
from corral.scheduler.types import Job, Reason

if TYPE_CHECKING:
    from corral.scheduler.core import Cycle

Token = tuple[int, ...]
HeldOff = tuple[float, Reason]  # a held-off rule: (the reservation's start, its reason)

# what KnownOutcomes.decide says of a whole kind of job
_SHORT, _SEARCHED, _DEFERRED, _EACH, _UNKNOWN = object(), object(), object(), object(), object()


def _holds(recorded: Token | None, token: Token) -> bool:
    """Whether an outcome recorded in state `recorded` holds in state `token`: the same state, or
    one that differs only by reservations opened since (the token's second field; they only grow
    within a cycle). Valid for "too few free GPUs", a failed preemption search and deferral to the
    borrowing pass, none of which reads the reservations: the capacity test reads the free GPUs,
    the search the victims, quota admission the ledger, and whether a job opens a reservation
    reads the free GPUs, the timeline (victims and starts) and whether one for its models exists
    or all are taken, so a job that opened none then opens none now. Not for "held off by a
    reservation", which reads them."""
    if recorded is None:
        return False
    if recorded == token:
        return True
    return (
        recorded[0] == token[0]
        and recorded[2] == token[2]
        and recorded[3] == token[3]
        and recorded[1] <= token[1]
    )


class KnownOutcomes:
    def __init__(self, cycle: Cycle) -> None:
        # The cycle holds this object too: Cycle.run drops it after the passes, so that the reference
        # cycle does not outlive them. (Not a weak proxy: mypyc's compiled classes take no weak
        # references.)
        self.cycle = cycle
        # the cycle's parts this reads, held directly (none of them points back to the cycle)
        self.profile, self.preemptor, self.backfill = cycle.profile, cycle.preemptor, cycle.backfill
        self.assignments, self.no_fit, self.why = cycle.assignments, cycle.no_fit, cycle.verdicts.why
        self.failed = cycle.failed  # (shape, allowed models) that did not place in this cycle
        # groups with CPU or memory limits: their admission reads each job's CPUs and memory too
        self.limited = cycle.resources.groups if cycle.resources is not None else {}
        # failure key -> state in which a job of that key met "too few free GPUs" and changed
        # nothing (no reservation, no victims)
        self.short: dict[object, Token] = {}
        # admission key -> (state, GPU models quota allowed) of a job that passed the capacity test
        # and quota admission in that state
        self.admitted: dict[int, tuple[Token, frozenset[str] | None]] = {}
        # search key -> state in which a job of that key searched for victims and found no room
        self.searched: dict[object, Token] = {}
        # admission key -> state in which quota admission deferred a job of that key to the
        # borrowing pass (first pass only: the key holds the pass)
        self.deferred: dict[int, Token] = {}
        self.deferred_jobs = cycle.quota.deferred
        # quota_priority preemption with quotas (the default policy): fail_key is rank_id,
        # search_key search_id (outside capped groups) and admit_key 2 * admit_id + the pass
        self.plain = cycle.profile.quotas and cycle.profile.preemption not in ("none", "las")
        # groups with a per-user GPU cap: their search key holds the user (see search_key); none
        # without quotas (the search then reads no ledger)
        self.capped: set[str] = set()
        if cycle.profile.quotas:
            self.capped = {n for n, g in cycle.ledger.groups.items() if g.user_max_gpus is not None}

    # -- keys -----------------------------------------------------------------------------------
    def token(self) -> Token:
        """Changes whenever anything a replayed outcome reads may have changed: free capacity and
        quota (only commits and found victims change them for good; preemption searches and
        placement attempts restore them), reservations, victims and claimed draining room. Not the
        preemption attempts left: no outcome but "no attempt left" depends on them, and a replayed
        failed search spends one as the real one did."""
        pre = self.preemptor
        return (len(self.assignments), len(self.backfill.reservations), len(pre.victims), pre.claimed)

    def fail_key(self, job: Job, info: JobInfo) -> object:
        """Jobs with equal keys get the same quota admission, capacity test, reservation and
        preemption outcome in an unchanged state (the preemption search reads the group and
        priority, or the LAS queue; quota admission the group and preemptible, see
        `record_short`)."""
        p = self.profile
        fit = info.admit_id if p.quotas else info.fit_id  # (admit_id: fit_id, group, preemptible)
        if p.preemption == "none":
            return fit
        if p.preemption == "las":
            return (fit, las_queue(job.attained_gpu_seconds, p.las_thresholds))
        return info.rank_id

    def search_key(self, job: Job, info: JobInfo) -> object:
        """Jobs with equal keys get the same preemption search: the same candidates, and the same
        placement on the room they would leave (it reads the tasks, group, priority, may-borrow).
        Under a per-user cap the search reads the user's GPUs too (`Preemptor._fits_now`): with
        the victims released, so their owners count, not the user's usage alone. The key holds
        the user then; the state token fixes their usage (only commits and found victims change
        it for good)."""
        p = self.profile
        key: object = info.search_id
        if p.preemption == "las":
            key = (info.search_id, las_queue(job.attained_gpu_seconds, p.las_thresholds))
        if job.group in self.capped:
            return (key, job.user)
        return key

    def admit_key(self, job: Job, info: JobInfo) -> int:
        """Jobs with equal keys pass or fail the capacity test and quota admission alike in an
        unchanged state (without a per-user cap: that reads the user too)."""
        if not self.profile.quotas:
            return info.fit_id
        return 2 * info.admit_id + self.cycle.borrowing

    # -- recording ------------------------------------------------------------------------------
    def record_admitted(self, job: Job, info: JobInfo, allowed: frozenset[str] | None) -> None:
        self.admitted[self.admit_key(job, info)] = (self.token(), allowed)

    def record_deferred(self, job: Job, info: JobInfo) -> None:
        """Quota admission sent the job to the borrowing pass (no model within its guarantee):
        later jobs of its admission kind go there too until the state changes."""
        self.deferred[self.admit_key(job, info)] = self.token()

    def record_short(self, job: Job, info: JobInfo, token: Token, attempts_before: int) -> None:
        """After a job passed quota admission (or was sent to the borrowing pass, which would
        admit it), found too few free GPUs and had its reservation and preemption turn: when that
        changed nothing, later jobs of its failure key fail the same way until the state changes
        (about nine in ten jobs of a busy cycle). Their quota admission is the same then (the same
        group, GPUs, models and preemptible against the same ledger, or a looser one in the
        borrowing pass) unless it reads more than that: not recorded then."""
        if self.token() != token:
            return  # it reserved, or found victims: the next job of its kind must look again
        if job.group in self.limited:
            return  # its group's CPU or memory limit let it this far: the keys omit its CPUs and memory
        if self.preemptor.attempts_left == attempts_before:
            if job.group in self.capped:
                return  # the per-user cap let it this far: the failure key omits the user
            self.short[self.fail_key(job, info)] = token
        else:  # a search that found no room (in a capped group the search key holds the user, so
            # it fixes the cap's admission too: the state token fixes what the user holds)
            self.searched[self.search_key(job, info)] = token

    def ledger_loosened(self) -> None:
        """The starvation guard's pledges were released before the borrowing pass: the ledger
        changed with no new state token, so the failures recorded in the first pass (which may
        have read the pledged quota: admission, the victims' pre-check, the search) are forgotten.
        The other records hold the pass in their key."""
        self.short.clear()
        self.searched.clear()

    # -- replaying ------------------------------------------------------------------------------
    def replay(self, job: Job, info: JobInfo, token: Token) -> bool:
        """Give `job` the outcome an earlier job of its kind had in this same state (`token`):
        "too few free GPUs" with nothing to reserve or preempt, a preemption search that found no
        room (one attempt spent), or admitted and then held off by a backfill reservation (checked
        against its own runtime). False when no such outcome is known; then the job takes the
        ordinary path (`Cycle.consider`), which records what it finds."""
        # (`_holds` only when the state differs: most look-ups find nothing or the same state)
        plain = self.plain  # the keys read straight off the JobInfo (what the key methods give)
        if self.short:
            rec = self.short.get(info.rank_id if plain else self.fail_key(job, info))
            if rec is not None and (rec == token or _holds(rec, token)):
                self.no_fit.add(job.id)
                return True
        if self.searched:
            plain_search = plain and job.group not in self.capped
            rec = self.searched.get(info.search_id if plain_search else self.search_key(job, info))
            if rec is not None and (rec == token or _holds(rec, token)):
                self.no_fit.add(job.id)
                self._spend_attempt()
                return True
        if not self.deferred and not self.admitted:
            return False
        key = 2 * info.admit_id + self.cycle.borrowing if plain else self.admit_key(job, info)
        if self.deferred:
            rec = self.deferred.get(key)
            if rec is not None and (rec == token or _holds(rec, token)):
                self.deferred_jobs.append(job)
                return True
        return self._replay_held_off(job, info, token, key)

    def _spend_attempt(self) -> None:
        """What a preemption search that finds no room leaves behind: one attempt fewer."""
        pre = self.preemptor
        if pre.attempts_left > 0:
            pre.attempts_left -= 1

    def _replay_held_off(self, job: Job, info: JobInfo, token: Token, key: int) -> bool:
        admitted = self.admitted.get(key)
        if admitted is None or admitted[0] != token:
            return False
        if not self.backfill.reservations:
            return False  # nothing holds it off (what reserved_for_others would say)
        backfill = self.backfill
        reserved, blocking = backfill.reserved_for_others(job, info)
        if blocking is None:
            return False
        if job.group in self.limited:
            return False
        allowed = admitted[1]
        left = (info.model_set if allowed is None else allowed) - reserved
        if left and (info.sig, left) not in self.failed:
            return False  # other models are left to it: the ordinary path may place it there
        # (when its shape already failed on the models left, the ordinary path's placement fails
        # again, as it does in `Cycle.place`, and the reservation is the reason it waits)
        self.why[job.id] = backfill.reason(blocking)
        return True

    def skip_run(self, token: Token, borrowing: bool) -> None:
        """Take the jobs the queue gives next (while nothing is placed) as far as each meets an
        outcome already known in this state: the same as popping and replaying them one by one,
        at a fraction of the cost (a busy cycle has ~250 such jobs)."""
        c = self.cycle
        queue, ledger, st, preemptor = c.queue, c.ledger, c.st, c.preemptor
        if st.free_sum == 0 and queue.cpu_only_left == 0 and not preemptor.possible:
            return  # the job just replayed spent the last preemption attempt: the pass stops
        rest = queue.run_ahead()
        if not rest:
            return
        limit = len(rest)
        if c.backfill.reservations:  # each of them would count against the backfill depth
            limit = max(0, min(limit, c.profile.backfill_depth - c.behind_head))
        parking = c.profile.quotas and not borrowing
        memo = c.infos.memo
        keyed = c.profile.preemption == "las" or bool(self.capped)  # else the key is search_id
        no_fit_add, search_key = c.no_fit.add, self.search_key
        now, default_s, why = c.now, c.profile.default_runtime_s, c.verdicts.why
        full: dict[str, bool] = {}  # group -> no guaranteed quota left (unchanged while skipping)
        decided: dict[object, object] = {}  # search key (the finest kind) -> decide's outcome
        n = 0
        for job in islice(rest, limit):
            hit = memo.get(id(job))
            if hit is None or hit[0] is not job:
                break  # first seen: take the ordinary path
            info = hit[1]
            if info.never:
                break  # never fits: the ordinary path says why
            if parking:
                no_room = full.get(job.group)
                if no_room is None:
                    no_room = full[job.group] = not ledger.headroom(job.group)
                if no_room and ledger.may_borrow(job):
                    break  # it would be parked for the borrowing pass
            kind = search_key(job, info) if keyed else info.search_id
            outcome = decided.get(kind)
            if outcome is None:
                outcome = decided[kind] = self._decide(job, info, token)
            if outcome is _SHORT:  # the usual outcome first
                no_fit_add(job.id)
            elif outcome is _SEARCHED:
                no_fit_add(job.id)
                self._spend_attempt()
                if st.free_sum == 0 and queue.cpu_only_left == 0 and not preemptor.possible:
                    n += 1
                    break  # no attempts left: the pass stops here (see Cycle.run_pass)
            elif outcome is _DEFERRED:
                self.deferred_jobs.append(job)
            elif outcome is _EACH:
                if not self._replay_held_off(job, info, token, self.admit_key(job, info)):
                    break
            elif outcome is _UNKNOWN:
                break
            else:  # held off when it would still run at the reservation's start
                start, reason = cast(HeldOff, outcome)  # (alias: no generic built per job)
                estimate = job.runtime_estimate  # the end Backfill.reserved_for_others computes
                if not now + (default_s if estimate is None else estimate) > start:
                    break
                why[job.id] = reason
            n += 1
        if n:
            c.visited.extend(queue.skip(n))
            if c.backfill.reservations:
                c.behind_head += n

    def _decide(self, job: Job, info: JobInfo, token: Token) -> object:
        """What `replay` does with every job of this one's search key (the finest kind: it fixes
        the failure and admission keys too) in state `token`: _SHORT, _SEARCHED, a
        `_held_off_rule`, _EACH (ask _replay_held_off job by job) or _UNKNOWN."""
        if _holds(self.short.get(self.fail_key(job, info)), token):
            return _SHORT
        if _holds(self.searched.get(self.search_key(job, info)), token):
            return _SEARCHED
        if self.deferred and _holds(self.deferred.get(self.admit_key(job, info)), token):
            return _DEFERRED
        rule = self._held_off_rule(self.admit_key(job, info), info, token)
        return _EACH if rule is True else _UNKNOWN if rule is False else rule

    def _held_off_rule(self, key: int, info: JobInfo, token: Token) -> tuple[float, Reason] | bool:
        """How `_replay_held_off` decides for jobs of this admission key now: False, never (not
        known admitted, or no reservation it could delay would take all its models); (start,
        reason) when one reservation alone decides: held off when the job would still run at
        `start`; True when several do (then ask `_replay_held_off` job by job)."""
        admitted = self.admitted.get(key)
        if admitted is None or admitted[0] != token or info.total <= 0:
            return False
        relevant = [r for r in self.backfill.reservations if info.total > r.extra]
        if len(relevant) != 1:
            return bool(relevant)
        r = relevant[0]
        allowed = admitted[1]
        left = (info.model_set if allowed is None else allowed) - r.models
        if left:  # job by job, when its shape failed on the models left (see _replay_held_off)
            return (info.sig, left) in self.failed
        return (r.start, self.backfill.reason(r))
