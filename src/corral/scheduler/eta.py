"""Estimated starts by conservative backfill over per-model timelines (`Profile.eta_roll =
"backfill"`, the default).

Each GPU model is a timeline of free GPUs: what is free now, plus what running jobs give back at
their expected end. A running job's expected end is its *remaining* time given how long it has
already run (`remaining_s`): runtimes are heavy-tailed, so a job that has outrun its estimate is
not about to end; it is likely to run about as long again. Waiting jobs, in the scheduler's own
order, each take the earliest stretch of one of their models' timelines with room for their GPUs
for their estimated runtime, and hold it. A job never waits for an earlier job's start unless it
needs the earlier job's GPUs (unlike a strict FIFO walk, which makes every estimate behind a large
gang as late as the gang's), and never takes GPUs an earlier job holds (the scheduler's
reservations protect the jobs ahead of it).

The timeline ignores how free GPUs are spread over nodes and the groups' quotas: a job that waits
for its quota or its user's cap gets no time at all (diagnosis.py says why instead).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from statistics import NormalDist

import numpy as np

from corral.scheduler.jobinfo import Waiting
from corral.scheduler.types import RunningJob

Event = tuple[float, Mapping[str, int]]  # (time GPUs come back, GPUs per model)

IQR_Z = 1.3489795  # the interquartile range of a standard normal
SIGMA_MIN = 0.8  # log-spread assumed when the runs agree (one run, or a few alike): still a guess
_NORMAL = NormalDist()


def _sigma(spread: tuple[float, float]) -> float:
    """The log-normal spread whose quartiles are `spread` (at least SIGMA_MIN)."""
    low, high = spread
    if low > 0 and high > low:
        return max(SIGMA_MIN, (math.log(high) - math.log(low)) / IQR_Z)
    return SIGMA_MIN


def remaining_s(estimate: float, spread: tuple[float, float] | None, elapsed: float, q: float = 0.5) -> float:
    """The median remaining runtime of a job estimated at `estimate` s (the median of its kind's
    runs; `spread` their 25th and 75th percentiles) that has run `elapsed` s so far.

    Runtimes are taken as log-normal with that median and spread: the answer is the median of
    (D - elapsed) given D > elapsed (its `q` quantile: 0.25 and 0.75 for an estimate's range).
    Without a spread (a user's limit, or no history) the old rule:
    estimate - elapsed, at least 0."""
    if spread is None or estimate <= 0:
        return max(0.0, estimate - elapsed)
    sigma = _sigma(spread)
    mu = math.log(estimate)
    if elapsed <= 0:
        return estimate if q == 0.5 else math.exp(mu + sigma * _NORMAL.inv_cdf(q))
    survive = 1.0 - _NORMAL.cdf((math.log(elapsed) - mu) / sigma)  # P(D > elapsed)
    if survive <= 1e-12:  # far past anything its kind ever ran: about as long again
        return elapsed
    end = math.exp(mu + sigma * _NORMAL.inv_cdf(1.0 - survive * (1.0 - q)))
    return max(0.0, end - elapsed)


class Timeline:
    """Free GPUs of one model over time: free[i] holds from times[i] until times[i + 1] (the last,
    i = size - 1, for ever). Arrays with room to grow, so that checking or taking a long stretch
    is one vector operation and a new breakpoint one move of the tail."""

    __slots__ = ("free", "size", "times")

    def __init__(self, now: float, free_now: int, returns: Sequence[tuple[float, int]]) -> None:
        times, free = [now], [free_now]
        for t, n in returns:  # sorted by time
            if t <= times[-1]:
                free[-1] += n
            else:
                times.append(t)
                free.append(free[-1] + n)
        self.size = len(times)
        room = 2 * self.size + 64
        self.times = np.empty(room, dtype=np.float64)
        self.free = np.empty(room, dtype=np.int64)
        self.times[: self.size] = times
        self.free[: self.size] = free

    def earliest(self, need: int, runtime: float, not_before: float) -> int:
        """Index of the first time, not before `not_before`, from which `need` GPUs stay free for
        `runtime` s; -1: never."""
        i = self.split(not_before) if not_before > self.times[0] else 0
        k = self.size
        times, free = self.times[:k], self.free[:k]
        while i < k:
            room = free[i:] >= need
            first = int(room.argmax())
            if not room[first]:
                return -1
            i += first
            j = int(times.searchsorted(times[i] + runtime, "left"))  # the stretch: [i, j)
            short = free[i:j] < need
            if not short.any():
                return i
            i = j - int(short[::-1].argmax())  # past the last shortfall: any start before it meets it
        return -1

    def split(self, t: float) -> int:
        """The index of a breakpoint at `t` (> times[0]), made if there is none."""
        k = self.size
        times = self.times
        j = int(times[:k].searchsorted(t, "left"))
        if j < k and times[j] == t:
            return j
        if k == len(times):  # full: double the room
            self.times = times = np.concatenate([times, np.empty(k, dtype=np.float64)])
            self.free = np.concatenate([self.free, np.empty(k, dtype=np.int64)])
        free = self.free
        times[j + 1 : k + 1] = times[j:k].copy()
        free[j + 1 : k + 1] = free[j:k].copy()
        times[j] = t
        free[j] = free[j - 1]
        self.size = k + 1
        return j

    def take(self, i: int, need: int, runtime: float) -> None:
        """Hold `need` GPUs from times[i] for `runtime` s."""
        j = self.split(float(self.times[i]) + runtime)
        self.free[i:j] -= need


def backfill_starts(
    now: float,
    free_by_model: Mapping[str, int],
    capacity_by_model: Mapping[str, int],
    events: Sequence[Event],
    waiting: Sequence[Waiting],
    default_runtime_s: float,
    in_order: bool = False,
) -> dict[str, float | None]:
    """Each waiting job's estimated start: the earliest time one of its models has room for it for
    its runtime, after the jobs before it took theirs. `events` in any order. `in_order` (strict
    FIFO, where nothing passes a job that does not fit): never before the job ahead of it."""
    wanted = {m for w in waiting if w[1] > 0 for m in w[2]}
    returns: dict[str, list[tuple[float, int]]] = {m: [] for m in wanted}
    for end, per_model in sorted(events, key=lambda e: e[0]):
        for m, n in per_model.items():
            found = returns.get(m)
            if found is not None and n:
                found.append((end, n))
    lines = {m: Timeline(now, free_by_model.get(m, 0), returns[m]) for m in wanted}
    out: dict[str, float | None] = {}
    floor = now
    for job_id, need, models, runtime in waiting:
        if need <= 0:
            out[job_id] = floor
            continue
        hold = default_runtime_s if runtime is None else max(runtime, 1.0)
        best: tuple[float, Timeline, int] | None = None
        for m in models:
            if need > capacity_by_model.get(m, 0):
                continue
            line = lines[m]
            i = line.earliest(need, hold, floor)
            if i >= 0 and (best is None or line.times[i] < best[0]):
                best = (float(line.times[i]), line, i)
        if best is None:  # no single model ever holds it: cannot tell
            out[job_id] = None
            continue
        start, line, i = best
        line.take(i, need, hold)
        out[job_id] = start
        if in_order:
            floor = start
    return out


def running_events(
    now: float,
    running: Sequence[tuple[RunningJob, Mapping[str, int]]],
    started: Sequence[Event],
    gone_by: Mapping[str, float],
    default_runtime_s: float,
    q: float = 0.5,
) -> list[Event]:
    """When running jobs give their GPUs back: victims and jobs asked to stop when they are gone
    (`gone_by`), the others after their median remaining time (`remaining_s`); jobs started this
    cycle (`started`) as the scheduler put them."""
    out: list[Event] = []
    for rj, per_model in running:
        gone = gone_by.get(rj.job.id)
        if gone is not None:
            out.append((max(now, gone), per_model))
            continue
        job = rj.job
        estimate = default_runtime_s if job.runtime_estimate is None else job.runtime_estimate
        spread = job.runtime_spread if job.runtime_estimate is not None else None
        out.append((now + remaining_s(estimate, spread, now - rj.start_time, q), per_model))
    out.extend(started)
    return out


def through_last(waiting: Sequence[Waiting], targets: Collection[str] | None) -> Sequence[Waiting]:
    """`waiting` up to and including the last job named in `targets` (all of it if one is
    missing, or without targets)."""
    if targets is None:
        return waiting
    wanted = set(targets)
    for i, w in enumerate(waiting):
        if w[0] in wanted:
            wanted.discard(w[0])
            if not wanted:
                return waiting[: i + 1]
    return waiting
