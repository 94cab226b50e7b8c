"""Runtime estimates from history, one chain for the live platform and the simulator.

A job's runtime is guessed from the finished runs most like it, the first level with enough runs:

1. the same user's runs of a job with the same name (people resubmit the same training);
2. the same user's jobs of the same size (GPUs): traces without names (Philly) and new names;
3. the group's jobs;
4. the whole cluster's jobs;

capped by the job's own `max_runtime` (a limit the platform enforces); with no history at all,
`max_runtime` itself; else unknown (the scheduler then assumes `Profile.default_runtime_s`).

Every estimate carries its spread: the 25th and 75th percentiles of the runs it came from (a
broad level spreads widely, which is the honest uncertainty of "we know little about this job").
The live service reads the runs from the database (`corral.services.jobs.runtime_estimate`), the
simulator keeps them in memory (`RunHistory`); both end in `estimate_from`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

LEVELS = ("name", "user_size", "group", "cluster")
# Runs a level needs before it is trusted (a job's own earlier run is the best guess there is;
# a broad level needs a few runs before its percentiles mean anything).
MIN_RUNS = {"name": 1, "user_size": 2, "group": 3, "cluster": 3}
# Recent runs kept per level: the narrow levels follow a user's latest habits, the broad ones
# need more runs for stable percentiles.
KEEP_RUNS = {"name": 10, "user_size": 20, "group": 50, "cluster": 100}


@dataclass(frozen=True, slots=True)
class RuntimeEstimate:
    seconds: float  # the point estimate: the median of the runs (capped by the limit)
    low_s: float  # 25th percentile of the runs (capped)
    high_s: float  # 75th percentile of the runs (capped)
    basis: str  # which level it came from: one of LEVELS, or "limit" (the user's max_runtime)
    runs: int  # how many runs it rests on (0 for "limit")

    def __init__(  # written out, as in types.py (one per queued job)
        self, seconds: float, low_s: float, high_s: float, basis: str, runs: int
    ) -> None:
        object.__setattr__(self, "seconds", seconds)
        object.__setattr__(self, "low_s", low_s)
        object.__setattr__(self, "high_s", high_s)
        object.__setattr__(self, "basis", basis)
        object.__setattr__(self, "runs", runs)

    def describe(self) -> str:
        """ "median of 12 runs of the group's jobs" and the like, for the user."""
        if self.basis == "limit":
            return "the job's max_runtime (no history yet)"
        what = {
            "name": "runs of this job name by its user",
            "user_size": "runs of its user's jobs of this size",
            "group": "runs of its group's jobs",
            "cluster": "runs of the cluster's jobs",
        }[self.basis]
        return f"median of {self.runs} {what}"


def quartiles(runs: Sequence[float]) -> tuple[float, float, float]:
    """(p25, p50, p75) of `runs` (non-empty), by linear interpolation between the sorted runs."""
    ordered = sorted(runs)
    last = len(ordered) - 1

    def at(q: float) -> float:
        pos = q * last
        lo = int(pos)
        hi = min(lo + 1, last)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return at(0.25), at(0.5), at(0.75)


def estimate_from(
    levels: Sequence[tuple[str, Sequence[float]]], limit: float | None
) -> RuntimeEstimate | None:
    """The estimate from the first level (name, user_size, group, cluster: in that order, any
    may be left out) with enough runs, capped by `limit`; else `limit`; else None."""
    for basis, runs in levels:
        if len(runs) >= MIN_RUNS[basis]:
            low, mid, high = quartiles(runs)
            if limit is not None:
                low, mid, high = min(low, limit), min(mid, limit), min(high, limit)
            return RuntimeEstimate(mid, low, high, basis, len(runs))
    if limit is not None:
        return RuntimeEstimate(limit, limit, limit, "limit", 0)
    return None


class RunHistory:
    """Finished runs kept in memory per level (the simulator's history; the live platform reads
    the same levels from its database). Keys: (user, name), (user, GPUs), group, and one cluster."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, Hashable], deque[float]] = {}

    @staticmethod
    def keys(user: str, name: str, gpus: int, group: str) -> list[tuple[str, Hashable]]:
        out: list[tuple[str, Hashable]] = [("name", (user, name))] if name else []
        return [*out, ("user_size", (user, gpus)), ("group", group), ("cluster", None)]

    def record(self, user: str, name: str, gpus: int, group: str, ran_s: float) -> None:
        """A job finished after running `ran_s` seconds of work."""
        for key in self.keys(user, name, gpus, group):
            runs = self._runs.get(key)
            if runs is None:
                runs = self._runs[key] = deque(maxlen=KEEP_RUNS[key[0]])
            runs.append(ran_s)

    def estimate(
        self, user: str, name: str, gpus: int, group: str, limit: float | None
    ) -> RuntimeEstimate | None:
        empty: deque[float] = deque()
        levels = [(key[0], self._runs.get(key, empty)) for key in self.keys(user, name, gpus, group)]
        return estimate_from(levels, limit)
