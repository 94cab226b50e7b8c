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
for its quota or its user's cap gets no time at all (diagnosis.py says why instead). It holds no
CPUs or memory: a job that waits for those is raised to when a node has them free (eta_cpu.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from operator import itemgetter
from statistics import NormalDist

import numpy as np

from corral.scheduler.jobinfo import Waiting
from corral.scheduler.types import RunningJob

Event = tuple[float, Mapping[str, int]]  # (time GPUs come back, GPUs per model)

IQR_Z = 1.3489795  # the interquartile range of a standard normal
SIGMA_MIN = 0.8  # log-spread assumed when the runs agree (one run, or a few alike): still a guess
_NORMAL = NormalDist()
_min = np.minimum.reduce  # without ndarray.min's Python wrapper: this runs for every job


def _inv_cdf_plain(p: float, mu: float, sigma: float) -> float:
    return NormalDist(mu, sigma).inv_cdf(p)


# NormalDist().inv_cdf(p) is statistics' own _normal_dist_inv_cdf (C where Python has it) with mu 0
# and sigma 1, after checking 0 < p < 1, which every call here meets (q in (0, 1), survive in
# (1e-12, 1]): called directly, without the method's call and checks (runs for every running job)
_inv_cdf_at: Callable[[float, float, float], float] = getattr(
    statistics, "_normal_dist_inv_cdf", _inv_cdf_plain
)
_SQRT2 = math.sqrt(2.0)
_LOG_NORMAL: dict[tuple[float, tuple[float, float]], tuple[float, float]] = {}  # (mu, sigma) memo
_LOG_NORMAL_MAX = 1 << 16
# Far past its kind's runs the log-normal's tail is too thin: a job that ran 10x its kind's median
# is given a small part of that again (a 1 s kind's `sleep 600`: seconds), while real runtimes are
# heavier-tailed. Past this quantile of its kind (P(D > elapsed) <= TAIL_SURVIVE) a running job's
# remaining time is at least TAIL_FACTOR x elapsed (x q / (1 - q) at the q quantile of a range: a
# tail in which running twice as long is as likely as ending; docs/simulator.md "Round 4")
TAIL_SURVIVE = 0.01
TAIL_FACTOR = 0.5
# A job past its own time limit is being stopped: the engines give it a few seconds more (Slurm
# 10 s, local 5 s) and the reconcile loop sees it end at its next poll. What is left is about this,
# not 0, which would tell the jobs waiting for its GPUs "now" at every cycle until it is gone.
LIMIT_STOP_S = 30.0
FIRST_RUNS = 8  # runs of room a search checks one by one before checking all the rest at once
# a search reads a timeline's room from a list up to this many breakpoints, past it from one vector
# comparison (Timeline._runs_in_list, _runs_in_bytes: the same answer)
LIST_SCAN_MAX = 256


def _sigma(spread: tuple[float, float]) -> float:
    """The log-normal spread whose quartiles are `spread` (at least SIGMA_MIN)."""
    low, high = spread
    if low > 0 and high > low:
        return max(SIGMA_MIN, (math.log(high) - math.log(low)) / IQR_Z)
    return SIGMA_MIN


def remaining_s(
    estimate: float,
    spread: tuple[float, float] | None,
    elapsed: float,
    q: float = 0.5,
    is_limit: bool = False,
) -> float:
    """The median remaining runtime of a job estimated at `estimate` s (the median of its kind's
    runs; `spread` their 25th and 75th percentiles) that has run `elapsed` s so far.

    Runtimes are taken as log-normal with that median and spread: the answer is the median of
    (D - elapsed) given D > elapsed (its `q` quantile: 0.25 and 0.75 for an estimate's range),
    at least TAIL_FACTOR x elapsed (x q / (1 - q)) once past its kind's 1 - TAIL_SURVIVE quantile.
    Without a spread: estimate - elapsed, and past it, by what the estimate is (round 5): the
    job's own time limit (`is_limit`) is where the platform stops it, so a stop under way,
    LIMIT_STOP_S; a point guess (the profile's default runtime, a resumed job's history less its
    kept work) 0, the old rule (the tail rule for it, in four forms, made whole Philly's ETAs
    worse by 3.5-7 points: docs/simulator.md "Round 5"). An estimate <= 0 (its kind's runs all
    ended at once) of a job that has run: past every run of its kind, about as long again
    (elapsed), not 0, which would tell the jobs waiting for its GPUs "now" at every cycle for as
    long as it runs."""
    if estimate <= 0:
        return max(0.0, elapsed)
    if spread is None:
        return max(LIMIT_STOP_S if is_limit else 0.0, estimate - elapsed)
    found = _LOG_NORMAL.get((estimate, spread))
    if found is None:  # few distinct estimates, many running jobs and cycles: log and spread once
        if len(_LOG_NORMAL) >= _LOG_NORMAL_MAX:
            _LOG_NORMAL.clear()
        found = _LOG_NORMAL[(estimate, spread)] = (math.log(estimate), _sigma(spread))
    mu, sigma = found
    if elapsed <= 0:
        return estimate if q == 0.5 else math.exp(mu + sigma * _inv_cdf_at(q, 0.0, 1.0))
    # P(D > elapsed): NormalDist().cdf's own formula, without its method call (bit for bit the same)
    survive = 1.0 - 0.5 * (1.0 + math.erf(((math.log(elapsed) - mu) / sigma) / _SQRT2))
    if survive <= 1e-12:  # far past anything its kind ever ran: about as long again
        left = elapsed
    else:
        end = math.exp(mu + sigma * _inv_cdf_at(1.0 - survive * (1.0 - q), 0.0, 1.0))
        left = max(0.0, end - elapsed)
    if survive <= TAIL_SURVIVE:  # in its kind's far tail: at least a part of what it ran again
        return max(left, TAIL_FACTOR * elapsed * q / (1.0 - q))
    return left


class Timeline:
    """Free GPUs of one model over time: free[i] holds from times[i] until times[i + 1] (the last,
    i = size - 1, for ever). Arrays with room to grow, so that checking or taking a long stretch
    is one vector operation and a new breakpoint one move of the tail."""

    __slots__ = ("found_at", "free", "room", "size", "taken", "times")

    def __init__(
        self,
        now: float,
        free_now: int,
        returns: Sequence[tuple[float, int]],
        steps: tuple[list[float], list[int]] | None = None,
    ) -> None:
        """`returns`: (time, GPUs) sorted by time; or `steps`, the breakpoints' times and free
        GPUs from each on, as the loop below leaves them (`returns` then unread)."""
        if steps is None:
            times, free = [now], [free_now]
            for t, n in returns:  # sorted by time
                if t <= times[-1]:
                    free[-1] += n
                else:
                    times.append(t)
                    free.append(free[-1] + n)
        else:
            times, free = steps
        self.size = len(times)
        room = 2 * self.size + 64
        self.times = np.empty(room, dtype=np.float64)
        self.free = np.empty(room, dtype=np.int64)
        self.times[: self.size] = times
        self.free[: self.size] = free
        self.room = np.zeros(room, dtype=np.bool_)  # _all_runs' scratch: free >= need
        self.found_at = 0  # the index of the breakpoint _first_run's last answer begins at
        self.taken = (0, 0)  # the breakpoint indices [i, j) of the stretch the last take held

    def earliest(
        self, need: int, runtime: float, not_before: float, before: float = math.inf
    ) -> float | None:
        """The first time, not before `not_before`, from which `need` GPUs stay free for
        `runtime` s; None: never, or not before `before` (a start another model already offers:
        a later one is of no use, and the search stops as soon as it knows). Reads only:
        `not_before` gets no breakpoint of its own (a strict-FIFO roll checks every job against
        several models, and a breakpoint there would cost a move of the tail each time); `take`
        makes the one the job holds."""
        k = self.size
        times, free = self.times, self.free
        if not_before > times[0]:  # the stretch holding not_before starts there
            i = int(times[:k].searchsorted(not_before, "right")) - 1
            start = not_before
        else:
            i = 0
            start = float(times[0])
        if start >= before and before < math.inf:
            return None
        if free[i] >= need:  # the common case: room at once, for long enough?
            j = int(times[:k].searchsorted(start + runtime, "left"))  # the stretch: [i, j)
            if j - i <= 1 or _min(free[i:j]) >= need:
                return start
        i += 1  # not at `start`: later, at a breakpoint
        return self._first_run(i, need, runtime, before) if i < k else None

    def _first_run(self, i: int, need: int, runtime: float, before: float = math.inf) -> float | None:
        """The first breakpoint from index `i` on from which `need` GPUs stay free for `runtime`
        s. Only where a run of room begins can the first such start be (one step earlier in a run
        would fit too), and a run that begins at time t fits iff it lasts until t + runtime.
        Usually the first run fits (in a deep queue, the room that opens as running work ends and
        then stays): the first few are checked one by one, from a list of the free GPUs or (a long
        timeline) from one vector comparison, then all the others in one vector pass."""
        k = self.size
        if self.times[i] >= before:
            return None
        if k - i <= LIST_SCAN_MAX:
            found, at = self._runs_in_list(i, need, runtime, before)
        else:
            found, at = self._runs_in_bytes(i, need, runtime, before)
        if at < 0:  # decided by the first runs
            return found
        found = self._all_runs(i + at, need, runtime)
        return found if found is not None and found < before else None

    def _runs_in_list(self, i: int, need: int, runtime: float, before: float) -> tuple[float | None, int]:
        """`_first_run`'s first FIRST_RUNS runs of room from index `i`, read from a list of the
        free GPUs (a short timeline, a deep roll's many searches: a compiled loop over a few dozen
        items costs less than one vector call). Returns (the answer, -1) when they decide it, else
        (None, the offset from `i` where the search goes on)."""
        times = self.times
        free: list[int] = self.free[i : self.size].tolist()
        n = len(free)
        at = 0
        for _ in range(FIRST_RUNS):
            begin = at  # the next run of room: [begin, end)
            while begin < n and free[begin] < need:
                begin += 1
            if begin == n:
                return None, -1
            start = float(times[i + begin])
            if start >= before:
                return None, -1
            end = begin + 1
            while end < n and free[end] >= need:
                end += 1
            if end == n or times[i + end] >= start + runtime:  # (end == n: room from there on)
                self.found_at = i + begin
                return start, -1
            at = end  # no room there: the search goes on after it
        return None, at

    def _runs_in_bytes(self, i: int, need: int, runtime: float, before: float) -> tuple[float | None, int]:
        """`_runs_in_list` for a long timeline: which breakpoints have room as bytes (1: room), one
        vector comparison, then each run's begin and end one bytes.find."""
        times = self.times
        room = (self.free[i : self.size] >= need).tobytes()
        at = 0
        for _ in range(FIRST_RUNS):
            begin = room.find(b"\x01", at)  # the next run of room: [begin, end)
            if begin < 0:
                return None, -1
            start = float(times[i + begin])
            if start >= before:
                return None, -1
            end = room.find(b"\x00", begin)  # -1: room from there on
            if end < 0 or times[i + end] >= start + runtime:
                self.found_at = i + begin
                return start, -1
            at = end  # no room there: the search goes on after it
        return None, at

    def _all_runs(self, i: int, need: int, runtime: float) -> float | None:
        """`_first_run` over all runs of room from index `i` at once: one vector pass instead of
        a hop per shortfall."""
        k = self.size
        n = k - i
        room = self.room
        if len(room) < n + 2:
            room = self.room = np.zeros(2 * n + 64, dtype=np.bool_)
        np.greater_equal(self.free[i:k], need, out=room[1 : n + 1])
        room[0] = room[n + 1] = False  # (the edges: no room before or after)
        edges = (room[1 : n + 2] != room[: n + 1]).nonzero()[0]  # runs of room: [edges[0], edges[1]), ...
        if not len(edges):
            return None
        begins, ends = edges[0::2] + i, edges[1::2] + i
        times = self.times
        begin_t = times[begins]
        end_t = times[np.minimum(ends, k - 1)]
        if ends[-1] == k:  # the last run lasts for ever
            end_t[-1] = math.inf
        fits = end_t >= begin_t + runtime
        first = int(fits.argmax())
        if not fits[first]:
            return None
        self.found_at = int(begins[first])
        return float(begin_t[first])

    def split(self, t: float) -> int:
        """The index of a breakpoint at `t` (> times[0]), made if there is none."""
        return self._split_at(int(self.times[: self.size].searchsorted(t, "left")), t)

    def _split_at(self, j: int, t: float) -> int:
        """`split(t)`, `j` being where `t` goes in the times (searchsorted, "left")."""
        k = self.size
        times = self.times
        if j < k and times[j] == t:
            return j
        if k == len(times):  # full: double the room
            self.times = times = np.concatenate([times, np.empty(k, dtype=np.float64)])
            self.free = np.concatenate([self.free, np.empty(k, dtype=np.int64)])
        free = self.free
        if j < k:  # (numpy copies overlapping slices as if through a temporary)
            times[j + 1 : k + 1] = times[j:k]
            free[j + 1 : k + 1] = free[j:k]
        times[j] = t
        free[j] = free[j - 1]
        self.size = k + 1
        return j

    def take(self, start: float, need: int, runtime: float) -> None:
        """Hold `need` GPUs from `start` (from `earliest`) for `runtime` s."""
        i = self.split(start) if start > self.times[0] else 0
        j = self.split(start + runtime)
        self.free[i:j] -= need
        self.taken = (i, j)

    def hold_earliest(self, need: int, runtime: float, not_before: float) -> float | None:
        """`earliest(need, runtime, not_before)`, then `take` there: the same answer and the same
        timeline after, with the searches `take` would repeat left out (the roll's usual step:
        one model, the floor at the first breakpoint)."""
        times = self.times
        if not_before > times[0]:  # (a strict-FIFO roll's raised floor)
            at = self.earliest(need, runtime, not_before)
            if at is not None:
                self.take(at, need, runtime)
            return at
        k = self.size
        start = float(times[0])
        end = start + runtime
        if self.free[0] >= need:  # earliest's common case, at i = 0
            j = int(times[:k].searchsorted(end, "left"))  # also where take's split(end) looks
            if j <= 1 or _min(self.free[:j]) >= need:
                j = self._split_at(j, end)
                self.free[:j] -= need  # take at times[0]: from index 0
                self.taken = (0, j)
                return start
        if k < 2:
            return None
        at = self._first_run(1, need, runtime)
        if at is not None:  # a breakpoint's time: take's split(at) finds `found_at`
            i = self.found_at
            j = self.split(at + runtime)  # after i: i stays where it is
            self.free[i:j] -= need
            self.taken = (i, j)
        return at

    def in_last_run(self, need: int) -> bool:
        """Right after a take of `need` GPUs (nothing changed since): whether the stretch it held
        begins the last run of room for `need`, i.e. `need` GPUs stay free from the stretch's end
        on for ever (the stretch itself had room for the job before the take)."""
        j = self.taken[1]
        return j >= self.size or int(_min(self.free[j : self.size])) >= need

    def room_again(self, need: int) -> tuple[int, int, int]:
        """Right after a job of `need` GPUs took its stretch (`take` or `hold_earliest`, nothing
        changed since): the stretch's breakpoint indices [i, j) and how many more jobs of the
        same need and runtime it still has room for. Each of those, searched on its own, would
        start where that job did: no earlier time had room for it, and the timeline has only lost
        room since. `free[i:j] -= n * need` holds it for n of them."""
        i, j = self.taken
        return i, j, int(_min(self.free[i:j])) // need


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
    roll = BackfillRoll(now, free_by_model, capacity_by_model, events, default_runtime_s, in_order)
    return roll.place(waiting)


class BackfillRoll:
    """`backfill_starts` as an object that can be continued: `place` puts waiting jobs on the
    timelines after those an earlier `place` put there, as if both lists had been one (the
    estimated-start roll kept across cycles, diagnosis.py's `KeptRoll`). A model's timeline is
    built the first time a job that may use it is placed."""

    __slots__ = (
        "capacity",
        "choices",
        "default_runtime_s",
        "events",
        "floor",
        "free_by_model",
        "in_order",
        "lines",
        "now",
    )

    def __init__(
        self,
        now: float,
        free_by_model: Mapping[str, int],
        capacity_by_model: Mapping[str, int],
        events: Sequence[Event],
        default_runtime_s: float,
        in_order: bool = False,
    ) -> None:
        self.now = now
        self.free_by_model = dict(free_by_model)
        self.capacity = capacity_by_model
        self.events = sorted(events, key=itemgetter(0))  # (stable: as backfill_starts sorted them)
        self.default_runtime_s = default_runtime_s
        self.in_order = in_order
        self.floor = now  # strict FIFO: no job before the last one placed
        self.lines: dict[str, Timeline] = {}
        # per model set (few sets, many jobs): its timelines with their capacity
        self.choices: dict[tuple[str, ...], list[tuple[int, Timeline]]] = {}

    def _add_lines(self, waiting: Sequence[Waiting]) -> None:
        """Timelines for the models `waiting` may use that have none yet (one pass over the
        returns for all of them)."""
        lines = self.lines
        wanted = {m for w in waiting if w[1] > 0 for m in w[2] if m not in lines}
        if not wanted:
            return
        # each model's breakpoints built as its returns come, in time order: no (time, GPUs) pair
        # per running job and model (a fresh roll's timelines: every running job's end)
        now, free_by_model = self.now, self.free_by_model
        steps = {m: ([now], [free_by_model.get(m, 0)]) for m in wanted}
        for end, per_model in self.events:
            for m, n in per_model.items():
                found = steps.get(m)
                if found is not None and n:  # (Timeline.__init__'s loop, inline)
                    times, free = found
                    if end <= times[-1]:
                        free[-1] += n
                    else:
                        times.append(end)
                        free.append(free[-1] + n)
        for m in wanted:
            lines[m] = Timeline(now, free_by_model.get(m, 0), (), steps[m])

    def place(self, waiting: Sequence[Waiting]) -> dict[str, float | None]:
        """The estimated starts of `waiting`, placed in order after every job placed before."""
        self._add_lines(waiting)
        lines, choices, capacity_by_model = self.lines, self.choices, self.capacity
        default_runtime_s, in_order = self.default_runtime_s, self.in_order
        out: dict[str, float | None] = {}
        floor = self.floor
        count = len(waiting)
        index = 0
        while index < count:
            job_id, need, models, runtime = waiting[index]
            index += 1
            if need <= 0:
                out[job_id] = floor
                continue
            options = choices.get(models)
            if options is None:
                options = choices[models] = [(capacity_by_model.get(m, 0), lines[m]) for m in models]
            hold = default_runtime_s if runtime is None else max(runtime, 1.0)
            if len(options) == 1:  # one model (most jobs, and every job of a one-model cluster)
                capacity, line = options[0]
                at = None if need > capacity else line.hold_earliest(need, hold, floor)
                out[job_id] = at
                if in_order and at is not None:
                    floor = at
                if index < count and _alike(waiting[index], need, models, runtime):
                    if at is not None and line.in_last_run(need):
                        index, last = _place_along_last_run(waiting, index, line, at, hold, out)
                        if in_order:
                            floor = last
                    else:
                        index = _place_alike(waiting, index, line, at, out)
                continue
            best_at: float | None = None
            best_line: Timeline | None = None
            for capacity, line in options:
                if need > capacity:
                    continue
                at = line.earliest(need, hold, floor, math.inf if best_at is None else best_at)
                if at is not None and (best_at is None or at < best_at):
                    best_at, best_line = at, line
                    if at <= floor:  # no model can offer an earlier start: skip the others' searches
                        break
            if best_line is not None:
                assert best_at is not None
                best_line.take(best_at, need, hold)
                if in_order:
                    floor = best_at
            out[job_id] = best_at  # None: no single model ever holds it, cannot tell
            if index < count and _alike(waiting[index], need, models, runtime):
                # (the other models' timelines are as they were, and none offered best_at or earlier
                # before best_line in the order: the same model wins while it has room at best_at)
                index = _place_alike(waiting, index, best_line, best_at, out)
        self.floor = floor
        return out


def _place_alike(
    waiting: Sequence[Waiting],
    index: int,
    line: Timeline | None,
    at: float | None,
    out: dict[str, float | None],
) -> int:
    """The jobs from `index` on that ask for what the job just placed did (`_alike`; most of a
    deep roll: a user's runs of one kind): while the stretch it took on `line` at `at` has room,
    each starts there too (`Timeline.room_again`); when it got no time (`at` None), nothing
    changed and none of them gets one. What searching each on its own gives, without the
    searches. Returns the index of the first job not placed."""
    _, need, models, runtime = waiting[index - 1]
    count = len(waiting)
    if at is None or line is None:
        most, i, j = count, 0, 0
    else:
        i, j, most = line.room_again(need)
    same = index
    while same < count and same - index < most and _alike(waiting[same], need, models, runtime):
        out[waiting[same][0]] = at
        same += 1
    if line is not None and same > index and at is not None:
        line.free[i:j] -= (same - index) * need
    return same


def _place_along_last_run(
    waiting: Sequence[Waiting],
    index: int,
    line: Timeline,
    at: float,
    hold: float,
    out: dict[str, float | None],
) -> tuple[int, float]:
    """`_place_alike` and the searches after it, for a run of alike jobs whose first took its
    stretch at the start of the last run of room (`Timeline.in_last_run`: room for it from there
    on). While the stretch has room, jobs start where the first did; once it is full, the next
    start is the breakpoint after the stretch's last one short of room: every earlier start
    would overlap that one (no earlier time had room for the first, and the timeline has only
    lost room since), and from there on there is room until the stretch ends and, past its end,
    the last run's room, untouched. The job holds that stretch, again at the start of the last
    run of room, and so on: what searching each job on its own gives, without the searches.
    Returns the index of the first job not placed and the last start given."""
    _, need, models, runtime = waiting[index - 1]
    count = len(waiting)
    i, j = line.taken
    stretch = line.free[i:j]  # a view: every step below reads and holds through it (one slice)
    while True:
        most = int(_min(stretch)) // need
        same = index
        while same < count and same - index < most and _alike(waiting[same], need, models, runtime):
            out[waiting[same][0]] = at
            same += 1
        if same > index:
            stretch -= (same - index) * need
        index = same
        if index >= count or not _alike(waiting[index], need, models, runtime):
            return index, at
        # the stretch is full: past its last short breakpoint (bytes.rfind: one call, no index array)
        i += (stretch < need).tobytes().rfind(b"\x01") + 1
        at = float(line.times[i])  # (i <= j: a breakpoint, the stretch's end at the latest)
        j = line.split(at + hold)  # (may move the arrays: the view is taken after it)
        # room for the next job at least: the loop's next turn places it there together with the
        # others that fit (one subtraction for all of them)
        stretch = line.free[i:j]
        line.taken = (i, j)


def _alike(w: Waiting, need: int, models: tuple[str, ...], runtime: float | None) -> bool:
    """The waiting job `w` asks for what (need, models, runtime) does: the roll places it alike."""
    return w[1] == need and w[3] == runtime and (w[2] is models or w[2] == models)


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
    append = out.append
    for rj, per_model in running:
        job = rj.job
        if gone_by:
            gone = gone_by.get(job.id)
            if gone is not None:
                append((max(now, gone), per_model))
                continue
        estimate = job.runtime_estimate
        if estimate is None:  # assumed, without a spread: remaining_s's old rule
            append((now + max(0.0, default_runtime_s - (now - rj.start_time)), per_model))
        else:
            left = remaining_s(estimate, job.runtime_spread, now - rj.start_time, q, job.runtime_is_limit)
            append((now + left, per_model))
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
