"""EASY backfill: a job that does not fit reserves the time its GPU-model pool frees up (the shadow
time); later jobs may start before it only if they end by then or use GPUs it will not need.
Also the cycle's timeline of when GPUs come back (`events`), which estimated starts read too."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter

from corral.scheduler.admission import runtime_of
from corral.scheduler.cluster import ClusterState
from corral.scheduler.jobinfo import JobInfo
from corral.scheduler.placement import Placed
from corral.scheduler.profiles import Profile, grace_of
from corral.scheduler.types import Job, Reason, RunningJob

Event = tuple[float, Mapping[str, int]]  # (time GPUs come back, GPUs per model)


@dataclass(slots=True)
class Reservation:
    """The head job of a model pool starts at `start`; `extra` GPUs of the pool are free then
    beyond what it needs, so later jobs may hold that many past `start`."""

    job_id: str
    models: frozenset[str]
    start: float
    extra: int
    reason: Reason | None = None  # the backfill_would_delay reason it gives, made once

    def __init__(  # written out, as in types.py (one per reservation)
        self, job_id: str, models: frozenset[str], start: float, extra: int, reason: Reason | None = None
    ) -> None:
        self.job_id = job_id
        self.models = models
        self.start = start
        self.extra = extra
        self.reason = reason


class Backfill:
    """The cycle's reservations and its timeline of GPUs coming back."""

    def __init__(
        self,
        now: float,
        profile: Profile,
        st: ClusterState,
        running: list[tuple[RunningJob, dict[str, int]]],
        victims: Mapping[str, float],
    ) -> None:
        self.now, self.profile, self.st, self.running = now, profile, st, running
        self.victims = victims  # the preemptor's: job id -> when it is gone at the latest
        self.reservations: list[Reservation] = []
        self.started: list[Event] = []  # jobs started this cycle, at their estimated end
        self._ends: tuple[int, list[Event]] | None = None  # running jobs' ends, per victim count
        # events() sorted by time, per (victim count, jobs started): reserve() reads it for every
        # job that opens a reservation, and both counts only grow within a cycle
        self._sorted: tuple[tuple[int, int], list[Event]] | None = None

    def record_start(self, job: Job, gpus_by_model: dict[str, int]) -> None:
        self.started.append((self.now + runtime_of(job, self.profile.default_runtime_s), gpus_by_model))

    def events(self) -> list[Event]:
        """When GPUs come back: running jobs at their estimated end (victims after their grace),
        jobs started this cycle after their estimate."""
        victims = self.victims
        if self._ends is None or self._ends[0] != len(victims):
            self._ends = (len(victims), self._running_ends())
        return self._ends[1] + self.started

    def sorted_events(self) -> list[Event]:
        """events() in time order (a stable sort: equal times keep events()' order)."""
        key = (len(self.victims), len(self.started))
        if self._sorted is None or self._sorted[0] != key:
            self._sorted = (key, sorted(self.events(), key=itemgetter(0)))
        return self._sorted[1]

    def _running_ends(self) -> list[Event]:
        now, profile, victims = self.now, self.profile, self.victims
        default_s = profile.default_runtime_s
        out: list[Event] = []
        for rj, per_model in self.running:
            job = rj.job
            if victims and not rj.stopping:
                gone = victims.get(job.id)
                if gone is not None:
                    out.append((gone, per_model))
                    continue
            estimate = job.runtime_estimate  # runtime_of, inlined: this runs for every running job
            end = rj.start_time + (default_s if estimate is None else estimate)
            if rj.stopping:  # asked to stop earlier: gone by the end of its grace at the latest
                stops_by = rj.stops_by
                end = min(end, now + grace_of(job, profile) if stops_by is None else stops_by)
            out.append((now if now > end else end, per_model))  # max(end, now)
        return out

    def reserve(self, job: Job, models: frozenset[str]) -> None:
        """Find when the head job could start (shadow time) if everything ends as estimated."""
        avail = sum(self.st.free_total.get(m, 0) for m in models)
        need = job.total_gpus
        start = self.now
        if avail < need:
            for end, per_model in self.sorted_events():
                avail += sum(n for m, n in per_model.items() if m in models)
                if avail >= need:
                    start = end
                    break
            else:
                return  # it cannot start even when everything running ends: nothing to protect
        self.reservations.append(Reservation(job.id, models, start, avail - need))

    def reserved_for_others(self, job: Job, info: JobInfo) -> tuple[frozenset[str], Reservation | None]:
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

    def reason(self, r: Reservation) -> Reason:
        if r.reason is None:  # one per reservation: many jobs wait behind the same one
            # a clock time (it printed unix seconds: "at 1795988498"), not "in ~10 min": the text is
            # stored with the diagnosis, which is rewritten whenever its text changes, so a relative
            # time would rewrite every held job's row each minute and read stale in between
            start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(r.start))
            r.reason = Reason(
                "backfill_would_delay",
                "admission:backfill",
                f"starting now would delay job {r.job_id}, reserved to start at about {start}",
            )
        return r.reason

    def blocker(self, job: Job, placed: Placed) -> Reservation | None:
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
