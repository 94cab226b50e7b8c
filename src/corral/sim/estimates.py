"""Runtime estimates from what a live platform knows, never the trace's true durations.

The same chain as the live platform (`corral.scheduler.runtimes`): the user's runs of the same job
name, else the user's jobs of the same size (GPUs), else the group's, else the cluster's, from the
jobs that have finished so far in the replay; capped by the job's own `max_runtime`; else
`max_runtime`; else unknown (the profile's `default_runtime_s`). Each estimate carries the 25th and
75th percentiles of the runs it rests on.

`legacy=True` keeps the estimate of the previous round (the median of the last runs of the same
user and name, or of the same group, user and GPUs; no broader fallback, no spread): the baseline
the ETA error is compared with.
"""

from __future__ import annotations

import statistics
from collections import deque

from corral.scheduler.runtimes import RunHistory, RuntimeEstimate, estimate_from
from corral.sim.trace import TraceJob

LEGACY_RUNS = 10  # the previous round's window


class RuntimeHistory:
    def __init__(self, legacy: bool = False) -> None:
        self.legacy = legacy
        self._chain = RunHistory()
        self._runs: dict[tuple[object, ...], deque[float]] = {}
        self._median: dict[tuple[object, ...], float] = {}

    @staticmethod
    def _legacy_key(job: TraceJob) -> tuple[object, ...]:
        if job.name:
            return ("name", job.user, job.name)
        return ("shape", job.group, job.user, job.num_gpus)

    def record(self, job: TraceJob, ran_s: float) -> None:
        """A finished job ran `ran_s` seconds of work."""
        if not self.legacy:
            self._chain.record(job.user, job.name, job.num_gpus, job.group, ran_s)
            return
        k = self._legacy_key(job)
        runs = self._runs.get(k)
        if runs is None:
            runs = self._runs[k] = deque(maxlen=LEGACY_RUNS)
        runs.append(ran_s)
        self._median[k] = statistics.median(runs)

    def estimate(self, job: TraceJob) -> RuntimeEstimate | None:
        limit = job.max_runtime_s
        if not self.legacy:
            return self._chain.estimate(job.user, job.name, job.num_gpus, job.group, limit)
        typical = self._median.get(self._legacy_key(job))
        if typical is None:
            return estimate_from([], limit)
        value = min(typical, limit) if limit is not None else typical
        return RuntimeEstimate(value, value, value, "name", 0)
