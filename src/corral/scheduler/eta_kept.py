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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import is_
from typing import TYPE_CHECKING

from corral.scheduler.backfill import Event
from corral.scheduler.eta import BackfillRoll
from corral.scheduler.jobinfo import Waiting
from corral.scheduler.profiles import Profile
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


class KeptRolls:
    """The Scheduler's kept roll (at most one): continued by later cycles while it holds."""

    __slots__ = ("kept", "reused")

    def __init__(self) -> None:
        self.kept: KeptRoll | None = None
        self.reused = 0  # rolls continued rather than built (for tests and benches)

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
        if len(running) != len(kept.running) or not all(map(is_, running, kept.running)):
            return False
        if len(jobs) <= len(placed) or not all(map(is_, jobs, placed)):  # (map stops at placed's end)
            return False
        return cycle.st.free_total == kept.roll.free_by_model
