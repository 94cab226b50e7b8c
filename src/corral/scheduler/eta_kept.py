"""The estimated-start roll kept across cycles (`Profile.eta_reuse_s`): what the simulator reads
for its new jobs, without rolling every job ahead of them again at every arrival.

A targeted roll (`LazyDiagnoses.estimated_starts`) places the jobs in the expected start order up
to the last job asked for, on timelines built from the running jobs' expected ends at `now`. The
Scheduler keeps the last such roll (its timelines after those placements, the jobs it placed, and
what it was built from). A later cycle continues it instead of rolling from scratch when

- it is at most `eta_reuse_s` later than the cycle that built the roll (`now` never goes back);
- the cycle has the same profile and nodes tuple, the very same running jobs (RunningJob objects:
  none started, ended, was preempted or asked to stop since), the same free GPUs per model, and
  it placed and preempted nothing itself (a start or a victim changes the timelines);
- the cycle's own expected start order begins with exactly the jobs the kept roll placed, in the
  same order (the same Job objects: none left the queue, changed or was passed by a new arrival),
  and its targets come after them.

Then only the jobs after those are placed, on the kept timelines, and every start the continued
roll gives is read `now - kept now` later (as if each running job's expected remaining time had
stayed what it was; a fresh roll's would have grown a little for a job with a spread that has run
long, and shrunk for one without a spread). So nothing is told a start before `now`, and a job
told `now` gets the first return of GPUs after it, as from a fresh roll (`diagnosis._not_now`).
This is not exact: the estimates differ a little from a fresh roll's (the expected ends as said,
and the order is checked, not the group shares behind it; the effect on the simulator's ETA
figure is measured in docs/simulator.md, "Thirteenth round" and "Sixteenth round": less than 0.5
points either way on every trace measured, so the `default` profile has it on at 60 s).
`eta_reuse_s = 0` (the other profiles) rolls from scratch every time (a fresh Scheduler's
estimates). The full set of diagnoses (`LazyDiagnoses`
iterated, `one`, `estimated_start`: what the live server shows) never uses a kept roll.

The expected start order itself is exact either way: a targeted read (with `eta_reuse_s` > 0,
fair share) takes the last such read's popped jobs as its own first pops without popping them
only where `KeptOrder`'s rule shows they come first, and pops as before otherwise (`OrderRecorder`;
docs/simulator.md, "Sixteenth round").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import is_
from typing import TYPE_CHECKING

from corral.scheduler.backfill import Event
from corral.scheduler.eta import BackfillRoll
from corral.scheduler.jobinfo import Waiting
from corral.scheduler.profiles import Profile
from corral.scheduler.queues import FairShareQueue
from corral.scheduler.types import Job, Node, RunningJob

if TYPE_CHECKING:
    from corral.scheduler.core import Cycle


@dataclass(slots=True)
class KeptRoll:
    """A targeted roll and what it was built from."""

    roll: BackfillRoll  # its `now` is the building cycle's (the timelines' origin), its
    # `free_by_model` that cycle's free GPUs (copied; placing only reads it)
    profile: Profile
    nodes: tuple[Node, ...]
    running: tuple[RunningJob, ...]
    placed: list[Job]  # the jobs it placed, in the order placed

    def __init__(  # written out, as in types.py (one per targeted roll)
        self,
        roll: BackfillRoll,
        profile: Profile,
        nodes: tuple[Node, ...],
        running: tuple[RunningJob, ...],
        placed: list[Job],
    ) -> None:
        self.roll = roll
        self.profile = profile
        self.nodes = nodes
        self.running = running
        self.placed = placed


class KeptRolls:
    """The Scheduler's kept roll (at most one): continued by later cycles while it holds."""

    __slots__ = ("kept", "order", "reused", "skipped")

    def __init__(self) -> None:
        self.kept: KeptRoll | None = None
        self.order: KeptOrder | None = None  # the last targeted read's expected-start order
        self.reused = 0  # rolls continued rather than built (for tests and benches)
        self.skipped = 0  # jobs of the expected-start order taken from `order` without popping

    def place(
        self,
        cycle: Cycle,
        jobs: Sequence[Job],
        waiting: Sequence[Waiting],
        events: Callable[[], list[Event]],
    ) -> tuple[dict[str, float | None], Sequence[Waiting], BackfillRoll, float]:
        """The estimated starts of `waiting` (`jobs[i]`'s eta is `waiting[i]`, the expected start
        order through the last target), from the kept roll where it holds, else from a new one
        (kept in its place). Returns the starts of the jobs it placed (those past the kept ones) on
        the roll's timelines, those jobs' entries, the roll, and how long after the roll's own now
        this cycle's is (0.0 for a new roll)."""
        kept = self.kept
        done = 0
        if kept is not None and self._holds(kept, cycle, jobs):
            done = len(kept.placed)
            self.reused += 1
        else:
            st, profile = cycle.st, cycle.profile
            roll = BackfillRoll(
                cycle.now,
                st.free_total,
                st.capacity,
                events(),
                profile.default_runtime_s,
                profile.head_of_line_blocking,
            )
            snapshot = cycle.snapshot
            kept = self.kept = KeptRoll(roll, profile, snapshot.nodes, snapshot.running, [])
        new = waiting[done:]
        found = kept.roll.place(new)
        kept.placed.extend(jobs[done:])
        return found, new, kept.roll, cycle.now - kept.roll.now if done else 0.0

    @staticmethod
    def _holds(kept: KeptRoll, cycle: Cycle, jobs: Sequence[Job]) -> bool:
        """Whether `cycle` may continue `kept` (the rules in the module's docstring)."""
        profile, now, snapshot = cycle.profile, cycle.now, cycle.snapshot
        if kept.profile is not profile or not 0.0 <= now - kept.roll.now <= profile.eta_reuse_s:
            return False
        if cycle.assigned_ids or cycle.preemptions or snapshot.nodes is not kept.nodes:
            return False
        running, placed = snapshot.running, kept.placed
        if running is not kept.running and (
            len(running) != len(kept.running) or not all(map(is_, running, kept.running))
        ):
            return False
        if len(jobs) <= len(placed) or not all(map(is_, jobs, placed)):  # (map stops at placed's end)
            return False
        return cycle.st.free_total == kept.roll.free_by_model


# Float slack of the order check, relative to the shares' size: a share is a sum of at most
# eta_limit charges and one base, each rounded once (relative error ~1e-16 each), so a margin
# that clears the check by 1e-7 of the shares' size clears it in exact arithmetic too.
SLACK = 1e-7


@dataclass(slots=True)
class KeptOrder:
    """The expected-start order a targeted read popped (`DiagnosisView._eta_order`), with what a
    later cycle needs to show, without popping, that its own order begins with the same jobs.

    Why that can be shown: the order is a fair-share queue; at each pop the group with the least
    share goes first, then (alone in its group here) its user's next job, and the popped job's
    cost is added to its group's share. A later cycle's queue starts from other shares (past usage
    decays and running work accrues with `now`: each group's base moves by its own `d_g`), but
    charges the same jobs the same amounts. So while every group the pops took from has a single
    user whose list still begins with the jobs popped from it, each pop's winner still has the
    least share if the least margin over the pops (`margin`: next share minus the winner's, at
    each pop) exceeds the spread of the d_g; and a group that had no job left at some pop but has
    one now (a new arrival) does not win there if its share exceeds every winner's (`top`) moved
    by the largest d_g. Both with a float slack (SLACK)."""

    jobs: list[Job]  # popped, in order
    by_group: dict[str, list[Job]]  # the same per group, in order
    base: dict[str, float]  # each group's share before the first pop
    weights: Mapping[str, float]
    horizon: float
    counts: dict[str, int]  # waiting jobs per group in the queue before the first pop
    margin: float  # at most the least (least other group's share - the popped group's) at a pop
    top: float  # at least the greatest popped group's share at its pop
    uncharged: bool  # a popped job was not charged (unschedulable)

    def __init__(  # written out, as in types.py (one per targeted read)
        self,
        jobs: list[Job],
        by_group: dict[str, list[Job]],
        base: dict[str, float],
        weights: Mapping[str, float],
        horizon: float,
        counts: dict[str, int],
        margin: float,
        top: float,
        uncharged: bool,
    ) -> None:
        self.jobs = jobs
        self.by_group = by_group
        self.base = base
        self.weights = weights
        self.horizon = horizon
        self.counts = counts
        self.margin = margin
        self.top = top
        self.uncharged = uncharged


class OrderRecorder:
    """One targeted read's pops of the expected-start queue: first the kept order's jobs taken
    without popping where `KeptOrder` shows they come first (`skip`), then each pop recorded
    (`popped`, before its charge), and the new KeptOrder (`record`)."""

    __slots__ = ("base", "by_group", "margin", "never", "queue", "skipped", "top", "uncharged")

    def __init__(self, queue: FairShareQueue, never: Mapping[str, object]) -> None:
        self.queue = queue
        self.never = never
        self.base = dict(queue.group_share)
        self.by_group: dict[str, list[Job]] = {}
        self.margin = math.inf
        self.top = -math.inf
        self.uncharged = False
        self.skipped = 0  # jobs taken from the kept order without popping (for tests and benches)

    def popped(self, job: Job) -> None:
        """Record a pop (before its charge): the margin to the next group, the winner's share."""
        queue = self.queue
        share = queue.group_share[job.group]
        heap = queue.group_heap
        if heap:
            gap = heap[0][0] - share
            if gap < self.margin:
                self.margin = gap
        if share > self.top:
            self.top = share
        jobs = self.by_group.get(job.group)
        if jobs is None:
            self.by_group[job.group] = [job]
        else:
            jobs.append(job)
        if job.id in self.never:
            self.uncharged = True

    def record(self, order: list[Job]) -> KeptOrder:
        queue = self.queue
        counts = {g: sum(len(q) for q in users.values()) for g, users in queue.users.items()}
        for g, jobs in self.by_group.items():  # (the lists hold what is left: add what was popped)
            counts[g] = counts.get(g, 0) + len(jobs)
        return KeptOrder(
            list(order),
            self.by_group,
            self.base,
            queue.weights,
            queue.horizon,
            counts,
            self.margin,
            self.top,
            self.uncharged,
        )

    def skip(self, kept: KeptOrder | None, order: list[Job], seen: set[str], limit: int) -> None:
        """Take `kept`'s jobs as this queue's first pops (into `order` and `seen`, charged, the
        queue left as after those pops) where KeptOrder's rule shows they come first; else
        nothing (the caller pops them)."""
        if kept is None or not kept.jobs or kept.uncharged or len(kept.jobs) >= limit:
            return
        queue = self.queue
        if queue.horizon != kept.horizon or queue.weights != kept.weights:
            return
        users = queue.users
        for g, jobs in kept.by_group.items():  # one user per group popped, its list begins with them
            per_user = users.get(g)
            if per_user is None or len(per_user) != 1:
                return
            q = next(iter(per_user.values()))
            if len(q) < len(jobs) or not all(map(is_, q, jobs)):
                return
        never = self.never
        if never and any(j.id in never for j in kept.jobs):
            return
        shares = self._after(kept)
        if shares is None:
            return
        for g, jobs in kept.by_group.items():
            u, q = next(iter(users[g].items()))
            for _ in jobs:
                job = q.popleft()
                if job.id in queue.cpu_ids:
                    queue.cpu_only_left -= 1
            queue.group_share[g], queue.user_share[(g, u)] = shares[g]
        queue.taken(kept.by_group.keys())
        order.extend(kept.jobs)
        seen.update(j.id for j in kept.jobs)
        self.by_group = kept.by_group  # (the kept record is done with: its lists go on here)
        self.skipped = len(kept.jobs)

    def _after(self, kept: KeptOrder) -> dict[str, tuple[float, float]] | None:
        """Each popped group's (share, its user's share) after `kept`'s pops, charged as
        FairShareQueue.charge would (the same operations in the same order, so the same floats),
        where the rule holds; None where it does not. Sets this record's bounds in the new frame."""
        queue = self.queue
        base, old = self.base, kept.base
        moved = [base[g] - old[g] for g in base if g in old]
        spread = max(moved) - min(moved) if moved else 0.0
        lift = max(base[g] - old[g] for g in kept.by_group)  # every popped group is in both
        scale = max(abs(v) for v in base.values()) + max(abs(v) for v in old.values()) + abs(kept.top)
        slack = SLACK * (1.0 + scale + spread)
        if not kept.margin > spread + slack:
            return None
        shares: dict[str, tuple[float, float]] = {}
        weights, horizon = queue.weights, queue.horizon
        for g, jobs in kept.by_group.items():
            u = next(iter(queue.users[g]))
            share = queue.group_share.get(g, 0.0)
            mine = queue.user_share.get((g, u), 0.0)
            for job in jobs:
                cost = max(job.total_gpus, 0) * horizon
                share = share + cost / max(weights.get(g, 1.0), 1e-9)
                mine = mine + cost
            shares[g] = (share, mine)
        bar = kept.top + lift + slack  # a share above it loses to every pop's winner
        for g, per_user in queue.users.items():
            count = sum(len(q) for q in per_user.values())
            had = kept.counts.get(g)
            popped = len(kept.by_group.get(g, ()))
            if count == 0 or (had is not None and (count <= had or had > popped)):
                continue  # present at no pop it was absent from
            if not (shares[g][0] if g in shares else queue.group_share[g]) > bar:
                return None
        self.margin = kept.margin - spread - slack
        self.top = bar
        return shares
